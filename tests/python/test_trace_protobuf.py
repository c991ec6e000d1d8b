"""The Perfetto protobuf trace (`--trace x.pftrace`, sim/trace.h PerfettoTraceWriter): decoded here with
a minimal protobuf reader, it holds the same tracks, slices, arguments, flow arrows and counters as the
JSON trace of the same run, in far fewer bytes."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import zlib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fields(buf):
    """(field, wire type, value) of a protobuf message: ints for varint/fixed64, bytes for length-delimited."""
    i, out = 0, []
    while i < len(buf):
        key, i = _varint(buf, i)
        f, w = key >> 3, key & 7
        if w == 0:
            v, i = _varint(buf, i)
        elif w == 1:
            v = struct.unpack_from("<Q", buf, i)[0]
            i += 8
        elif w == 2:
            n, i = _varint(buf, i)
            v = buf[i:i + n]
            i += n
        else:
            raise AssertionError("unexpected wire type {}".format(w))
        out.append((f, w, v))
    return out


def _varint(buf, i):
    v = s = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << s
        s += 7
        if not b & 0x80:
            return v, i


def _signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def _packets(data, chunks):
    """The packets of a Trace as {field: [values]}, those in `compressed_packets` (50, a zlib stream of
    packets) unpacked in place; `chunks` gets the size of each compressed packet's stream."""
    for f, w, pkt in _fields(data):
        assert (f, w) == (1, 2), "a Trace holds only packets"
        p = {}
        for pf, _, v in _fields(pkt):
            p.setdefault(pf, []).append(v)
        if 50 in p:
            assert list(p) == [50]
            for z in p[50]:
                chunks.append(len(z))
                yield from _packets(zlib.decompress(z), chunks)
        else:
            yield p


class _Sequence:
    """A packet sequence's incremental state: interned strings, the default clock, clocks' values."""

    def __init__(self):
        self.names, self.arg_names, self.strings = {}, {}, {}
        self.default_clock = 0
        self.clocks = {}  # clock id -> [offset to trace time (ns), last value (ns), incremental, ns per unit]


def _time(seq, p):
    """A packet's absolute timestamp on the trace clock (BOOTTIME, 6), in ns."""
    clock = p[58][0] if 58 in p else seq.default_clock
    ts = p[8][0]
    if clock in (0, 6):
        return ts
    offset, last, incremental, unit = seq.clocks[clock]
    ts *= unit
    if incremental:
        ts += last
        seq.clocks[clock][1] = ts
    return ts + offset


def decode(path):
    """The trace as {tracks: {uuid: name}, slices: [...], counters: [...], instants: [...]}."""
    tracks, seqs, events, chunks = {}, {}, [], []
    open_slices, slices, counters, instants = {}, [], [], []
    for p in _packets(open(path, "rb").read(), chunks):
        seq_id = p[10][0]
        if seq_id not in seqs or p.get(13, [0])[0] & 1:  # incremental state cleared
            seqs[seq_id] = _Sequence()
        seq = seqs[seq_id]
        for d in p.get(59, []):  # trace_packet_defaults
            seq.default_clock = {a: b for a, _, b in _fields(d)}.get(58, 0)
        for it in p.get(12, []):  # interned data
            for f2, _, v in _fields(it):
                kv = dict((a, b) for a, _, b in _fields(v))
                table = {2: seq.names, 3: seq.arg_names, 29: seq.strings}[f2]
                table[kv[1]] = kv[2].decode()
        for cs in p.get(6, []):  # a clock snapshot: its clocks' values at one instant
            clocks = [{a: b for a, _, b in _fields(c)} for _, _, c in _fields(cs)]
            trace_time = [c[2] * c.get(4, 1) for c in clocks if c[1] == 6][0]
            for c in clocks:
                if c[1] != 6:
                    unit = c.get(4, 1)  # unit_multiplier_ns
                    seq.clocks[c[1]] = [trace_time - c[2] * unit, c[2] * unit, bool(c.get(3)), unit]
            assert 11 not in p and 8 not in p
        for td in p.get(60, []):
            d = {a: b for a, _, b in _fields(td)}
            name = d.get(2, b"").decode()
            if 4 in d:
                name = {a: b for a, _, b in _fields(d[4])}[5].decode()
            if 3 in d:
                name = {a: b for a, _, b in _fields(d[3])}[6].decode()
            tracks[d[1]] = name
        for te in p.get(11, []):
            ev = {}
            for a, _, b in _fields(te):
                ev.setdefault(a, []).append(b)
            events.append((_time(seq, p), len(events), seq, ev))
    # as trace_processor does: events in time order (ties in file order), a stack of open slices per track
    for ts, _, seq, ev in sorted(events, key=lambda e: e[:2]):
        typ, track = ev[9][0], ev[11][0]
        if typ == 1:
            args = {}
            for ann in ev.get(4, []):
                d = {a: b for a, _, b in _fields(ann)}
                key = seq.arg_names[d[1]]
                args[key] = (_signed(d[4]) if 4 in d else struct.unpack("<d", struct.pack("<Q", d[5]))[0]
                             if 5 in d else seq.strings[d[17]])
            open_slices.setdefault(track, []).append(
                {"track": tracks[track], "name": seq.names[ev[10][0]], "ts": ts, "args": args,
                 "flow_in": ev.get(48, []), "uuid": track})
        elif typ == 2:
            s = open_slices[track].pop()
            s["dur"] = ts - s["ts"]
            slices.append(s)
        elif typ == 3:
            instants.append({"track": tracks[track], "ts": ts, "flow_out": ev.get(47, []), "uuid": track,
                             "name": seq.names[ev[10][0]] if 10 in ev else ev[23][0].decode()})
        elif typ == 4:
            counters.append((tracks[track], ts, struct.unpack("<d", struct.pack("<Q", ev[44][0]))[0]))
    assert all(not v for v in open_slices.values()), "every begun slice ends"
    return {"tracks": tracks, "slices": slices, "counters": counters, "instants": instants, "chunks": chunks}


def _run(nsim_bin, kernel, trace, *extra):
    r = subprocess.run([nsim_bin, "run", os.path.join(ROOT, kernel), "--timing-only", "-q", "--trace", str(trace),
                        "--stats", str(trace) + ".stats.json"] + list(extra), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.load(open(str(trace) + ".stats.json"))


def _instructions(stats):
    return stats["instructions"]


def _check_against_json(pb, ev, by_index=True):
    """The decoded protobuf trace `pb` holds the JSON trace's (events `ev`) slices, arguments, flow arrows
    and counter samples. by_index=False (several cores: instruction indices and flow ids repeat): the
    slices, counters and number of arrows only."""
    tids = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "thread_name"}
    js = sorted((tids[e["tid"]], e["name"], round(e["ts"] * 1e3), round((e["ts"] + e["dur"]) * 1e3))
                for e in ev if e.get("ph") == "X")
    ps = sorted((s["track"], s["name"], s["ts"], s["ts"] + s["dur"]) for s in pb["slices"])
    # the same slices on the same tracks (a slice on a lane: under its track's name); times rounded to
    # Perfetto's ns (JSON keeps ps), each end rounded on its own: within 1 ns
    assert len(ps) == len(js) and [x[:2] for x in ps] == [x[:2] for x in js]
    assert all(abs(a[2] - b[2]) <= 1 and abs(a[3] - b[3]) <= 1 for a, b in zip(ps, js))
    assert set(pb["tracks"].values()) >= set(tids.values())
    jc = sorted((e["name"], round(e["ts"] * 1e3), e["args"]["bytes"]) for e in ev if e.get("ph") == "C")
    assert sorted((n, t, v) for n, t, v in pb["counters"]) == [(n, t, float(v)) for n, t, v in jc]
    if not by_index:
        assert sum(len(x["flow_out"]) for x in pb["instants"]) == sum(1 for e in ev if e.get("ph") == "s")
        return
    # arguments: all but the disassembly (left out: unique per instruction) and the opcode (the name)
    jx = {(tids[e["tid"]], e["args"].get("index")): e["args"] for e in ev if e.get("ph") == "X" and "index" in e["args"]}
    for s in pb["slices"]:
        if "index" in s["args"]:
            ja = jx[(s["track"], s["args"]["index"])]
            assert ja["opcode"] == s["name"] and set(s["args"]) == set(ja) - {"instr", "opcode"}
            for k, v in s["args"].items():
                assert v == pytest.approx(ja[k]) if isinstance(v, float) else v == ja[k], k
    # the DMA pieces' and queues' slices: all their arguments
    jd = sorted((tids[e["tid"]], round(e["ts"] * 1e3), sorted(e["args"].items()))
                for e in ev if e.get("ph") == "X" and "index" not in e["args"])
    pd = sorted((s["track"], s["ts"], sorted(s["args"].items())) for s in pb["slices"] if "index" not in s["args"])
    assert len(jd) == len(pd)
    for (jt, jts, ja), (pt, pts, pa) in zip(jd, pd):
        assert jt == pt and abs(jts - pts) <= 1 and [k for k, _ in ja] == [k for k, _ in pa]
        assert all(v == pytest.approx(w) for (_, v), (_, w) in zip(ja, pa))
    # flow arrows: from an instant at the producer slice's start, on that slice's lane, to the waiter
    starts = {e["id"]: (tids[e["tid"]], round(e["ts"] * 1e3)) for e in ev if e.get("ph") == "s"}
    ends = {e["id"]: (tids[e["tid"]], round(e["ts"] * 1e3)) for e in ev if e.get("ph") == "f"}
    begun = {(s["uuid"], s["ts"]) for s in pb["slices"]}
    outs = {i: x for x in pb["instants"] for i in x["flow_out"]}
    ins = {i: s for s in pb["slices"] for i in s["flow_in"]}
    assert sorted(outs) == sorted(ins) == sorted(starts)
    for i, x in outs.items():
        assert x["track"] == starts[i][0] and abs(x["ts"] - starts[i][1]) <= 1
        assert (x["uuid"], x["ts"]) in begun, "the arrow starts where a slice of its lane starts"
        assert ins[i]["track"] == ends[i][0] and abs(ins[i]["ts"] - ends[i][1]) <= 1


KERNELS = ["examples/flash_attention.json", "examples/softmax_2x128x512.json", "examples/softmax_4x256x1024.json"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_protobuf_trace_holds_the_json_traces_slices(tmp_path, nsim_bin, kernel):
    _run(nsim_bin, kernel, tmp_path / "t.json")
    stats = _run(nsim_bin, kernel, tmp_path / "t.pftrace")
    pb = decode(tmp_path / "t.pftrace")
    _check_against_json(pb, json.load(open(tmp_path / "t.json"))["traceEvents"])
    # size: packets compressed (zlib), timestamps of 1-2 bytes, names and strings interned: <= 100 B per
    # instruction on flash_attention and softmax_4x256x1024 (issue 12; measured 51 and 78:
    # docs/profiling.md); softmax_2x128x512 has 14 instructions, too few to pay for the ~1.4 KB that
    # even a 7-instruction trace takes (track descriptors, Huffman tables). All under 10% of the JSON.
    size = os.path.getsize(tmp_path / "t.pftrace")
    if kernel != "examples/softmax_2x128x512.json":
        assert size <= 100 * _instructions(stats), (size, _instructions(stats))
    assert size < 0.1 * os.path.getsize(tmp_path / "t.json")


@pytest.mark.parametrize("extra", [["--trace-limit", "100"], ["--trace-window", "5000:20000"]])
def test_a_filtered_protobuf_trace_holds_the_filtered_json_traces_slices(tmp_path, nsim_bin, extra):
    _run(nsim_bin, "examples/flash_attention.json", tmp_path / "t.json", *extra)
    _run(nsim_bin, "examples/flash_attention.json", tmp_path / "t.pftrace", *extra)
    _check_against_json(decode(tmp_path / "t.pftrace"), json.load(open(tmp_path / "t.json"))["traceEvents"])


def test_protobuf_trace_with_a_limit_says_what_was_dropped(tmp_path, nsim_bin):
    _run(nsim_bin, "examples/flash_attention.json", tmp_path / "t.pftrace", "--trace-limit", "100")
    pb = decode(tmp_path / "t.pftrace")
    assert len(pb["slices"]) == 100
    marks = [i for i in pb["instants"] if i["name"].startswith("partial trace")]
    assert len(marks) == 1


def test_protobuf_trace_of_an_lnc2_launch_has_one_process_per_core(tmp_path):
    from nsim.kernels import flash_attention_lnc2, flash_attention_mh_inputs

    path = tmp_path / "lnc.pftrace"
    _, prof = flash_attention_lnc2.options(timing_only=True, trace=str(path))[2].simulate(*flash_attention_mh_inputs(0))
    pb = decode(path)  # the two cores' files, concatenated: two packet sequences, disjoint track uuids
    procs = sorted(v for v in pb["tracks"].values() if v.startswith("NeuronCore"))
    assert procs == ["NeuronCore 0 (trn2, LNC=2)", "NeuronCore 1 (trn2, LNC=2)"]
    assert len(pb["slices"]) > 0 and not list(tmp_path.glob("*.tmp*"))
    # each sequence's incremental clock and interning decode on their own: the JSON trace's slices
    flash_attention_lnc2.options(timing_only=True, trace=str(tmp_path / "lnc.json"))[2].simulate(
        *flash_attention_mh_inputs(0))
    _check_against_json(pb, json.load(open(tmp_path / "lnc.json"))["traceEvents"], by_index=False)


def test_a_large_protobuf_trace_is_compressed_in_several_chunks(tmp_path):
    # flash attention at S=4096: ~500 KB of packets, compressed 256 KiB at a time
    from nsim.kernels import flash_attention, flash_attention_inputs

    for name in ("t.pftrace", "t.json"):
        flash_attention.options(timing_only=True, trace=str(tmp_path / name)).simulate(
            *flash_attention_inputs(0, s=4096))
    pb = decode(tmp_path / "t.pftrace")
    assert len(pb["chunks"]) >= 2
    _check_against_json(pb, json.load(open(tmp_path / "t.json"))["traceEvents"])

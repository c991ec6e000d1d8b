"""Compressed kernel.json (docs/kernel-json.md, "Compressed kernel.json"): gzip data read by nsim's own
inflater from the CLI and from Python; truncated or corrupt files give BadCompression (CLI exit 2)."""
from __future__ import annotations

import gzip
import json
import os
import random
import struct
import subprocess
import zlib

import pytest

import nsim
from nsim import _errors

from conftest import NSIM_BIN, REPO_ROOT

KERNEL = os.path.join(REPO_ROOT, "examples", "library", "matmul_blocked.json")
TEXT = open(KERNEL, "rb").read()
BAD = _errors.code("BadCompression")


def _member(data: bytes, level: int = 6, strategy: int = zlib.Z_DEFAULT_STRATEGY, flags: int = 0,
            extra: bytes = b"", name: bytes = b"", comment: bytes = b"") -> bytes:
    """One gzip member written field by field (RFC 1952), the DEFLATE data from zlib."""
    head = bytes([0x1F, 0x8B, 8, flags]) + struct.pack("<I", 0) + bytes([0, 3])
    if flags & 4:
        head += struct.pack("<H", len(extra)) + extra
    if flags & 8:
        head += name + b"\0"
    if flags & 16:
        head += comment + b"\0"
    if flags & 2:
        head += struct.pack("<H", zlib.crc32(head) & 0xFFFF)
    c = zlib.compressobj(level, zlib.DEFLATED, -15, 9, strategy)
    return head + c.compress(data) + c.flush() + struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF)


VARIANTS = {
    "gzip module": gzip.compress(TEXT),
    "stored blocks": _member(TEXT, level=0),
    "fixed Huffman": _member(TEXT, strategy=zlib.Z_FIXED),
    "best, every header field": _member(TEXT, level=9, flags=2 | 4 | 8 | 16, extra=b"xy", name=b"k.json",
                                        comment=b"c"),
    "three members": b"".join(_member(TEXT[i:j]) for i, j in ((0, 1000), (1000, 1001), (1001, len(TEXT)))),
    "run-length (huffman only)": _member(TEXT, strategy=zlib.Z_HUFFMAN_ONLY),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_round_trip_from_python(name, tmp_path):
    path = tmp_path / "k.json.gz"
    path.write_bytes(VARIANTS[name])
    h = nsim.load_kernel(str(path))
    assert h.to_json() == TEXT.decode()
    _, a = h.simulate(timing_only=True)
    _, b = nsim.simulate_json(KERNEL, timing_only=True)
    assert a.stats == b.stats
    # bytes work too, and the name does not matter: the magic number decides
    other = tmp_path / "kernel.dat"
    other.write_bytes(VARIANTS[name])
    assert nsim.load_kernel(VARIANTS[name]).to_json() == nsim.load_kernel(str(other)).to_json() == TEXT.decode()


def _codes(data: bytes):
    try:
        nsim.load_kernel(data)
    except nsim.NsimError as e:
        return e.code
    return "ok"


def test_truncated_and_corrupt_files_give_bad_compression():
    data = VARIANTS["best, every header field"]
    for n in list(range(2, 40)) + list(range(40, len(data), 97)) + [len(data) - 1]:
        assert _codes(data[:n]) == BAD, n
    rng = random.Random(5)
    seen = set()
    for _ in range(300):
        b = bytearray(data)
        i = rng.randrange(2, len(b))
        b[i] ^= 1 << rng.randrange(8)
        code = _codes(bytes(b))
        seen.add(code)
        # a flip in a field gzip does not check (mtime, OS, the file name) changes nothing
        assert code == BAD or (code == "ok" and 4 <= i < 10 + 4 + 2 + 7 + 2), (i, code)
    assert BAD in seen
    assert _codes(data + b"\0\0\0") == BAD  # trailing garbage
    assert _codes(b"\x1f\x8b") == BAD
    with pytest.raises(nsim.KernelError) as e:
        nsim.load_kernel(data[:100])
    assert "gzip" in str(e.value) and "<bytes>" in str(e.value)


def test_compressed_text_that_is_not_json_is_a_json_error():
    with pytest.raises(nsim.KernelError) as e:
        nsim.load_kernel(gzip.compress(b'{"nsim_kernel": 1, "body": ['))
    assert e.value.code == _errors.code("JsonSyntax")


@pytest.mark.skipif(not os.path.isfile(NSIM_BIN), reason="build/nsim not built")
def test_cli_reads_compressed_kernels_and_refuses_corrupt_ones(tmp_path):
    gz = tmp_path / "k.json.gz"
    gz.write_bytes(VARIANTS["gzip module"])
    outs = []
    for path in (KERNEL, gz):
        r = subprocess.run([NSIM_BIN, "run", str(path), "--timing-only", "--quiet", "--stats", str(tmp_path / "s.json")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        outs.append(json.loads((tmp_path / "s.json").read_text())["stats"])
    assert outs[0] == outs[1]
    r = subprocess.run([NSIM_BIN, "check", str(gz)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(VARIANTS["gzip module"][:-5])
    for cmd in ("run", "check", "disasm"):
        r = subprocess.run([NSIM_BIN, cmd, str(bad)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and BAD in r.stderr and "bad.json.gz" in r.stderr, (cmd, r.returncode, r.stderr)

"""Roofline and engine-utilisation plots for nsim profiles.

    import nsim, nsim.plot
    _, prof = nsim.simulate_json("examples/swiglu.json", timing_only=True, trace="/tmp/swiglu.trace.json")
    nsim.plot.roofline(prof, "swiglu_roofline.png")            # -> dict of numbers
    nsim.plot.utilisation("/tmp/swiglu.trace.json", "swiglu_utilisation.png")

Command line (runs the kernel timing-only with a temporary trace):

    python -m nsim.plot examples/swiglu.json [--config trn2] [--out DIR]

matplotlib is imported lazily (Agg backend, no display); the number-crunching parts
(`roofline_numbers`, `utilisation_numbers`) work without it.
"""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple, Union

from nsim import _isa

ENGINES = tuple(_isa.ENGINES)  # isa::Engine order (the trace's thread ids)

# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------

_SIZE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15,
         "ki": 1024.0, "mi": 1024.0 ** 2, "gi": 1024.0 ** 3, "ti": 1024.0 ** 4}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "ps": 1e-12}


def parse_bandwidth(text: Union[str, float, int]) -> float:
    """Parse a bandwidth such as "362.5GB/s", "23B/ns", "1.5 TiB/s" or a bare number (bytes/s)."""
    if isinstance(text, (int, float)):
        return float(text)
    s = str(text).strip().strip("'\"")
    m = re.fullmatch(r"([0-9.eE+-]+)\s*([kKmMgGtTpP]i?)?B(?:ytes?)?\s*/\s*(s|ms|us|ns|ps)", s)
    if not m:
        try:
            return float(s)
        except ValueError:
            raise ValueError("cannot parse bandwidth {!r}".format(text))
    value, prefix, unit = m.groups()
    return float(value) * _SIZE[(prefix or "").lower()] / _TIME[unit]


def _stat(stats: dict, dotted: str, default: float = 0.0) -> float:
    node: Any = stats
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    if isinstance(node, dict):
        node = node.get("value", default)
    try:
        return float(node)
    except (TypeError, ValueError):
        return default


def _plt():
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("nsim's plots need matplotlib: pip install 'nsim[plot]' (or pip install '.[plot]' in the "
                          "source tree, or pip install matplotlib)") from e

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _profile_name(profile) -> str:
    try:
        name = profile.name
    except Exception:
        name = ""
    return name or "kernel"


# ------------------------------------------------------------------------------------------------
# Roofline
# ------------------------------------------------------------------------------------------------


def memory_roof(config: str = "trn2", overrides: Any = None) -> float:
    """HBM bandwidth in bytes/s of a configuration (preset + overrides): min(hbm.bw, dma.engine_bw *
    dma.engines), the parameters read through ``_nsim`` (engines/params.def, in B/ns)."""
    c = _isa.config_values(config, overrides)
    return min(c["hbm.bw"], c["dma.engine_bw"] * c["dma.engines"]) * 1e9


def roofline_numbers(profile) -> Dict[str, Any]:
    """The roofline quantities of a Profile (no plotting)."""
    stats = profile.stats
    tensor_flops = _stat(stats, "flops.hardware")
    other_flops = sum(_stat(stats, "engine.{}.flops".format(e)) for e in ENGINES if e != "tensor")
    flops = tensor_flops + other_flops
    read_b = _stat(stats, "memory.hbm_read_bytes")
    write_b = _stat(stats, "memory.hbm_write_bytes")
    hbm_bytes = read_b + write_b
    time_ns = _stat(stats, "total_time")
    time_s = time_ns * 1e-9
    compute_roof = _stat(stats, "flops.tensor_peak_per_s")
    mx_flops = _stat(stats, "flops.mx")
    mx_peak = _stat(stats, "flops.tensor_peak_mx_per_s")
    if mx_flops > 0 and mx_peak > 0 and compute_roof > 0:
        # MX matmuls run at the MX peak (neuroncore.md C12, "MX x4" on trn3): the roof of this kernel's mix of
        # FLOPs is the rate at which both parts would finish together at their peaks
        compute_roof = flops / (mx_flops / mx_peak + (flops - mx_flops) / compute_roof)
    mem_roof = memory_roof(profile.config or "trn2", profile.overrides)
    intensity = flops / hbm_bytes if hbm_bytes > 0 else float("inf")
    achieved = flops / time_s if time_s > 0 else 0.0
    ridge = compute_roof / mem_roof if mem_roof > 0 else float("inf")
    attainable = min(compute_roof, mem_roof * intensity) if hbm_bytes > 0 else compute_roof
    regime = "compute" if intensity > ridge else "memory"  # which roof applies at this intensity
    applicable_roof = compute_roof if regime == "compute" else mem_roof * intensity
    achieved_fraction = achieved / applicable_roof if applicable_roof > 0 else 0.0
    bound = profile.bound  # the verdict nsim run and nsim analyze report (engines/bounds.h)
    return {
        "name": _profile_name(profile),
        "config": getattr(profile, "config", ""),
        "flops": flops,
        "tensor_flops": tensor_flops,
        "other_flops": other_flops,
        "hbm_read_bytes": read_b,
        "hbm_write_bytes": write_b,
        "hbm_bytes": hbm_bytes,
        "total_time_ns": time_ns,
        "intensity": intensity,            # FLOP / HBM byte
        "achieved_flops_per_s": achieved,
        "achieved_bytes_per_s": hbm_bytes / time_s if time_s > 0 else 0.0,
        "compute_roof": compute_roof,      # FLOP/s
        "memory_roof": mem_roof,           # bytes/s
        "ridge": ridge,                    # FLOP/byte
        "attainable_flops_per_s": attainable,
        "achieved_percent": 100.0 * achieved_fraction,
        "regime": regime,
        "bound": bound,
    }


def roofline(profile, path: Optional[Union[str, "os.PathLike[str]"]] = None,
             title: Optional[str] = None) -> Dict[str, Any]:
    """Compute the roofline numbers of `profile`; draw a log-log roofline PNG at `path` if given."""
    r = roofline_numbers(profile)
    if path is None:
        return r
    import math

    plt = _plt()
    P, B, ridge = r["compute_roof"], r["memory_roof"], r["ridge"]
    x_pt = r["intensity"] if math.isfinite(r["intensity"]) and r["intensity"] > 0 else ridge
    y_pt = max(r["achieved_flops_per_s"], 1.0)
    lo = min(x_pt, ridge, 1.0) / 10.0
    hi = max(x_pt, ridge) * 10.0
    n = 200
    xs = [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]
    ys = [min(P, B * x) for x in xs]

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    ax.loglog(xs, ys, color="black", lw=2, label="roofline")
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    ax.text(ridge, 0.02, " ridge {:.3g} FLOP/B".format(ridge), color="gray", fontsize=8, va="bottom",
            transform=ax.get_xaxis_transform())
    ax.text(xs[0] * 1.2, B * xs[0] * 3.0, "HBM {:.4g} GB/s".format(B / 1e9), rotation=0, fontsize=8)
    ax.text(hi / 1.2, P * 1.05, "TensorE peak {:.4g} TFLOP/s".format(P / 1e12), ha="right", va="bottom",
            fontsize=8)
    ax.plot([x_pt], [y_pt], "o", color="tab:red", ms=9, zorder=5,
            label="{}: {:.3g} FLOP/B, {:.3g} GFLOP/s\n{:.1f}% of roof, {}".format(
                r["name"], r["intensity"], r["achieved_flops_per_s"] / 1e9, r["achieved_percent"], r["bound"]))
    ax.legend(loc="upper left", fontsize=9)
    ax.set_xlabel("arithmetic intensity (FLOP / HBM byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_ylim(min(y_pt, B * lo) / 10.0, P * 4)
    ax.set_xlim(lo, hi)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title or "Roofline: {}{}".format(r["name"], " on " + r["config"] if r["config"] else ""))
    fig.tight_layout()
    fig.savefig(os.fspath(path))
    plt.close(fig)
    r["path"] = os.fspath(path)
    return r


# ------------------------------------------------------------------------------------------------
# Utilisation over time (from the Chrome trace)
# ------------------------------------------------------------------------------------------------


def _union(intervals: List[Tuple[float, float]]) -> List[Tuple[float, float]]:
    out: List[List[float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _bin_busy(intervals: List[Tuple[float, float]], t0: float, width: float, bins: int) -> List[float]:
    """Busy time of a (disjoint) interval list per bin."""
    busy = [0.0] * bins
    for s, e in intervals:
        i0 = max(0, min(bins - 1, int((s - t0) // width)))
        i1 = max(0, min(bins - 1, int((e - t0) // width)))
        for i in range(i0, i1 + 1):
            b0 = t0 + i * width
            ov = min(e, b0 + width) - max(s, b0)
            if ov > 0:
                busy[i] += ov
    return busy


def _load_trace(trace_path) -> List[dict]:
    with open(os.fspath(trace_path)) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else list(data)


def utilisation_numbers(trace_path, bins: int = 200, total_time_ns: Optional[float] = None) -> Dict[str, Any]:
    """Per-track busy fractions over `bins` time bins, plus per-track averages (no plotting).

    Tracks: the 5 compute engines and "dma" (mean over the DMA engine tracks dma.e*). Times in ns.
    """
    events = _load_trace(trace_path)
    names: Dict[Tuple[Any, Any], str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name", ""))
    per: Dict[str, List[Tuple[float, float]]] = {}
    end = 0.0
    for e in events:
        if e.get("ph") != "X":
            continue
        key = (e.get("pid"), e.get("tid"))
        name = names.get(key)
        if name is None:
            tid = e.get("tid")
            name = ENGINES[tid] if isinstance(tid, int) and 0 <= tid < len(ENGINES) else "tid{}".format(tid)
        s = float(e.get("ts", 0.0)) * 1e3
        d = float(e.get("dur", 0.0)) * 1e3
        per.setdefault(name, []).append((s, s + d))
        end = max(end, s + d)
    total = float(total_time_ns) if total_time_ns else end
    total = max(total, end, 1e-9)
    bins = max(1, int(bins))
    width = total / bins
    dma_names = sorted((n for n in set(per) | set(names.values()) if re.fullmatch(r"dma\.e\d+", n)),
                       key=lambda n: int(n.split("e")[-1]))
    series: Dict[str, List[float]] = {}
    average: Dict[str, float] = {}
    active: Dict[str, float] = {}
    for eng in ENGINES:
        u = _union(per.get(eng, []))
        active[eng] = sum(e - s for s, e in u)
        series[eng] = [b / width for b in _bin_busy(u, 0.0, width, bins)]
        average[eng] = active[eng] / total
    dma_series = [0.0] * bins
    dma_active = 0.0
    for n in dma_names:
        u = _union(per.get(n, []))
        a = sum(e - s for s, e in u)
        active[n] = a
        dma_active += a
        for i, b in enumerate(_bin_busy(u, 0.0, width, bins)):
            dma_series[i] += b / width
    nd = max(1, len(dma_names))
    series["dma"] = [v / nd for v in dma_series]
    average["dma"] = dma_active / nd / total
    return {
        "total_time_ns": total,
        "bins": bins,
        "bin_ns": width,
        "times_ns": [(i + 0.5) * width for i in range(bins)],
        "series": series,
        "average": average,
        "active_time_ns": active,
        "dma_engines": len(dma_names),
    }


def utilisation(profile_or_trace_path, path: Optional[Union[str, "os.PathLike[str]"]] = None, bins: int = 200,
                trace: Optional[Union[str, "os.PathLike[str]"]] = None, title: Optional[str] = None
                ) -> Dict[str, float]:
    """Engine utilisation over time from a trace file; saves a PNG at `path` if given.

    `profile_or_trace_path` is the trace path passed to simulate_json(trace=...), or a Profile together
    with `trace=` (the profile then supplies total_time and the kernel name).
    Returns {engine: average busy fraction 0..1} for tensor, vector, scalar, gpsimd, sync and "dma"
    (mean over DMA engines); averages equal stats engine.<e>.active_time / total_time.
    """
    profile = None
    if isinstance(profile_or_trace_path, (str, os.PathLike)):
        trace_path = profile_or_trace_path
    else:
        profile = profile_or_trace_path
        trace_path = trace
        if trace_path is None:
            raise ValueError("utilisation(profile, ...) needs trace= (the path given to simulate_json(trace=...))")
    total = _stat(profile.stats, "total_time") if profile is not None else None
    u = utilisation_numbers(trace_path, bins=bins, total_time_ns=total)
    if path is not None:
        _draw_utilisation(u, path, title or "Engine utilisation: {}".format(
            _profile_name(profile) if profile is not None else os.path.basename(os.fspath(trace_path))))
    return dict(u["average"])


def _draw_utilisation(u: Dict[str, Any], path, title: str) -> None:
    plt = _plt()
    tracks = list(ENGINES) + ["dma"]
    labels = [t if t != "dma" else "dma (avg of {})".format(u["dma_engines"]) for t in tracks]
    t_us = [t / 1e3 for t in u["times_ns"]]
    total_us = u["total_time_ns"] / 1e3
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), dpi=110, sharex=True, layout="constrained",
                                   gridspec_kw={"height_ratios": [1.2, 1]})
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:gray", "tab:red"]
    # stacked busy fractions: the top edge is the number of busy tracks at that time
    ax1.stackplot(t_us, *[u["series"][t] for t in tracks], colors=colors, step="mid", alpha=0.85,
                  labels=["{} (avg {:.1f}%)".format(lab, 100 * u["average"][t]) for t, lab in zip(tracks, labels)])
    ax1.set_ylabel("busy tracks (stacked fractions)")
    ax1.set_ylim(0, max(1.0, max(sum(v) for v in zip(*[u["series"][t] for t in tracks])) * 1.1))
    ax1.grid(True, alpha=0.3)
    ax1.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=8, frameon=False)
    fig.suptitle(title)
    data = [u["series"][t] for t in tracks]
    im = ax2.imshow(data, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=1,
                    extent=(0, total_us, len(tracks) - 0.5, -0.5))
    ax2.set_yticks(range(len(tracks)))
    ax2.set_yticklabels(["{} {:.0f}%".format(t, 100 * u["average"][t]) for t in tracks])
    ax2.set_xlabel("time (us), bin = {:.3g} ns".format(u["bin_ns"]))
    ax2.set_xlim(0, total_us)
    cb = fig.colorbar(im, ax=[ax1, ax2], pad=0.01, location="right", shrink=0.45, anchor=(0.0, 0.0))
    cb.set_label("busy fraction")
    fig.savefig(os.fspath(path))
    plt.close(fig)


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------


def plot_kernel(kernel, config: str = "trn2", out: str = ".", bins: int = 200) -> Dict[str, Any]:
    """Run `kernel` timing-only with a temporary trace; write <name>_roofline.png and <name>_utilisation.png."""
    import tempfile

    import nsim

    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nsim_plot_") as tmp:
        trace_path = os.path.join(tmp, "trace.json")
        _, prof = nsim.simulate_json(kernel, config=config, timing_only=True, trace=trace_path)
        name = _profile_name(prof)
        if name == "kernel" and isinstance(kernel, (str, os.PathLike)) and os.path.exists(os.fspath(kernel)):
            name = os.path.splitext(os.path.basename(os.fspath(kernel)))[0]
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        roof_png = os.path.join(out, safe + "_roofline.png")
        util_png = os.path.join(out, safe + "_utilisation.png")
        r = roofline(prof, roof_png)
        avg = utilisation(prof, util_png, bins=bins, trace=trace_path)
    return {"name": name, "roofline": r, "utilisation": avg, "roofline_png": roof_png, "utilisation_png": util_png}


def main(argv: Optional[List[str]] = None, prog: str = "python -m nsim.plot") -> int:
    """`nsim plot` and `python -m nsim.plot`: this parser is the only declaration of their options."""
    import argparse

    ap = argparse.ArgumentParser(
        prog=prog,
        description="Simulate each kernel timing-only and write <name>_roofline.png and <name>_utilisation.png, "
                    "with a one-line roofline and utilisation summary per kernel (docs/profiling.md, \"Plots\").",
        epilog="'nsim plot' runs 'python3 -m nsim.plot' with the same arguments and exits with its status. It needs "
               "python3 with numpy and matplotlib, and the nsim Python package with its _nsim module: in a build "
               "tree they are found next to the nsim program (<source>/python and <build>/python are put first on "
               "PYTHONPATH), otherwise on PYTHONPATH or installed by 'pip install .'. NSIM_PYTHON=/path/to/python "
               "picks another interpreter.")
    ap.add_argument("kernel", nargs="+", help="kernel.json file(s)")
    ap.add_argument("--config", default="trn2", help="configuration name or YAML (default trn2)")
    ap.add_argument("--out", default=".", help="output directory, created if missing (default .)")
    ap.add_argument("--bins", type=int, default=200, help="time bins of the utilisation plot (default 200)")
    args = ap.parse_args(argv)
    rc = 0
    for k in args.kernel:
        try:
            res = plot_kernel(k, config=args.config, out=args.out, bins=args.bins)
        except Exception as e:  # keep going over several kernels
            print("{}: error: {}".format(k, e), file=sys.stderr)
            rc = 1
            continue
        r = res["roofline"]
        print("{}: {:.1f} ns, {:.4g} FLOP, {:.4g} HBM bytes, intensity {:.4g} FLOP/B (ridge {:.4g}), "
              "{:.4g} GFLOP/s = {:.1f}% of roof, {}-bound".format(
                  res["name"], r["total_time_ns"], r["flops"], r["hbm_bytes"], r["intensity"], r["ridge"],
                  r["achieved_flops_per_s"] / 1e9, r["achieved_percent"], r["bound"]))
        print("  utilisation: " + ", ".join("{} {:.1f}%".format(k2, 100 * v) for k2, v in res["utilisation"].items()))
        print("  wrote {} and {}".format(res["roofline_png"], res["utilisation_png"]))
    return rc


if __name__ == "__main__":
    sys.exit(main())

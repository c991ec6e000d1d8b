"""What-if sweeps: simulate kernels over a grid of configuration values (and kernel parameters), in
parallel, into a table (CSV, optionally Parquet) and a plot.

    python -m nsim.sweep examples/softmax.json examples/swiglu.json \\
        -g hbm.bw=181.25GB/s,362.5GB/s,725GB/s -g sbuf.bytes_per_partition=96KiB,192KiB \\
        --out sweep.csv --plot sweep.png
    nsim sweep ...                       # the same from the nsim CLI

From Python::

    rows = nsim.sweep(["a.json", make_kernel], {"hbm.bw": ["181.25GB/s", "725GB/s"], "tile": [128, 256]})

A grid key that is a configuration key (`nsim config trn2` lists them) becomes an override; any other key
is a kernel parameter, passed by name to the kernels given as callables (``make_kernel(tile=128)`` returns
a kernel.json dict, e.g. ``my_kernel.to_json(x, tile=tile)``). Every point runs timing-only; a point whose
kernel does not fit (e.g. a smaller SBUF) is a row with its error code, not a failed sweep. Points run in
worker processes (``jobs``), or on a Ray cluster with ``backend="ray"`` (optional dependency) with no other
change. Rows are deterministic: the same grid gives the same table, in grid order, whatever the backend.
"""
from __future__ import annotations

import csv
import itertools
import json
import os
import sys
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from . import _core

KernelSpec = Union[str, "os.PathLike[str]", dict, Callable[..., Any]]

#: The columns every row has, before the grid keys' columns and the stats columns.
BASE_COLUMNS = ("kernel", "config", "status")
#: Stats copied into each row (dotted stats names; docs/profiling.md).
STAT_COLUMNS = ("total_time", "bound.tensor.time", "bound.vector.time", "bound.scalar.time", "bound.gpsimd.time",
                "bound.dma.time", "bound.hbm.time", "memory.hbm_read_bytes", "memory.hbm_write_bytes",
                "memory.sbuf_peak_bytes_per_partition", "flops.mfu_estimated_percent")


def _config_keys(config: str) -> set:
    """The configuration's dotted keys: the parameters (engines/params.def) of the resolved config, through
    ``_nsim`` (an unknown preset raises ConfigError)."""
    from nsim import _isa

    return set(_isa.config_values(config))


def _kernel_name(spec: KernelSpec, i: int) -> str:
    if callable(spec) and not isinstance(spec, (str, dict)):
        return getattr(spec, "__name__", "kernel{}".format(i))
    if isinstance(spec, dict):
        return str(spec.get("name", "kernel{}".format(i)))
    return os.path.splitext(os.path.basename(os.fspath(spec)))[0]


def _points(grid: Mapping[str, Sequence[Any]]) -> List[Dict[str, Any]]:
    keys = list(grid)
    for k in keys:
        if isinstance(grid[k], (str, bytes)) or not isinstance(grid[k], Iterable):
            raise TypeError("nsim.sweep: grid[{!r}] must be a list of values, not {!r}".format(k, grid[k]))
    return [dict(zip(keys, vals)) for vals in itertools.product(*(list(grid[k]) for k in keys))]


#: Kernels read in this process (kernel.json text -> nsim.LoadedKernel), the latest few: the points of one
#: kernel follow each other, so each worker reads a kernel's text once, not once per point.
_LOADED: Dict[str, Any] = {}
_LOADED_MAX = 4


def _loaded(text: str) -> Any:
    h = _LOADED.get(text)
    if h is None:
        h = _core.load_kernel(text)
        if len(_LOADED) >= _LOADED_MAX:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[text] = h
    return h


def _run_point(task: Dict[str, Any]) -> Dict[str, Any]:
    """One simulation (in a worker): the row for this point."""
    row = dict(task["row"])
    try:
        _, prof = _loaded(task["kernel"]).simulate(config=task["config"], overrides=task["overrides"],
                                                   timing_only=True, fast_forward=task.get("fast_forward"))
    except _core.NsimError as e:
        row["status"] = getattr(e, "code", None) or str(e).split(":", 1)[0]
        row["error"] = str(e)
        return row
    row["status"] = "ok"
    row["bound"] = prof.bound
    for s in STAT_COLUMNS:
        try:
            row[s] = prof.stat(s)
        except KeyError:
            row[s] = None
    return row


def _progress(total: int, show: bool):
    """A progress callback: tqdm when installed, else a line on stderr; nothing when not shown."""
    if not show:
        return lambda n: None, lambda: None
    try:
        from tqdm import tqdm  # optional
        bar = tqdm(total=total, desc="nsim sweep", unit="run", file=sys.stderr)
        return bar.update, bar.close
    except ImportError:
        done = [0]

        tty = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()

        def step(n):  # one line rewritten on a terminal, a line per step in a log
            done[0] += n
            sys.stderr.write("{}nsim sweep: {}/{} runs{}".format("\r" if tty else "", done[0], total,
                                                                 "" if tty else "\n"))
            sys.stderr.flush()

        return step, (lambda: sys.stderr.write("\n")) if tty else (lambda: None)


def sweep(kernels: Union[KernelSpec, Sequence[KernelSpec]], grid: Mapping[str, Sequence[Any]], *,
          config: str = "trn2", jobs: Optional[int] = None, backend: str = "process",
          progress: bool = False, fast_forward: Optional[bool] = None) -> List[Dict[str, Any]]:
    """Simulate every kernel at every point of `grid` (timing-only); one row (dict) per (kernel, point),
    in kernel order then grid order: kernel, config, status ("ok" or the error code), error (if any),
    each grid key, bound (the verdict of Profile.bound) and the STAT_COLUMNS stats.

    kernels: kernel.json paths, dicts or JSON texts, or callables taking the grid's kernel parameters by
    keyword and returning one of those. jobs: worker processes (default: the CPU count; 1 = in this
    process). backend: "process" or "ray" (ray must be installed; a running cluster is used if
    ray.init() finds one). fast_forward: None (the default) or True counts the repeating iterations of long
    loops instead of simulating them, False simulates every instruction (``simulate_json``'s fast_forward;
    docs/timing-model.md, "Fast-forward")."""
    if not isinstance(kernels, (list, tuple)):
        kernels = [kernels]
    if backend not in ("process", "ray"):
        raise ValueError("nsim.sweep: backend must be 'process' or 'ray', not {!r}".format(backend))
    cfg_keys = _config_keys(config)
    cfg_grid = {k: v for k, v in grid.items() if k in cfg_keys}
    par_grid = {k: v for k, v in grid.items() if k not in cfg_keys}
    dotted = sorted(k for k in par_grid if "." in k)  # a config key's form, misspelled: not a kernel parameter
    if dotted:
        import difflib
        from .tracer import make_error
        hints = ["'{}'{}".format(k, "".join(" (did you mean '{}'?)".format(m)
                                             for m in difflib.get_close_matches(k, sorted(cfg_keys), 1)))
                 for k in dotted]
        raise make_error("ConfigUnknownKey", "nsim.sweep: grid key{} {} {} no configuration key of {!r} "
                         "(configs/README.md lists them)".format("s" if len(dotted) > 1 else "", ", ".join(hints),
                                                                  "are" if len(dotted) > 1 else "is", config))
    tasks = []
    for i, spec in enumerate(kernels):
        name = _kernel_name(spec, i)
        is_fn = callable(spec) and not isinstance(spec, (str, dict))
        if par_grid and not is_fn:
            raise ValueError("nsim.sweep: grid keys {} are not configuration keys of {!r}, and kernel {!r} is not a "
                             "callable that takes kernel parameters".format(sorted(par_grid), config, name))
        for params in _points(par_grid) if par_grid else [{}]:
            text = None
            if is_fn:
                made = spec(**params)
                text = made if isinstance(made, str) else json.dumps(made)
            else:
                text, _ = _core._kernel_text(spec)
            for point in _points(cfg_grid) if cfg_grid else [{}]:
                row = {"kernel": name, "config": config, "status": None, "error": None}
                row.update(params)
                row.update(point)
                tasks.append({"row": row, "kernel": text, "config": config, "fast_forward": fast_forward,
                              "overrides": {k: v for k, v in point.items()}})
    step, close = _progress(len(tasks), progress)
    try:
        if backend == "ray":
            rows = _run_ray(tasks, step)
        elif (jobs or os.cpu_count() or 1) <= 1 or len(tasks) <= 1:
            rows = []
            for t in tasks:
                rows.append(_run_point(t))
                step(1)
        else:
            rows = _run_pool(tasks, min(jobs or os.cpu_count() or 1, len(tasks)), step)
    finally:
        close()
        _LOADED.clear()  # no kernel kept alive after the sweep (in this process; workers end with the pool)
    return rows


def _run_pool(tasks, workers, step):
    """The tasks on `workers` spawned processes, results in grid order. Spawned workers import the caller's
    `__main__` script again: a script that calls sweep() at its top level, not under
    `if __name__ == "__main__":`, makes every worker fail while starting, which multiprocessing.Pool answers by
    starting new ones forever. A process pool executor reports the broken pool instead: the error says what to
    change."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    rows = []
    # Each worker simulates with its share of the host threads (the numerics helpers, the placement search's second
    # run): with one each, `workers` runs already fill the CPUs, and more threads only take CPUs from each other
    # (a 128-point timing-only sweep of flash attention on 2 workers and 2 vCPUs: 0.83 s against 0.79 s with one).
    # A value the caller set in the environment stands.
    env, share = _core._nsim.THREADS_ENV, _thread_share(workers)
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                                 initargs=(env, share)) as pool:
            for r in pool.map(_run_point, tasks):  # map keeps grid order
                rows.append(r)
                step(1)
    except BrokenProcessPool:
        raise RuntimeError(
            "nsim.sweep: its worker processes could not start. Workers are spawned and import the calling script "
            "again: call nsim.sweep(...) under `if __name__ == \"__main__\":` in a script, or pass jobs=1 (one "
            "process), or use the `nsim sweep` command") from None
    return rows


def _thread_share(workers):
    """The host threads each of `workers` workers simulates with (the value of _nsim.THREADS_ENV set in each), or
    None when the caller set that variable (it stands)."""
    if os.environ.get(_core._nsim.THREADS_ENV):
        return None
    return str(max(1, _core._nsim.host_threads() // workers))


def _worker_init(env, share):
    """A sweep worker's start: its share of the host threads (read by the core at its first simulation)."""
    if share is not None:
        os.environ[env] = share


def _run_ray(tasks, step):
    try:
        import ray  # optional
    except ImportError:
        raise ImportError("nsim.sweep(backend='ray') needs ray: pip install ray") from None
    if not ray.is_initialized():
        ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(_run_point)
    refs = [remote.remote(t) for t in tasks]
    rows = []
    for ref in refs:  # in submission order: the same table as the process backend
        rows.append(ray.get(ref))
        step(1)
    return rows


def columns(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    """The table's columns: BASE_COLUMNS, error, the grid keys (first-seen order), bound, STAT_COLUMNS."""
    fixed = set(BASE_COLUMNS) | {"error", "bound"} | set(STAT_COLUMNS)
    grid_cols: List[str] = []
    for r in rows:
        for k in r:
            if k not in fixed and k not in grid_cols:
                grid_cols.append(k)
    return list(BASE_COLUMNS) + ["error"] + grid_cols + ["bound"] + list(STAT_COLUMNS)


def write_csv(rows: Sequence[Mapping[str, Any]], path: Union[str, "os.PathLike[str]"]) -> None:
    cols = columns(rows)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c) for c in cols})


def write_parquet(rows: Sequence[Mapping[str, Any]], path: Union[str, "os.PathLike[str]"]) -> None:
    try:
        import pyarrow as pa  # optional
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("writing Parquet needs pyarrow: pip install pyarrow (or write CSV)") from None
    cols = columns(rows)
    data = {c: [None if r.get(c) is None else (r[c] if isinstance(r[c], (int, float)) else str(r[c]))
                for r in rows] for c in cols}
    pq.write_table(pa.table(data), path)


def plot(rows: Sequence[Mapping[str, Any]], path: Union[str, "os.PathLike[str]"], x: Optional[str] = None) -> str:
    """Kernel time against grid key `x` (default: the first grid key), one line per kernel and combination
    of the other grid keys; failed points are left out. Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = columns(rows)
    keys = cols[len(BASE_COLUMNS) + 1:cols.index("bound")]
    if not keys:
        raise ValueError("nsim.sweep.plot: the rows have no grid keys")
    x = x or keys[0]
    others = [k for k in keys if k != x]
    xs = []
    for r in rows:
        if r.get(x) not in xs:
            xs.append(r.get(x))
    fig, ax = plt.subplots(figsize=(8, 5))
    series: Dict[tuple, Dict[Any, float]] = {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        series.setdefault((r["kernel"],) + tuple(r.get(k) for k in others), {})[r.get(x)] = r["total_time"] / 1e3
    for key, pts in series.items():
        label = key[0] + "".join(", {}={}".format(k, v) for k, v in zip(others, key[1:]))
        idx = [i for i, v in enumerate(xs) if v in pts]
        ax.plot(idx, [pts[xs[i]] for i in idx], "o-", label=label)
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels([str(v) for v in xs])
    ax.set_xlabel(x)
    ax.set_ylabel("kernel time (us)")
    ax.set_title("nsim sweep ({})".format(rows[0]["config"] if rows else ""))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return os.fspath(path)


def _parse_grid(items: Sequence[str]) -> Dict[str, List[str]]:
    grid: Dict[str, List[str]] = {}
    for it in items:
        key, sep, vals = it.partition("=")
        if not sep or not key.strip() or not vals.strip():
            raise ValueError("-g/--grid takes KEY=V1,V2,..., not {!r}".format(it))
        grid[key.strip()] = [v.strip() for v in vals.split(",") if v.strip()]
    return grid


def main(argv: Optional[List[str]] = None, prog: str = "python -m nsim.sweep") -> int:
    """`nsim sweep` and `python -m nsim.sweep`: this parser is the only declaration of their options."""
    import argparse

    ap = argparse.ArgumentParser(
        prog=prog,
        description="Simulate each kernel timing-only at every point of the grid (the product of the -g keys' "
                    "values: any configuration keys, e.g. -g hbm.bw=181.25GB/s,362.5GB/s,725GB/s -g "
                    "sbuf.bytes_per_partition=96KiB,192KiB), in parallel worker processes, and write one row per "
                    "(kernel, point): the values, status (ok, or the error code of a kernel that does not fit), the "
                    "bound verdict, the time and the bound stats (docs/profiling.md, \"What-if sweeps\").",
        epilog="'nsim sweep' runs 'python3 -m nsim.sweep' with the same arguments (as 'nsim plot' runs nsim.plot: "
               "the same PYTHONPATH and NSIM_PYTHON rules). Kernel parameters can be swept from Python: "
               "nsim.sweep.sweep().")
    ap.add_argument("kernel", nargs="+", help="kernel.json file(s)")
    ap.add_argument("-g", "--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                    help="a configuration key and its values (repeat for more keys: the grid is their product)")
    ap.add_argument("--config", default="trn2", help="configuration name or YAML (default trn2)")
    ap.add_argument("--out", default="sweep.csv", help="table: .csv, or .parquet (needs pyarrow) (default sweep.csv)")
    ap.add_argument("--plot", default=None, metavar="PNG", help="also plot kernel time against the first grid key")
    ap.add_argument("-j", "--jobs", type=int, default=None, help="worker processes (default: CPU count)")
    ap.add_argument("--ray", action="store_true", help="run the points on Ray (pip install ray)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--fast-forward", dest="fast_forward", action="store_const", const=True, default=None,
                    help="count the repeating iterations of long loops instead of simulating them (the default; "
                         "docs/timing-model.md)")
    ap.add_argument("--no-fast-forward", dest="fast_forward", action="store_const", const=False,
                    help="simulate every instruction")
    args = ap.parse_args(argv)
    try:
        grid = _parse_grid(args.grid)
        if not grid:
            raise ValueError("give at least one -g KEY=V1,V2,...")
        unknown = sorted(set(grid) - _config_keys(args.config))
        if unknown:
            raise ValueError("not configuration keys of {!r}: {} (`nsim config {}` lists them)".format(
                args.config, ", ".join(unknown), args.config))
        rows = sweep(args.kernel, grid, config=args.config, jobs=args.jobs,
                     backend="ray" if args.ray else "process", progress=not args.quiet,
                     fast_forward=args.fast_forward)
        if os.fspath(args.out).endswith(".parquet"):
            write_parquet(rows, args.out)
        else:
            write_csv(rows, args.out)
        if args.plot:
            plot(rows, args.plot)
    except (ValueError, ImportError, _core.NsimError) as e:
        print("nsim sweep: error: {}".format(e), file=sys.stderr)
        return 2
    ok = sum(r["status"] == "ok" for r in rows)
    print("nsim sweep: {} runs ({} ok, {} refused), wrote {}{}".format(
        len(rows), ok, len(rows) - ok, args.out, " and " + args.plot if args.plot else ""))
    if rows and not ok:  # nothing ran: a grid value the config refuses everywhere is the user's error, not a result
        print("nsim sweep: error: no point ran; the first was refused with {}".format(rows[0]["error"]), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

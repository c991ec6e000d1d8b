#!/usr/bin/env python3
"""nsim's mutation fuzzer: kernel.json files, configuration (-p overrides, YAML files) and CLI arguments.

Every input must end as exit 0 or a coded user error (NSIM-E1xx..E4xx). Anything else is a finding:

  crash      the process died on a signal (segfault, abort, ...)
  hang       no answer within --timeout seconds
  internal   an NSIM-E901 internal error
  uncoded    an exception or exit status without an NSIM code (e.g. pybind's TypeError, exit 1)
  sanitizer  an AddressSanitizer / UndefinedBehaviorSanitizer / LeakSanitizer report on stderr

Two ways to run an input:
  in-process  `_nsim.run_kernel` / `check_kernel` / `disasm` in a worker process (fast: no exec, no
              config parsing of the CLI); the parent kills and restarts a worker that hangs or dies.
  cli         the `nsim` binary (--nsim, default build/nsim) with mutated arguments and files; with
              --nsim build-asan/nsim every input goes through the sanitizer build.

Usage:
  fuzz.py run --time 120 [-j 1] [--seed N] [--cli-fraction 0.05] [--nsim build/nsim] [--out fuzz-findings]
  fuzz.py replay tests/fuzz/regressions        # every regression input must be ok or a coded user error

Findings are written to --out as JSON cases (the format of tests/fuzz/regressions/*.json); copy the
ones you fixed there. docs/reliability.md records campaigns.
"""
from __future__ import annotations

import argparse
import copy
import glob
import json
import math
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import wait as mp_wait
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")
REGRESSIONS = os.path.join(HERE, "regressions")

# Limits passed with every in-process run, so that a mutant with a huge trip count ends with a coded
# limit error instead of a timeout (the binary gets the same options in most CLI cases).
MAX_INSTRUCTIONS = 200_000
MAX_SIM_TIME_NS = 1e9
WORKER_MEMORY = 3 << 30  # address space in-process workers may add to what they inherit (RLIMIT_AS, bytes)

OUTCOMES = ("ok", "user_error", "internal", "uncoded", "crash", "hang", "sanitizer")
FAILURES = ("internal", "uncoded", "crash", "hang", "sanitizer")
SANITIZER_MARKS = ("AddressSanitizer", "UndefinedBehaviorSanitizer", "LeakSanitizer", "runtime error:")
CODE_RE = re.compile(r"NSIM-E(\d{3})")

# ------------------------------------------------------------------------------------------------
# Classification
# ------------------------------------------------------------------------------------------------


def classify_code(code: str) -> str:
    """ok / user_error / internal from an NSIM code ('' = no error)."""
    if not code:
        return "ok"
    m = CODE_RE.search(code)
    if not m:
        return "uncoded"
    return "internal" if m.group(1).startswith("9") else "user_error"


def classify_cli(rc: int, stderr: str) -> Tuple[str, str]:
    """(outcome, detail) of one run of the binary."""
    if any(mark in stderr for mark in SANITIZER_MARKS):
        return "sanitizer", stderr[-2000:]
    if rc < 0:
        return "crash", "signal {}".format(-rc)
    if rc == 0:
        return "ok", ""
    m = CODE_RE.search(stderr)
    if rc == 2 and m and not m.group(1).startswith("9"):
        return "user_error", m.group(0)
    if m and m.group(1).startswith("9"):
        return "internal", stderr.strip()[-500:]
    return "uncoded", "exit {}: {}".format(rc, stderr.strip()[-500:])


# ------------------------------------------------------------------------------------------------
# Executing one case (in the worker)
# ------------------------------------------------------------------------------------------------

_nsim = None


def _import_nsim():
    global _nsim
    if _nsim is None:
        sys.path[:0] = [os.path.join(ROOT, "python")]
        try:
            import _nsim as mod  # type: ignore
        except ImportError:
            from nsim import _nsim as mod  # type: ignore
        _nsim = mod
    return _nsim


def _materialise(case: dict, tmp: str) -> Dict[str, str]:
    """Write the case's files into tmp; returns {placeholder name: path}."""
    paths = {}
    for name, text in case.get("files", {}).items():
        p = os.path.join(tmp, name)
        with open(p, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(text)
        paths[name] = p
    return paths


def _trace_ok(trace: str) -> str:
    """'' when the trace file is absent or valid JSON, else the parse error."""
    if not trace or not os.path.exists(trace) or os.path.getsize(trace) == 0:
        return ""
    try:
        with open(trace, encoding="utf-8") as f:
            json.load(f)
    except ValueError as e:
        return "invalid trace JSON: {}".format(e)
    return ""


def run_inprocess(case: dict, tmp: str) -> Tuple[str, str]:
    m = _import_nsim()
    paths = _materialise(case, tmp)
    config = case.get("config", "trn2")
    if config in paths:
        config = paths[config]
    overrides = list(case.get("overrides", []))
    what = case.get("mode", "run")
    kernel = case["kernel"]
    trace = os.path.join(tmp, "trace.json") if case.get("trace") else ""
    try:
        if what == "check":
            m.check_kernel(kernel, config=config, overrides=overrides, filename="fuzz.json")
        elif what == "disasm":
            m.disasm(kernel, config=config, overrides=overrides, limit=int(case.get("limit", 1000)), filename="fuzz.json")
        else:
            m.run_kernel(kernel, {}, config=config, overrides=overrides, timing_only=bool(case.get("timing_only")),
                         trace_path=trace, seed=int(case.get("seed", 0)), filename="fuzz.json",
                         trace_limit=int(case.get("trace_limit", 0)),
                         max_instructions=int(case.get("max_instructions", MAX_INSTRUCTIONS)),
                         max_sim_time_ns=float(case.get("max_sim_time_ns", MAX_SIM_TIME_NS)))
        outcome, detail = "ok", ""
    except m.NsimError as e:
        code = getattr(e, "code", "") or ""
        outcome = classify_code(code)
        detail = "{}: {}".format(code, getattr(e, "message", str(e)))[:500]
    except MemoryError:
        return "internal", "MemoryError"
    except Exception as e:  # anything that is not an NsimError is a defect
        return "uncoded", "{}: {}".format(type(e).__name__, e)[:500]
    bad = _trace_ok(trace)  # a trace must be valid JSON, whatever the outcome
    if bad and outcome in ("ok", "user_error"):
        return "internal", bad
    return outcome, detail


def _unlimited_as():
    """In a CLI child: the worker's soft address-space limit lifted to its hard limit."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (resource.getrlimit(resource.RLIMIT_AS)[1],) * 2)
    except (ImportError, ValueError, OSError):
        pass


def run_cli(case: dict, tmp: str, nsim: str, timeout: float) -> Tuple[str, str]:
    paths = _materialise(case, tmp)
    argv = [nsim] + [paths.get(a, a) if isinstance(a, str) else str(a) for a in case["argv"]]
    argv = [a.replace("{tmp}", tmp) for a in argv]
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=timeout, env=env, cwd=tmp, preexec_fn=_unlimited_as)
    except subprocess.TimeoutExpired:
        return "hang", "timeout {} s".format(timeout)
    stderr = p.stderr.decode("utf-8", "replace")
    out, detail = classify_cli(p.returncode, stderr)
    # A run that wrote a trace must leave valid JSON, whatever its outcome.
    bad = _trace_ok(os.path.join(tmp, "t.json"))
    if bad and out in ("ok", "user_error"):
        return "internal", bad
    return out, detail


def execute(case: dict, nsim: str, timeout: float) -> Tuple[str, str]:
    if case["kind"] != "cli" and not case.get("files") and not case.get("trace"):
        return run_inprocess(case, "")  # nothing to write: no temporary directory
    tmp = tempfile.mkdtemp(prefix="nsim-fuzz-")
    try:
        if case["kind"] == "cli":
            return run_cli(case, tmp, nsim, timeout)
        return run_inprocess(case, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _vm_size() -> int:
    """This process's address space in bytes (VmSize), 0 where /proc does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _worker(conn, nsim: str, timeout: float):
    try:
        import resource

        # The soft limit only: CLI inputs run as child processes that lift it again (_unlimited_as), since
        # an ASan binary reserves terabytes of address space for its shadow memory. On top of the address space
        # the worker inherits from its parent (forked: a pytest process near 1 GB, most of it mappings it never
        # touches), so that whether an input fits does not depend on what ran in the parent before.
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        soft = _vm_size() + WORKER_MEMORY
        resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    except (ImportError, ValueError, OSError):
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _import_nsim()
    while True:
        try:
            case = conn.recv()
        except EOFError:
            return
        if case is None:
            return
        conn.send(execute(case, nsim, timeout))


# ------------------------------------------------------------------------------------------------
# Mutation
# ------------------------------------------------------------------------------------------------

INTERESTING_INTS = [0, 1, -1, 2, 3, 7, 31, 32, 33, 63, 64, 127, 128, 129, 255, 256, 511, 512, 513, 1024, 2047, 2048,
                    4096, 16384, 65535, 65536, 2 ** 20, 2 ** 31 - 1, 2 ** 31, -2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 40,
                    2 ** 40 + 1, 2 ** 53, 2 ** 62, 2 ** 63 - 1, -2 ** 63, 2 ** 63, 2 ** 64, 10 ** 30]
INTERESTING_FLOATS = [0.0, -0.0, 0.5, -0.5, 1.5, 1e-300, 1e300, -1e300, 1e308, 3.4e38, 6.5e4, 1e-45]
INTERESTING_STRINGS = ["", " ", "x", "0", "-1", "nan", "inf", "1e999", "i", "i*j", "i+", "128*i+1", "-i", "2*i-1",
                       "(", "i/2", "i%2", "i*i", "\u00e9", "\\", "\"", "a" * 300, "sbuf", "psum", "hbm", "input",
                       "output", "affine", "sequential", "static", "vector", "scalar", "gpsimd", "tensor", "sync",
                       "float32", "bfloat16", "float16", "int32", "uint8", "float8_e4m3", "add", "multiply", "max",
                       "bypass", "exp", "identity"]
OVERRIDE_VALUES = ["0", "-1", "1", "2", "1e-300", "1e300", "nan", "inf", "-inf", "", "abc", "4294967296",
                   "9223372036854775807", "-9223372036854775808", "18446744073709551616", "1e-12GB/s", "0GB/s",
                   "1e-300GHz", "0GHz", "-1ns", "0ns", "1e300ns", "true", "false", "[1, 2]", "{a: 1}", "1.5",
                   "0.0001", "100000", "1e9", "0B/ns", "1e-300B/ns", "64KiB", "1e30B", "-4"]


class Mutator:
    def __init__(self, rng: random.Random, seeds: List[Any], op_names: List[str], config_values: Dict[str, str]):
        self.rng = rng
        self.seeds = seeds
        self.op_names = op_names
        self.config_values = config_values
        self.config_keys = sorted(config_values)
        strings = set(INTERESTING_STRINGS) | set(op_names)
        for s in seeds:
            self._collect(s, strings)
        self.strings = sorted(strings)

    def _collect(self, node, out):
        if isinstance(node, dict):
            for k, v in node.items():
                out.add(k)
                self._collect(v, out)
        elif isinstance(node, list):
            for v in node:
                self._collect(v, out)
        elif isinstance(node, str) and len(node) < 64:
            out.add(node)

    # -- JSON tree mutations
    def _nodes(self, root) -> List[Tuple[Any, Any]]:
        """(container, key) of every node below root."""
        out = []
        stack = [root]
        while stack:
            n = stack.pop()
            if isinstance(n, dict):
                for k, v in n.items():
                    out.append((n, k))
                    stack.append(v)
            elif isinstance(n, list):
                for i, v in enumerate(n):
                    out.append((n, i))
                    stack.append(v)
        return out

    def _number(self, v):
        r = self.rng.random()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and r < 0.4:
            x = v
            return self.rng.choice([x + 1, x - 1, x * 2, x // 2 if isinstance(x, int) else x / 2, -x,
                                    x + self.rng.choice([64, 128, 512, 2 ** 31]), x * 1000])
        if r < 0.8:
            return self.rng.choice(INTERESTING_INTS)
        return self.rng.choice(INTERESTING_FLOATS)

    def _any_value(self):
        r = self.rng.random()
        if r < 0.3:
            return self._number(None)
        if r < 0.6:
            return self.rng.choice(self.strings)
        if r < 0.7:
            return self.rng.choice([None, True, False, [], {}, [0], {"x": 1}])
        # a subtree of some seed
        donor = self.rng.choice(self.seeds)
        nodes = self._nodes(donor)
        if not nodes:
            return 0
        c, k = self.rng.choice(nodes)
        return copy.deepcopy(c[k])

    def mutate_tree(self, doc):
        for _ in range(self.rng.choice([1, 1, 1, 2, 2, 3, 5])):
            nodes = self._nodes(doc)
            if not nodes:
                return doc
            c, k = self.rng.choice(nodes)
            v = c[k]
            r = self.rng.random()
            if r < 0.3 and isinstance(v, (int, float)) and not isinstance(v, bool):
                c[k] = self._number(v)
            elif r < 0.45 and isinstance(v, str):
                c[k] = self.rng.choice(self.strings)
            elif r < 0.55:  # delete
                del c[k]
            elif r < 0.65 and isinstance(c, list):  # duplicate
                c.insert(k, copy.deepcopy(v))
            elif r < 0.7 and isinstance(c, list) and len(c) > 1:  # swap
                j = self.rng.randrange(len(c))
                c[k], c[j] = c[j], c[k]
            elif r < 0.78 and isinstance(c, dict):  # add a key
                c[self.rng.choice(self.strings)] = self._any_value()
            else:
                c[k] = self._any_value()
        return doc

    def mutate_text(self, text: str) -> str:
        b = list(text)
        for _ in range(self.rng.choice([1, 1, 2, 4])):
            if not b:
                break
            i = self.rng.randrange(len(b))
            r = self.rng.random()
            if r < 0.3:
                del b[i:i + self.rng.randint(1, 8)]
            elif r < 0.6:
                b[i] = self.rng.choice('{}[]",:0123456789-.eE \n\\tfnul' + "\u00ff\u0000")
            elif r < 0.8:
                j = self.rng.randrange(len(b))
                b[i:i] = b[j:j + self.rng.randint(1, 40)]
            else:
                b = b[:i]
        return "".join(b)

    # -- configuration
    def override(self) -> str:
        key = self.rng.choice(self.config_keys)
        old = self.config_values[key]
        r = self.rng.random()
        if r < 0.5:
            val = self.rng.choice(OVERRIDE_VALUES)
        elif r < 0.8:  # keep the unit, change the number
            m = re.match(r"^\s*(-?[0-9.eE+-]+)(.*)$", old)
            if m:
                num = self.rng.choice(["0", "-1", "1e-300", "1e300", "1e-9", "2", "0.5", "4294967296", "1e18",
                                       "-1e-9", "nan"])
                val = num + m.group(2)
            else:
                val = self.rng.choice(self.strings)
        else:
            val = self.rng.choice(self.strings)
        if self.rng.random() < 0.03:
            return self.rng.choice(["", "=", key, "=1", key + "==1", "no.such.key=1", key.upper() + "=1"])
        return "{}={}".format(key, val)

    def yaml_config(self) -> str:
        lines = ["preset: {}".format(self.rng.choice(["trn2", "trn2", "trn1", "trn3", "trn9", "", "[]"]))]
        for _ in range(self.rng.randint(0, 4)):
            k, _, v = self.override().partition("=")
            lines.append("{}: {}".format(k, v))
        text = "\n".join(lines) + "\n"
        if self.rng.random() < 0.2:
            text = self.mutate_text(text)
        return text

    # -- whole cases
    def kernel_text(self) -> str:
        doc = copy.deepcopy(self.rng.choice(self.seeds))
        r = self.rng.random()
        if r < 0.08:
            return json.dumps(doc, indent=self.rng.choice([None, 1]))  # unmutated (config/CLI changes only)
        doc = self.mutate_tree(doc)
        text = json.dumps(doc, indent=1)
        if self.rng.random() < 0.1:
            text = self.mutate_text(text)
        return text

    def case(self, cli_fraction: float) -> dict:
        if self.rng.random() < cli_fraction:
            return self.cli_case()
        case: Dict[str, Any] = {"kind": "kernel", "kernel": self.kernel_text()}
        r = self.rng.random()
        case["mode"] = "check" if r < 0.1 else "disasm" if r < 0.15 else "run"
        case["timing_only"] = self.rng.random() < 0.8  # numerics cost ~10x more per input
        if self.rng.random() < 0.3:
            case["overrides"] = [self.override() for _ in range(self.rng.randint(1, 3))]
        if self.rng.random() < 0.05:
            case["files"] = {"c.yaml": self.yaml_config()}
            case["config"] = "c.yaml"
        elif self.rng.random() < 0.1:
            case["config"] = self.rng.choice(["trn1", "trn2", "trn3", "inf2", "trn9", "", "../x"])
        if self.rng.random() < 0.1:
            case["trace"] = True
            case["trace_limit"] = self.rng.choice([0, 1, 10, 1000])
        return case

    def cli_case(self) -> dict:
        rng = self.rng
        cmd = rng.choice(["run", "run", "run", "check", "disasm", "analyze", "diff", "config", "bogus", "--version",
                          "--help", ""])
        files = {"k.json": self.kernel_text()}
        argv: List[str] = [cmd]
        if cmd in ("run", "check", "disasm", "analyze", "diff") and rng.random() < 0.95:
            argv.append("k.json")
        if cmd == "diff":
            files["k2.json"] = self.kernel_text()
            argv.append("k2.json")
        options = [("--config", lambda: rng.choice(["trn1", "trn2", "trn3", "inf2", "x", "", "c.yaml"])),
                   ("-p", self.override), ("--seed", lambda: str(rng.choice(INTERESTING_INTS))),
                   ("--timing-only", None), ("--quiet", None), ("--trace", lambda: "t.json"),
                   ("--trace-limit", lambda: str(rng.choice(INTERESTING_INTS))),
                   ("--trace-window", lambda: rng.choice(["0:100", "5000:", ":1", "1:0", "x", ":", "1e300:", "-1:5"])),
                   ("--max-instructions", lambda: str(rng.choice(INTERESTING_INTS))),
                   ("--max-sim-time", lambda: rng.choice(["1000", "1us", "1e300", "-1", "x", "0", "10ms", "1e-3ns"])),
                   ("--stats", lambda: "s.json"), ("--stats-table", None), ("--limit", lambda: str(rng.choice(INTERESTING_INTS))),
                   ("--lines", lambda: str(rng.choice(INTERESTING_INTS))), ("--json", lambda: rng.choice(["-", "r.json"])),
                   ("--outputs", lambda: "out"), ("--raw-outputs", None), ("--inputs", lambda: rng.choice(["in", "k.json", "nope"])),
                   ("--instructions", lambda: "i.csv"), ("--dma", lambda: "d.csv"), ("--config-b", lambda: "trn1"),
                   ("-P", self.override), ("--bogus", None), ("-h", None)]
        for _ in range(rng.randint(0, 4)):
            opt, val = rng.choice(options)
            argv.append(opt)
            if val is not None and rng.random() < 0.97:
                argv.append(val())
        if "c.yaml" in argv:
            files["c.yaml"] = self.yaml_config()
        if cmd == "run" and rng.random() < 0.8 and "--max-instructions" not in argv:
            argv += ["--max-instructions", str(MAX_INSTRUCTIONS)]
        return {"kind": "cli", "argv": argv, "files": files}


def load_seeds() -> List[Any]:
    seeds = []
    for p in sorted(glob.glob(os.path.join(CORPUS, "*.json"))):
        with open(p, encoding="utf-8") as f:
            seeds.append(json.load(f))
    return seeds


def config_values() -> Dict[str, str]:
    """Flattened key -> value text of the trn2 configuration."""
    m = _import_nsim()
    out: Dict[str, str] = {}
    stack: List[str] = []
    for line in m.effective_config("trn2", []).splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = (len(line) - len(line.lstrip())) // 2
        key, _, val = line.strip().partition(":")
        del stack[indent:]
        if val.strip():
            out[".".join(stack + [key])] = val.strip().strip("'\"")
        else:
            stack.append(key)
    out.pop("name", None)
    out.pop("preset", None)
    return out


# ------------------------------------------------------------------------------------------------
# The campaign
# ------------------------------------------------------------------------------------------------


class Pool:
    """Worker processes that run cases; a worker that hangs or dies is replaced."""

    def __init__(self, n: int, nsim: str, timeout: float):
        self.nsim, self.timeout = nsim, timeout
        self.ctx = mp.get_context("fork")
        self.workers: List[Optional[Tuple[Any, Any]]] = [None] * n
        for i in range(n):
            self._start(i)

    def _start(self, i: int):
        parent, child = self.ctx.Pipe()
        p = self.ctx.Process(target=_worker, args=(child, self.nsim, self.timeout), daemon=True)
        p.start()
        child.close()
        self.workers[i] = (p, parent)

    def kill(self, i: int):
        p, conn = self.workers[i]
        try:
            p.kill()
        except Exception:
            pass
        p.join(5)
        conn.close()
        self._start(i)

    def close(self):
        for p, conn in self.workers:
            try:
                conn.send(None)
            except Exception:
                pass
            p.join(2)
            if p.is_alive():
                p.kill()


def run_cases(pool: Pool, next_case, on_result, deadline: float, max_cases: int):
    """Feed cases to the pool until the deadline or max_cases; on_result(case, outcome, detail)."""
    n = len(pool.workers)
    busy: Dict[int, Tuple[dict, float]] = {}
    sent = 0
    while True:
        for i in range(n):
            if i not in busy and time.time() < deadline and (max_cases <= 0 or sent < max_cases):
                case = next_case()
                if case is None:
                    max_cases = sent  # exhausted
                    break
                try:
                    pool.workers[i][1].send(case)
                except (BrokenPipeError, OSError):
                    pool.kill(i)
                    pool.workers[i][1].send(case)
                busy[i] = (case, time.time())
                sent += 1
        if not busy:
            return
        conns = {pool.workers[i][1]: i for i in busy}
        ready = mp_wait(list(conns), timeout=0.5)
        for c in ready:
            i = conns[c]
            case, _ = busy.pop(i)
            try:
                outcome, detail = c.recv()
            except (EOFError, OSError):
                code = pool.workers[i][0].exitcode
                pool.kill(i)
                outcome, detail = "crash", "worker died (exit code {})".format(code)
            on_result(case, outcome, detail)
        now = time.time()
        for i, (case, t0) in list(busy.items()):
            if now - t0 > pool.timeout * 1.5 + 2:
                busy.pop(i)
                pool.kill(i)
                on_result(case, "hang", "no answer in {:.0f} s".format(now - t0))


def cmd_run(args) -> int:
    rng = random.Random(args.seed)
    seeds = load_seeds()
    ops = [d["name"] for d in _import_nsim().op_table()] + ["nc_matmul"]
    mut = Mutator(rng, seeds, ops, config_values())
    os.makedirs(args.out, exist_ok=True)
    counts = {o: 0 for o in OUTCOMES}
    kinds = {"kernel": 0, "cli": 0}
    codes: Dict[str, int] = {}
    t0 = time.time()
    last = [t0]

    def on_result(case, outcome, detail):
        counts[outcome] += 1
        kinds[case["kind"]] += 1
        if outcome == "user_error":
            m = CODE_RE.search(detail)
            if m:
                codes[m.group(0)] = codes.get(m.group(0), 0) + 1
        if outcome in FAILURES:
            name = "{}-{}-{}.json".format(outcome, int(time.time() * 1000), counts[outcome])
            with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
                json.dump(dict(case, outcome=outcome, detail=detail), f, indent=1)
            print("FINDING {}: {} -> {}".format(outcome, name, detail[:200]), flush=True)
        if time.time() - last[0] > args.report_every:
            last[0] = time.time()
            report()

    def report(final=False):
        total = sum(counts.values())
        el = time.time() - t0
        print("{}{} inputs in {:.0f} s ({:.0f}/s): {} | kernel {} cli {}".format(
            "FINAL " if final else "", total, el, total / max(el, 1e-9),
            " ".join("{}={}".format(k, v) for k, v in counts.items()), kinds["kernel"], kinds["cli"]), flush=True)

    nsim = os.path.abspath(args.nsim)
    if not os.path.exists(nsim):
        print("fuzz: {} not found (build first, or --cli-fraction 0)".format(nsim), file=sys.stderr)
        if args.cli_fraction > 0:
            return 2
    pool = Pool(args.jobs, nsim, args.timeout)
    try:
        run_cases(pool, lambda: mut.case(args.cli_fraction), on_result, t0 + args.time, args.max_inputs)
    except KeyboardInterrupt:
        pass
    finally:
        pool.close()
    report(final=True)
    top = sorted(codes.items(), key=lambda kv: -kv[1])
    print("user-error codes: " + ", ".join("{} {}".format(c, n) for c, n in top))
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump({"inputs": sum(counts.values()), "seconds": round(time.time() - t0, 1), "outcomes": counts,
                       "kinds": kinds, "codes": dict(top), "seed": args.seed, "jobs": args.jobs,
                       "cli_fraction": args.cli_fraction, "nsim": args.nsim}, f, indent=1)
    failures = sum(counts[o] for o in FAILURES)
    return 1 if failures else 0


def replay(paths: List[str], nsim: str, timeout: float) -> List[Tuple[str, str, str]]:
    """Run every case; returns (path, outcome, detail) of each."""
    files: List[str] = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "*.json"))) if os.path.isdir(p) else [p]
    cases = []
    for p in files:
        with open(p, encoding="utf-8") as f:
            cases.append((p, json.load(f)))
    results: List[Tuple[str, str, str]] = []
    it = iter(cases)
    by_id = {}

    def next_case():
        try:
            p, c = next(it)
        except StopIteration:
            return None
        c = dict(c, _path=p)
        return c

    def on_result(case, outcome, detail):
        results.append((case["_path"], outcome, detail))

    pool = Pool(1, os.path.abspath(nsim), timeout)
    try:
        run_cases(pool, next_case, on_result, time.time() + 1e9, 0)
    finally:
        pool.close()
    del by_id
    return results


def cmd_replay(args) -> int:
    bad = 0
    for path, outcome, detail in replay(args.paths or [REGRESSIONS], args.nsim, args.timeout):
        fail = outcome in FAILURES
        bad += fail
        print("{:<10} {} {}".format(outcome, os.path.relpath(path), detail[:160] if fail else ""))
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="a fuzz campaign")
    r.add_argument("--time", type=float, default=60, help="seconds [60]")
    r.add_argument("--max-inputs", type=int, default=0, help="stop after N inputs (0 = no limit)")
    r.add_argument("-j", "--jobs", type=int, default=1)
    r.add_argument("--seed", type=int, default=int(time.time()))
    r.add_argument("--cli-fraction", type=float, default=0.05, help="share of inputs run through the binary")
    r.add_argument("--nsim", default=os.path.join(ROOT, "build", "nsim"))
    r.add_argument("--timeout", type=float, default=20, help="seconds per input")
    r.add_argument("--out", default="fuzz-findings")
    r.add_argument("--summary", default="", help="write the counts as JSON here")
    r.add_argument("--report-every", type=float, default=60)
    p = sub.add_parser("replay", help="replay regression inputs")
    p.add_argument("paths", nargs="*")
    p.add_argument("--nsim", default=os.path.join(ROOT, "build", "nsim"))
    p.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args(argv)
    return cmd_run(args) if args.cmd == "run" else cmd_replay(args)


if __name__ == "__main__":
    sys.exit(main())

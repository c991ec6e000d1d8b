"""Thin Python layer over the `_nsim` extension: exceptions, kernel loading, `simulate_json`, `Profile`.

The extension is found as `nsim._nsim` (installed wheel: scikit-build-core puts it into this package)
or as a top-level `_nsim` (CMake build tree: `PYTHONPATH=python:build/python`).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

try:  # installed package
    from nsim import _nsim  # type: ignore[attr-defined]
except ImportError:  # build tree: build/python/_nsim*.so on sys.path
    try:
        import _nsim  # type: ignore[no-redef]
    except ImportError as e:  # pragma: no cover - depends on the build
        raise ImportError(
            "nsim: the _nsim extension module is not built. Build it with "
            "`cmake -S . -B build -G Ninja && cmake --build build` and put build/python on PYTHONPATH, "
            "or `pip install .`") from e

from nsim import _errors  # noqa: E402  (after the extension: the table comes from it)
from nsim._errors import NkiValidationError  # noqa: E402  (nki-api.md 4.1: a base of the validation errors)

# An installed wheel carries the presets in nsim/configs; the C++ side reads NSIM_CONFIGS_DIR (the
# build tree falls back to the source tree's configs/, compiled in). An explicit setting wins.
_PKG_CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
if not os.environ.get("NSIM_CONFIGS_DIR") and os.path.isdir(_PKG_CONFIGS):
    os.environ["NSIM_CONFIGS_DIR"] = _PKG_CONFIGS

__all__ = [
    "NsimError", "ConfigError", "AccessError", "OperandError", "KernelError", "NotSupportedError", "InternalError",
    "Profile", "ProfileComparison", "simulate_json", "load_kernel", "LoadedKernel", "check_json", "disasm_json", "effective_config",
    "op_table", "alu_ops", "act_funcs", "dtypes", "version",
]


# ------------------------------------------------------------------------------------------------
# Exceptions
# ------------------------------------------------------------------------------------------------


class NsimError(Exception):
    """An nsim error with a stable code (NSIM-Exxx, sim/errors.def) and, where known, the kernel source
    location. The default code is that of an internal error."""

    def __init__(self, message: str, code: Optional[str] = None, file: str = "", line: int = 0, function: str = ""):
        self.code = code if code is not None else _errors.code("Internal")
        self.message = message
        self.file = file
        self.line = line
        self.function = function
        super().__init__(self._text())
        if self.hint and hasattr(self, "add_note"):  # shown under the message in tracebacks (Python 3.11+)
            self.add_note("fix: " + self.hint)

    @property
    def hint(self) -> str:
        """What usually fixes an error of this code (sim/errors.def), "" when the table has none."""
        return _errors.hint(self.code)

    def _text(self) -> str:
        s = "{}: {}".format(self.code, self.message)
        if self.file and self.line and "{}:{}".format(self.file, self.line) not in self.message:
            s += " [at {}:{}]".format(self.file, self.line)
        return s

    def __str__(self) -> str:
        return self._text()

    @property
    def number(self) -> int:
        """The numeric part of the code (201 for the code of OutOfBounds)."""
        try:
            return int(self.code.rsplit("E", 1)[-1])
        except ValueError:
            return 0


class ConfigError(NsimError):
    """Family config (E1xx): configuration presets, keys, values and overrides."""


class AccessError(NsimError, NkiValidationError):
    """Family access (E2xx): memory capacity and access patterns (an NkiValidationError)."""


class AccessOutOfBoundsError(AccessError, IndexError):
    """OutOfBounds: an access pattern leaves its buffer (also an IndexError, nki-api.md 4.1)."""


class OperandError(NsimError, NkiValidationError):
    """Family operand (E3xx): ISA operands (buffers, dtypes, partitions, engines, arguments); an
    NkiValidationError."""


class KernelError(NsimError):
    """Family kernel (E4xx): the kernel IR and the NKI frontends (syntax, names, indices, loops, inputs)."""


class KernelValidationError(KernelError, NkiValidationError):
    """A kernel-family code that is a rule of the hardware or of the NKI API rather than of the file or the
    command line (a subscript, view, reshape, broadcast, mask or tile the API does not allow): also an
    NkiValidationError."""


class IndexOutOfBoundsError(KernelValidationError, IndexError):
    """IndexOutOfBounds: an index leaves its tensor (also an IndexError, nki-api.md 4.1)."""


class TensorTruthValueError(KernelError, ValueError):
    """TensorTruthValue: a tensor used as a Python bool (also a ValueError, nki-api.md 4.1:
    err_ambiguous_tensor_truth_value)."""


class TensorNotIterableError(KernelError, TypeError):
    """TensorNotIterable: a tensor iterated over in Python while tracing (also a TypeError)."""


class NotSupportedError(KernelError, NotImplementedError):
    """Family not_supported (E4xx): an NKI function or feature that nsim does not support yet (also a
    NotImplementedError, for code that catches that)."""


class InternalError(NsimError):
    """Family internal (E9xx): internal errors of nsim."""


# The exception class of each family of sim/errors.def (a test checks that the families agree).
FAMILY_CLASSES = {"config": ConfigError, "access": AccessError, "operand": OperandError, "kernel": KernelError,
                  "not_supported": NotSupportedError, "internal": InternalError}


class KernelFileNotFoundError(KernelError, FileNotFoundError):
    """BadInput: the kernel argument is neither JSON text nor an existing file (also a FileNotFoundError)."""

    def __init__(self, message: str, code: str = "", file: str = "", line: int = 0, function: str = ""):
        KernelError.__init__(self, message, code=code or _errors.code("BadInput"), file=file, line=line,
                             function=function)


# Codes whose class is more specific than their family's (by name; the rest take their family's class).
CODE_CLASSES = {"OutOfBounds": AccessOutOfBoundsError, "IndexOutOfBounds": IndexOutOfBoundsError,
                "TensorTruthValue": TensorTruthValueError, "TensorNotIterable": TensorNotIterableError,
                **{name: KernelValidationError for name in (
                    "BadSubscript", "BadBroadcast", "BadReshape", "BadView", "BadTensorShape", "BadRank",
                    "TileInference", "BadMask", "MxNoCast", "DynamicIndex")}}


def error_class(code: str) -> type:
    """The NsimError subclass of a code such as the one of IndexOutOfBounds (CODE_CLASSES, else the table's
    family)."""
    row = _errors.BY_CODE.get(str(code))
    if row is not None and row["name"] in CODE_CLASSES:
        return CODE_CLASSES[row["name"]]
    return FAMILY_CLASSES.get(_errors.family(str(code)), NsimError)


def _translate(raw: BaseException) -> NsimError:
    code = getattr(raw, "code", None) or _errors.code("Internal")
    return error_class(code)(getattr(raw, "message", str(raw)), code=code, file=getattr(raw, "file", ""),
                             line=getattr(raw, "line", 0), function=getattr(raw, "function", ""))


def _call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except _nsim.NsimError as raw:
        err = _translate(raw)
    raise err from None


# ------------------------------------------------------------------------------------------------
# Arguments
# ------------------------------------------------------------------------------------------------

KernelLike = Union[Mapping[str, Any], str, bytes, "os.PathLike[str]"]


def _json_default(x: Any) -> Any:
    """json.dumps fallback of a kernel dict: numpy scalars and arrays become Python numbers and lists."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        np = None
    if np is not None:
        if isinstance(x, np.bool_):
            return bool(x)
        if isinstance(x, np.integer):
            return int(x)
        if isinstance(x, np.floating):
            return float(x)
        if isinstance(x, np.ndarray):
            return x.tolist()
    if isinstance(x, (tuple, set, frozenset)):
        return list(x)
    raise KernelError("kernel dict: a value of type {} is not a JSON value (numbers, strings, lists, dicts, "
                      "bools, None): {!r}".format(type(x).__name__, x)[:300], code=_errors.code("WrongType"))


def _uncompressed(data: bytes, what: str) -> bytes:
    """The bytes of a kernel file, inflated by _nsim when they are gzip data (docs/kernel-json.md,
    "Compressed kernel.json"); a corrupt stream raises KernelError (BadCompression)."""
    if data[:2] == b"\x1f\x8b":
        return _call(_nsim.kernel_bytes, data, what)
    return data


def _kernel_text(kernel: KernelLike, arg: str = "kernel") -> Tuple[str, str]:
    """(kernel.json text, file name for messages) of a dict, JSON text or path."""
    if isinstance(kernel, Mapping):
        try:
            # compact (no indent): json's C encoder; an indent falls back to the pure-Python encoder, which is
            # ~10x slower on kernels of millions of statements (issue 12)
            return json.dumps(kernel, separators=(",", ":"), default=_json_default, allow_nan=True), "<dict>"
        except ValueError as e:  # circular references
            raise KernelError("{}: the dict is not JSON-serialisable: {}".format(arg, e), code=_errors.code("WrongType")) from None
    if isinstance(kernel, (bytes, bytearray)):
        kernel = _uncompressed(bytes(kernel), "<bytes>")
        try:
            kernel = kernel.decode("utf-8")
        except UnicodeDecodeError as e:
            raise KernelError("{}: the bytes are not UTF-8 text: {}".format(arg, e), code=_errors.code("JsonSyntax")) from None
    if isinstance(kernel, os.PathLike):
        kernel = os.fspath(kernel)
    if not isinstance(kernel, str):
        raise TypeError("{} must be a dict, a JSON string or a path, not {}".format(arg, type(kernel).__name__))
    if kernel.lstrip()[:1] in ("{", "["):
        return kernel, "<string>"
    # Not JSON at its start: a path, unless it cannot be one (then it is JSON text with a syntax error).
    looks_like_path = kernel.strip() != "" and "\n" not in kernel and not any(c in kernel for c in '{}[]":')
    if not looks_like_path and not os.path.exists(kernel):
        return kernel, "<string>"  # the parser reports JsonSyntax with line:column
    try:
        with open(kernel, "rb") as f:
            data = f.read()
        return _uncompressed(data, kernel).decode("utf-8"), kernel
    except FileNotFoundError:
        raise KernelFileNotFoundError("{}: no such file '{}' (pass a kernel.json path, its JSON text or a dict)".format(
            arg, kernel)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise KernelError("{}: cannot read '{}': {}".format(arg, kernel, e), code=_errors.code("BadInput")) from None


def _check_str(value: Any, arg: str) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError("{} must be a string (a preset name such as 'trn2' or a YAML path), not {!r}".format(
            arg, value))
    return value


def _check_int(value: Any, arg: str, lo: int, hi: int) -> int:
    """An int in [lo, hi] (bools and floats refused), else TypeError / ValueError naming the argument."""
    try:
        import numpy as np
        ints: tuple = (int, np.integer)
    except ImportError:  # pragma: no cover
        ints = (int,)
    if isinstance(value, bool) or not isinstance(value, ints):
        raise TypeError("{} must be an int, not {!r}".format(arg, value))
    v = int(value)
    if not lo <= v <= hi:
        raise ValueError("{} must be in [{}, {}], not {}".format(arg, lo, hi, v))
    return v


def _check_number(value: Any, arg: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError("{} must be a number, not {!r}".format(arg, value))
    v = float(value)
    if not lo <= v <= hi:  # also NaN
        raise ValueError("{} must be in [{}, {}], not {}".format(arg, lo, hi, value))
    return v


def _overrides(overrides: Union[None, Mapping[str, Any], Sequence[str]]) -> List[str]:
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    if isinstance(overrides, (list, tuple)):  # (before Mapping, whose isinstance goes through the ABC machinery:
        return [str(o) for o in overrides]   # tracing normalises a kernel's overrides per instruction)
    if isinstance(overrides, Mapping):
        out = []
        for k, v in overrides.items():
            if isinstance(v, bool):
                v = "true" if v else "false"
            out.append("{}={}".format(k, v))
        return out
    raise TypeError("overrides must be a dict {{key: value}}, a list of 'key=value' strings or one string, not "
                    "{!r}".format(overrides))


# ------------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------------


class Profile:
    """Timing results of one simulation.

    stats        nested dict of the stats JSON; leaves are {"value", "unit", "description"}
    total_time_ns
    lines        per source line: {src, file, line, function, instructions, instruction_time_ns},
                 most time first
    config_yaml  the effective configuration
    kernel       the kernel.json structure (dict)
    """

    def __init__(self, kernel_text: Union[str, Callable[[], str]], stats_json: Union[str, Dict[str, Any]],
                 lines: list, config_yaml: str, config: str = "", timing_only: bool = False,
                 overrides: Optional[List[str]] = None):
        self.overrides: List[str] = list(overrides or [])
        # The kernel.json text, or a callable that makes it (a kernel loaded from a dict: written when asked for).
        self._text = kernel_text
        self._kernel: Optional[dict] = None
        # The nested stats: a dict (from _nsim) or the stats JSON text.
        self.stats: Dict[str, Any] = json.loads(stats_json) if isinstance(stats_json, str) else stats_json
        self.lines: List[dict] = list(lines)
        # The YAML text, or a callable that makes it (run_kernel writes it only when asked for).
        self._config_yaml = config_yaml
        self.config = config
        self.timing_only = timing_only
        #: the sanitizer's reports (simulate_json(check=True)): dicts {code, check, op, tensor, detail, ...}
        self.check_reports: List[dict] = []
        #: with fast_forward=True, per loop source line: {src, file, line, function, instances: {outcome: count},
        #: outcome, why} - what became of its instances (skipped, or why not; docs/timing-model.md "Fast-forward")
        self.fast_forward_loops: List[dict] = []

    @property
    def config_yaml(self) -> str:
        """The effective configuration (YAML text)."""
        if callable(self._config_yaml):
            self._config_yaml = self._config_yaml()
        return self._config_yaml

    @config_yaml.setter
    def config_yaml(self, text: str) -> None:
        self._config_yaml = text

    def __getstate__(self):  # picklable: the YAML and kernel texts, not the functions that make them
        state = dict(self.__dict__)
        state["_config_yaml"] = self.config_yaml
        state["_text"] = self._kernel_text
        return state

    @property
    def _kernel_text(self) -> str:
        if callable(self._text):
            self._text = self._text()
        return self._text

    @property
    def kernel(self) -> dict:
        if self._kernel is None:
            self._kernel = json.loads(self._kernel_text)
        return self._kernel

    def to_json(self) -> str:
        """The kernel.json text that was simulated."""
        return self._kernel_text

    def stat(self, name: str) -> Any:
        """Value of a stat by dotted name, e.g. "engine.vector.active_time" (KeyError if absent)."""
        node: Any = self.stats
        for part in name.split("."):
            if not isinstance(node, dict) or part not in node:
                raise KeyError(name)
            node = node[part]
        if isinstance(node, dict) and "value" in node:
            return node["value"]
        raise KeyError("{} is a group of stats, not a stat".format(name))

    @property
    def bound(self) -> str:
        """The kernel's bound — a resource ("tensor", "vector", "scalar", "gpsimd", "sync", "dma", "hbm")
        or "latency" — the one verdict `nsim run`, `nsim analyze` and the roofline report."""
        return self.bounds()["verdict"]

    def bounds(self) -> Dict[str, Any]:
        """The resource bounds behind `bound`: {verdict, top_share_percent, latency_threshold_percent,
        bounds: [{name, ns, what}, ...] largest first} (engines/bounds.h)."""
        return _nsim.bound_verdict(self.stat)

    @property
    def total_time_ns(self) -> float:
        return float(self.stat("total_time"))

    @property
    def cores(self) -> int:
        """Physical cores of the launch: 2 for an LNC=2 launch (``kernel[2]``, docs/lnc.md), else 1."""
        try:
            return int(self.stat("lnc.cores"))
        except KeyError:
            return 1

    @property
    def core_times_ns(self) -> List[float]:
        """Each physical core's own total time ([core 0, core 1] for LNC=2; [total_time_ns] for one core).
        The launch's total_time_ns is the largest; ``stat("lnc.imbalance_percent")`` compares them."""
        if self.cores == 1:
            return [self.total_time_ns]
        return [float(self.stat("core{}.total_time".format(c))) for c in range(self.cores)]

    def stats_table(self) -> str:
        """Every stat as a readable table grouped by engine, dma, memory, flops, ...: full dotted name,
        value formatted for its unit, unit, description; the text `nsim run --stats-table` prints
        (docs/profiling.md, "Stats")."""
        return _call(_nsim.stats_table, json.dumps(self.stats))

    @property
    def name(self) -> str:
        try:
            return str(self.kernel.get("name", ""))
        except ValueError:
            return ""

    def analyze(self, max_lines: int = 5) -> "Any":
        """The bottleneck analysis (nsim.Analysis) of this kernel on this configuration: the kernel is
        simulated again, timing-only, with the analyzer attached (docs/profiling.md)."""
        from nsim.analysis import analyze

        return analyze(self._kernel_text, config=self.config or "trn2", overrides=self.overrides, max_lines=max_lines)

    def __repr__(self) -> str:
        busiest = ""
        if self.lines:
            l0 = self.lines[0]
            busiest = ", busiest line {} ({:.1f} ns)".format(l0.get("src", ""), l0.get("instruction_time_ns", 0.0))
        return "<nsim.Profile {}{}: {:.1f} ns{}>".format(self.name or "kernel",
                                                        " on " + self.config if self.config else "",
                                                        self.total_time_ns, busiest)

    def _config_name(self) -> str:
        """The configuration's `name` (what `nsim run --stats` records), else the requested config."""
        for line in self.config_yaml.splitlines():
            if line.startswith("name:"):
                return line.split(":", 1)[1].strip().strip("'\"")
        return self.config

    def to_stats_json(self) -> str:
        """The stats JSON `nsim run --stats FILE` writes: kernel, config, timing_only, instructions,
        lines [{src, instructions, instruction_time_ns}] and the nested stats (input of `nsim diff`)."""
        engines = self.stats.get("engine", {})
        # Every instruction runs on exactly one engine, so the engine counts add up to the total.
        instructions = sum(int(e.get("instruction_count", {}).get("value", 0)) for e in engines.values())
        doc = {
            "kernel": self.name,
            "config": self._config_name(),
            "timing_only": bool(self.timing_only),
            "instructions": instructions,
            "lines": [{"src": l.get("src", ""), "instructions": l.get("instructions", 0),
                       "instruction_time_ns": l.get("instruction_time_ns", 0.0)} for l in self.lines],
            "stats": self.stats,
        }
        return json.dumps(doc, indent=1) + "\n"

    def compare(self, other: "Profile", max_lines: int = 20,
                labels: Tuple[str, str] = ("a", "b")) -> "ProfileComparison":
        """Compare this profile (A) with `other` (B), as `nsim diff` does: total time, engines, headline
        stats and source lines (matched by "file:line (function)"), deltas B - A. `max_lines` limits
        the lines of the text report (-1: all); `.data` always has every line."""
        return ProfileComparison.from_stats_json(self.to_stats_json(), other.to_stats_json(), max_lines=max_lines,
                                                 labels=labels)


class ProfileComparison:
    """Result of `Profile.compare` (and of `nsim diff`, whose --json output is `.data`).

    text    the aligned report (also str(comparison))
    data    {"a": {label, kernel, config, instructions}, "b": {...}, "total_time_ns": {a, b, delta, ratio,
            percent}, "engines": {name: {"active_time_ns": {...}, "instructions": {a, b, delta}}},
            "stats": {dotted name: {a, b, delta, ratio, percent, unit}}, "lines": [{src, status,
            "instruction_time_ns": {...}, "instructions": {...}}, ...]}; missing values are None.
    """

    def __init__(self, text: str, data: Dict[str, Any]):
        self.text = text
        self.data = data

    @classmethod
    def from_stats_json(cls, stats_a: str, stats_b: str, max_lines: int = 20,
                        labels: Tuple[str, str] = ("a", "b")) -> "ProfileComparison":
        """Compare two stats-JSON texts (`nsim run --stats` files, `Profile.to_stats_json()`)."""
        text, data = _call(_nsim.diff_stats, stats_a, stats_b, str(labels[0]), str(labels[1]), int(max_lines))
        return cls(text, json.loads(data))

    @property
    def total_time_delta_ns(self) -> float:
        """B - A of total_time (negative: B is faster)."""
        return float(self.data["total_time_ns"]["delta"])

    @property
    def lines(self) -> List[dict]:
        """Every source line, largest |time delta| first; `status` is same/changed/added/removed."""
        return list(self.data["lines"])

    @property
    def engines(self) -> Dict[str, dict]:
        """{tensor, vector, scalar, gpsimd, sync, dma: {"active_time_ns": {a, b, delta, ...}, "instructions": ...}}."""
        return dict(self.data["engines"])

    @property
    def stats(self) -> Dict[str, dict]:
        """Headline stats by dotted name: {a, b, delta, ratio, percent, unit}."""
        return dict(self.data["stats"])

    def to_json(self) -> str:
        return json.dumps(self.data, indent=2)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        t = self.data["total_time_ns"]
        return "<nsim.ProfileComparison {} -> {}: {:.1f} ns -> {:.1f} ns ({:+.1f} ns)>".format(
            self.data["a"]["label"], self.data["b"]["label"], t["a"], t["b"], t["delta"])


# ------------------------------------------------------------------------------------------------
# Entry points
# ------------------------------------------------------------------------------------------------


def _progress_reporter(progress):
    """(callback for _nsim.run_kernel or None, close()) for simulate_json's ``progress`` argument."""
    if progress is None or progress is False:
        return None, lambda: None
    if callable(progress):
        return progress, lambda: None
    if progress is not True:
        raise TypeError("progress must be True, False, None or a callable(instructions, simulated_ns), not {!r}"
                        .format(progress))
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        bar = tqdm(unit=" instr", unit_scale=True, desc="nsim", leave=False)
        done = [0]

        def report(n, simulated_ns):
            bar.update(n - done[0])
            done[0] = n
            bar.set_postfix_str("{:.1f} us simulated".format(simulated_ns * 1e-3), refresh=False)
        return report, bar.close
    shown = [False]

    def line(n, simulated_ns):
        shown[0] = True
        sys.stderr.write("\rnsim: {:.2f} M instructions, {:.1f} us simulated   ".format(n * 1e-6, simulated_ns * 1e-3))
        sys.stderr.flush()

    def close():
        if shown[0]:
            sys.stderr.write("\n")
    return line, close


def _trace_progress_reporter(name: str) -> Tuple[Callable[[int], None], Callable[[], None]]:
    """(report(statements), close()) for the tracing of a kernel run with ``progress=True``: once tracing took
    2 s, at most once a second, the line ``nsim: tracing NAME: N statements, T s`` on stderr (the simulator's
    clock, _nsim.ProgressClock: NSIM_PROGRESS_INTERVAL=<s> sets both)."""
    clock = _nsim.ProgressClock()

    def report(n: int) -> None:
        if clock.due():
            sys.stderr.write("\rnsim: tracing {}: {:,} statements, {:.1f} s   ".format(name, n, clock.elapsed()))
            sys.stderr.flush()

    def close() -> None:
        if clock.shown():
            sys.stderr.write("\n")
    return report, close


def _run_options(config: Any, seed: Any, trace_limit: Any, max_instructions: Any, max_sim_time_ns: Any,
                 trace_window: Any, fast_forward: Any = None) -> Dict[str, Any]:
    """The checked keyword arguments of _nsim's simulate (bad ones raise TypeError / ValueError). fast_forward
    stays None (wherever it applies), True (asked for) or False; _simulate resolves it."""
    if not isinstance(fast_forward, (bool, type(None))):
        raise TypeError("fast_forward must be True, False or None, not {!r}".format(fast_forward))
    opts: Dict[str, Any] = {
        "fast_forward": fast_forward,
        "config": _check_str(config, "config"),
        "seed": _check_int(seed, "seed", 0, 2 ** 63 - 1),
        "trace_limit": 0 if trace_limit is None else _check_int(trace_limit, "trace_limit", 0, 2 ** 63 - 1),
        "max_instructions": 0 if max_instructions is None else _check_int(max_instructions, "max_instructions", 0,
                                                                          2 ** 63 - 1),
        "max_sim_time_ns": 0.0 if max_sim_time_ns is None else _check_number(max_sim_time_ns, "max_sim_time_ns",
                                                                              0.0, 1e15),
    }
    window = (0.0, 0.0)
    if trace_window is not None:
        try:
            lo, hi = trace_window
        except (TypeError, ValueError):
            raise ValueError("trace_window must be (start_ns, end_ns), not {!r}".format(trace_window)) from None
        window = (0.0 if lo is None else float(lo), 0.0 if hi is None else float(hi))
        if not all(0.0 <= w < float("inf") for w in window) or (hi is not None and window[1] <= window[0]):
            raise ValueError("trace_window must be (start_ns, end_ns) with 0 <= start < end, not {!r}".format(trace_window))
    opts["trace_window"] = window
    return opts


def _input_arrays(inputs: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    if inputs is None:
        return {}
    if not isinstance(inputs, Mapping):
        raise TypeError("inputs must be a dict {{tensor name: array}}, not {}".format(type(inputs).__name__))
    import numpy as np

    arrays = {}
    for k, v in inputs.items():
        try:
            arrays[str(k)] = np.asarray(v)
        except (TypeError, ValueError) as e:
            raise TypeError("inputs[{!r}] must be an array, not {}: {}".format(k, type(v).__name__, e)) from None
        if arrays[str(k)].dtype == object:
            raise TypeError("inputs[{!r}] must be a numeric array, not {!r}".format(k, v))
    return arrays


def _simulate(kernel: "LoadedKernel", arrays: Dict[str, Any], opts: Dict[str, Any], overrides: Any,
              timing_only: bool, trace: Any, check: bool, progress: Any) -> Tuple[dict, "Profile"]:
    ovr = _overrides(overrides)
    # A trace of every slice needs every instruction simulated; one with a limit or a window only until it keeps no
    # more (past the window's end, the limit reached: Simulator::trace_closed).
    whole_trace = trace is not None and not opts.get("trace_limit") and not any(opts.get("trace_window", (0, 0)))
    if opts.get("fast_forward") and (not timing_only or whole_trace):
        raise ValueError("fast_forward needs timing_only=True, and a trace with trace_limit or trace_window (a whole "
                         "trace needs every instruction simulated)")
    # None: on wherever it applies (timing-only, no trace of every slice); the simulator also leaves it off for the
    # sanitizer, listeners and LNC=2 runs (Simulator::fast_forward_allowed).
    opts = dict(opts, fast_forward=bool(timing_only) and not whole_trace and opts.get("fast_forward") is not False)
    report, close = _progress_reporter(progress)
    try:
        outputs, stats, lines, config_yaml, reports, ff_loops = _call(
            kernel._handle.simulate, arrays, overrides=ovr, timing_only=bool(timing_only),
            trace_path=os.fspath(trace) if trace is not None else "", check=bool(check), progress=report, **opts)
    finally:
        close()
    prof = Profile(kernel._text if kernel._text is not None else kernel.to_json, stats, lines, config_yaml,
                   config=opts["config"], timing_only=timing_only, overrides=ovr)
    prof.check_reports = list(reports)
    prof.fast_forward_loops = list(ff_loops)
    return dict(outputs), prof


class LoadedKernel:
    """A kernel read once into nsim's IR (``nsim.load_kernel``) and simulated any number of times — one
    kernel over many configurations (a sweep) reads its kernel.json once. ``simulate`` takes the arguments
    of ``nsim.simulate_json`` (without the kernel) and returns the same ``(outputs, Profile)``; runs are
    independent (the IR is only read), so repeated runs give identical results."""

    def __init__(self, kernel: KernelLike):
        #: the kernel.json text it was read from (None: a dict's, written by to_json() when asked for)
        self._text: Optional[str] = None
        self._dict: Optional[dict] = None
        if isinstance(kernel, dict):
            # A dict (the tracer's) goes to C++ as Python objects, without its JSON text (issue 12); the
            # few dicts json.dumps would write differently (non-string keys, NaN, ...) take the text path.
            self.filename = "<dict>"
            self._handle = _call(_nsim.Kernel.from_object, kernel, _json_default, self.filename)
            if self._handle is not None:
                self._dict = kernel  # not copied: to_json() writes it when first asked
                return
        text, fname = _kernel_text(kernel)
        self._handle = _call(_nsim.Kernel, text, fname)
        self._text = text
        self.filename = fname

    @property
    def name(self) -> str:
        """The kernel's name (kernel.json ``name``)."""
        return self._handle.name

    def simulate(self, *, inputs: Optional[Mapping[str, Any]] = None, config: str = "trn2",
                 overrides: Union[None, Mapping[str, Any], Sequence[str]] = None, timing_only: bool = False,
                 trace: Union[None, str, "os.PathLike[str]"] = None, seed: int = 0,
                 trace_limit: Optional[int] = None,
                 trace_window: Optional[Tuple[Optional[float], Optional[float]]] = None,
                 check: bool = False,
                 max_instructions: Optional[int] = None,
                 max_sim_time_ns: Optional[float] = None,
                 progress: Union[None, bool, Callable[[int, float], Any]] = None,
                 fast_forward: Optional[bool] = None) -> Tuple[dict, "Profile"]:
        """Simulate this kernel: the arguments and result of ``nsim.simulate_json`` (see there)."""
        opts = _run_options(config, seed, trace_limit, max_instructions, max_sim_time_ns, trace_window, fast_forward)
        return _simulate(self, _input_arrays(inputs), opts, overrides, timing_only, trace, check, progress)

    def check(self, *, config: str = "trn2", overrides: Union[None, Mapping[str, Any], Sequence[str]] = None) -> None:
        """Verify the kernel for a configuration (as ``nsim.check_json``); raises an NsimError subclass."""
        _call(self._handle.check, _check_str(config, "config"), _overrides(overrides))

    def to_json(self) -> str:
        """The kernel.json text: the text it was read from, or the dict's text (json.dumps, written when first
        asked for: the dict is not copied, so write it before changing the dict)."""
        if self._text is None:
            self._text = _kernel_text(self._dict)[0] if self._dict is not None else _call(self._handle.to_json)
            self._dict = None
        return self._text

    def __repr__(self) -> str:
        return "<nsim.LoadedKernel {} from {}>".format(self.name or "kernel", self.filename)


def load_kernel(kernel: KernelLike) -> LoadedKernel:
    """Read a kernel.json (dict, JSON text or path) once; ``.simulate(config=..., ...)`` then runs it without
    reading the text again (docs/kernel-json.md, "Loading a kernel once"). A LoadedKernel is returned as it is.
    Errors in the kernel.json raise the NsimError subclasses ``simulate_json`` raises."""
    if isinstance(kernel, LoadedKernel):
        return kernel
    return LoadedKernel(kernel)


def simulate_json(kernel: Union[KernelLike, LoadedKernel], *, inputs: Optional[Mapping[str, Any]] = None,
                  config: str = "trn2",
                  overrides: Union[None, Mapping[str, Any], Sequence[str]] = None, timing_only: bool = False,
                  trace: Union[None, str, "os.PathLike[str]"] = None, seed: int = 0,
                  trace_limit: Optional[int] = None,
                  trace_window: Optional[Tuple[Optional[float], Optional[float]]] = None,
                  check: bool = False,
                  max_instructions: Optional[int] = None,
                  max_sim_time_ns: Optional[float] = None,
                  progress: Union[None, bool, Callable[[int, float], Any]] = None,
                  fast_forward: Optional[bool] = None) -> Tuple[dict, Profile]:
    """Simulate a kernel.json (dict, JSON text, path or ``nsim.load_kernel`` result) on one NeuronCore, or on the two physical cores of
    an LNC=2 launch when the kernel.json declares ``"cores": 2`` (docs/lnc.md; ``kernel[2].to_json(...)``).

    inputs: {tensor name: array}; arrays are converted to the tensor dtype (ml_dtypes arrays of the
    same dtype are taken bit-exactly); inputs not given are seeded random (`seed`), as in `nsim run`.
    Returns (outputs {name: numpy array of the tensor dtype; bf16/fp8 as ml_dtypes}, Profile).
    With timing_only the numerics are skipped and outputs is empty.
    trace: path of a trace to write (Chrome JSON; Perfetto protobuf when it ends in .pftrace). trace_limit: write only the N earliest slices
    (None or 0 = all). trace_window: (start_ns, end_ns), write only slices overlapping [start, end),
    kept whole; either side may be None (open). A trace cut by either ends with an instant event that
    gives the number of slices dropped (docs/profiling.md).
    check: run the sanitizer (docs/debugging.md); its reports are in ``Profile.check_reports`` (dicts).
    max_instructions / max_sim_time_ns: stop with ResourceLimit (E416, a KernelError) when the run exceeds this many
    instructions / this simulated time (None or 0 = no limit).
    progress: for long runs. A callable is called as ``progress(instructions, simulated_ns)`` once the run
    takes over 2 s, then about once a second and once more at the end (counts increase); True shows a
    tqdm bar when tqdm is installed, else a line on stderr; None/False: nothing (the default). Runs of
    an LNC=2 launch report no progress.
    fast_forward: None (the default) = on wherever it applies: with timing_only (and no trace, or a trace with
    trace_limit or trace_window: iterations are then skipped only past its window's end or its limit), once a loop's
    iterations repeat exactly (the engines and DMA queues in the same state relative to the run's end, each
    iteration adding the same time), its middle iterations are counted as repeats of those simulated instead of
    being simulated: long loops run in a fraction of the time, with the full simulation's stats
    (docs/timing-model.md, "Fast-forward"); a loop that reads and writes an HBM tensor through different
    accesses (a recurrence, ``y[b + 1] = f(y[b])``) is simulated whole. ``fast_forward.skipped_instructions``
    counts what was skipped. False simulates every instruction; True asks for it (ValueError without timing_only,
    or with a trace of every slice).
    Bad arguments raise TypeError / ValueError naming the argument; everything else is an NsimError.
    """
    opts = _run_options(config, seed, trace_limit, max_instructions, max_sim_time_ns, trace_window, fast_forward)
    if inputs is not None and not isinstance(inputs, Mapping):
        raise TypeError("inputs must be a dict {{tensor name: array}}, not {}".format(type(inputs).__name__))
    loaded = load_kernel(kernel)
    return _simulate(loaded, _input_arrays(inputs), opts, overrides, timing_only, trace, check, progress)


def check_json(kernel: KernelLike, *, config: str = "trn2",
               overrides: Union[None, Mapping[str, Any], Sequence[str]] = None) -> None:
    """Parse and verify a kernel.json for a configuration; raises an NsimError subclass."""
    config = _check_str(config, "config")
    text, fname = _kernel_text(kernel)
    _call(_nsim.check_kernel, text, config=config, overrides=_overrides(overrides), filename=fname)


def disasm_json(kernel: KernelLike, *, config: str = "trn2",
                overrides: Union[None, Mapping[str, Any], Sequence[str]] = None, limit: int = -1) -> List[str]:
    """The lowered instruction stream, one line per instruction with its source location."""
    config = _check_str(config, "config")
    limit = _check_int(limit, "limit", -1, 2 ** 63 - 1)
    text, fname = _kernel_text(kernel)
    return _call(_nsim.disasm, text, config=config, overrides=_overrides(overrides), limit=int(limit), filename=fname)


def effective_config(config: str = "trn2", overrides: Union[None, Mapping[str, Any], Sequence[str]] = None) -> str:
    """The effective configuration (preset inheritance + overrides) as YAML."""
    config = _check_str(config, "config")
    return _call(_nsim.effective_config, config, _overrides(overrides))


def op_table() -> List[dict]:
    """The ISA: one dict per opcode {name, engines, default_engine, cost_class, slots: [...]}."""
    return _nsim.op_table()


def alu_ops() -> List[str]:
    return _nsim.alu_ops()


def act_funcs() -> List[str]:
    return _nsim.act_funcs()


def dtypes() -> List[str]:
    return _nsim.dtypes()


def version() -> str:
    return _nsim.version()

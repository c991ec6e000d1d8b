"""Bottleneck analysis of a kernel (`nsim analyze`, `Profile.analyze()`).

    import nsim
    a = nsim.analyze("examples/softmax_2x128x512.json")      # or profile.analyze()
    print(a)                                                 # the text report
    a.bottleneck, a.bounds, a.findings                       # the same as data
    a.finding("redundant_dma")                               # one finding (dict) or None

The kernel is simulated timing-only with the analyzer of the C++ core; docs/profiling.md explains
each section and how the savings are estimated.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from nsim import _core

__all__ = ["Analysis", "analyze"]


class Analysis:
    """The analysis report of one kernel on one configuration.

    text        the readable report (also str(analysis))
    data        the JSON report as a dict: kernel, config, total_time_ns, instructions, bottleneck,
                top_share_percent, tensor_useful_ns (TensorE's model FLOPs at the PE array's peak),
                bounds [{name, ns, what}], idle [{engine, busy_ns, wait_ns, other_wait_ns, tail_ns,
                waited_on {track: ns}}], critical_path {available, by_track {track: ns}, lines [...]},
                findings [{kind, title, detail, saving_ns, method, metrics {..}, lines [{src, file,
                line, function, stack, count, ns, note}]}] (largest saving first; method: "bound",
                "re-simulated (...)", or "bound; re-simulated (...): T ns saves only S ns" when the re-simulation saves
                less than the bound)
    """

    def __init__(self, text: str, json_text: str):
        self.text = text
        self.data: Dict[str, Any] = json.loads(json_text)

    @property
    def total_time_ns(self) -> float:
        return float(self.data["total_time_ns"])

    @property
    def bottleneck(self) -> str:
        return str(self.data["bottleneck"])

    @property
    def bounds(self) -> Dict[str, float]:
        """{bound name: ns}, largest first."""
        return {b["name"]: float(b["ns"]) for b in self.data["bounds"]}

    @property
    def findings(self) -> List[dict]:
        return list(self.data["findings"])

    @property
    def idle(self) -> Dict[str, dict]:
        """{engine: {busy_ns, wait_ns, other_wait_ns, tail_ns, waited_on}}."""
        return {e["engine"]: e for e in self.data["idle"]}

    def finding(self, kind: str) -> Optional[dict]:
        """The finding of this kind (dma_efficiency, redundant_dma, hbm_roundtrip, single_buffer,
        split_reduce, fold_into_activation, act_table_switch, recomputed_value, psum_accumulation, pe_underfill,
        fp32_matmul, pe_transpose, pe_broadcast, engine_bound, serialization, lnc_imbalance), or None."""
        for f in self.data["findings"]:
            if f["kind"] == kind:
                return f
        return None

    def to_json(self) -> str:
        return json.dumps(self.data, indent=1)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        kinds = ", ".join(f["kind"] for f in self.data["findings"]) or "no findings"
        return "<nsim.Analysis {} on {}: {:.1f} ns, bottleneck {}, {}>".format(
            self.data.get("kernel") or "kernel", self.data.get("config", ""), self.total_time_ns, self.bottleneck, kinds)


def analyze(kernel: _core.KernelLike, *, config: str = "trn2",
            overrides: Union[None, Mapping[str, Any], Sequence[str]] = None, max_lines: int = 5) -> Analysis:
    """Analyse a kernel.json (dict, JSON text or path): simulate it timing-only with the analyzer."""
    text, fname = _core._kernel_text(kernel)
    report, js = _core._call(_core._nsim.analyze_kernel, text, config=config, overrides=_core._overrides(overrides),
                             filename=fname, max_lines=int(max_lines))
    return Analysis(report, js)

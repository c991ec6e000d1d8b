"""examples/defects: on each defect/fix pair the analyzer's top finding names the defect and a line
marked `# DEFECT`, its estimated saving is within 2x of the saving the fix measures, and the fix removes
the finding (issue: a profiler you can trust)."""
import sys
from pathlib import Path

import pytest

from conftest import require_core  # noqa: E402

_core, _ = require_core()

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "defects"))
import pairs as P  # noqa: E402


@pytest.mark.parametrize("pair", P.PAIRS, ids=lambda p: p.kind)
def test_pair(pair):
    m = P.measure(pair)
    top = m["top"]
    assert top is not None and top["kind"] == pair.kind, (pair.name, top)
    assert P.top_line(top) in m["defect_lines"], (pair.name, top["lines"][:2], m["defect_lines"])
    assert m["saved_ns"] > 0, pair.name
    assert m["saved_ns"] / 2 <= top["saving_ns"] <= 2 * m["saved_ns"], (pair.name, top["saving_ns"], m["saved_ns"])
    after = m["after_finding"]
    assert after is None or after["saving_ns"] < top["saving_ns"] / 4, (pair.name, after)


def test_psum_pair_numerics():
    """The PSUM single-buffer pair computes relu(xT^T @ w) either way (bf16 output, fp32 PSUM accumulation)."""
    import numpy as np
    from conftest import run_clean
    pair = next(p for p in P.PAIRS if p.kind == "single_buffer" and "PSUM" in p.name)
    xT, w = (a[:, :1024] for a in pair.inputs())  # (K = 256) x 1024 by (K = 256) x 1024: 8 x 2 output blocks
    want = np.maximum(xT.astype(np.float64).T @ w.astype(np.float64), 0)
    # (the one-tile kernel reuses its PSUM tile across affine_range iterations: the sanitizer's NSIM-W504 says so)
    with pytest.warns(UserWarning, match="NSIM-W504"):
        before = pair.before(xT, w)
    for got in (before, run_clean(pair.after, xT, w)):
        got = np.asarray(got, np.float64)
        assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()

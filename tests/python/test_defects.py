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

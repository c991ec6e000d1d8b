"""docs/nki-coverage.md is the output of ``python -m nsim.nki._coverage`` on the spec (skipped when the spec,
``../shared/spec/nki-api.md`` beside the repository, is absent)."""
import os

import pytest

from nsim.nki import _coverage

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "nki-coverage.md")


def _spec_text():
    path = _coverage.default_spec()
    if not os.path.isfile(path):
        pytest.skip("the NKI API spec is not available at {}".format(path))
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_coverage_doc_is_up_to_date():
    text = _spec_text()
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    assert doc == _coverage.render(text), ("docs/nki-coverage.md is stale: regenerate it with "
                                           "`python -m nsim.nki._coverage --out docs/nki-coverage.md`")


def test_every_gap_has_a_reason_and_tiers_1_2_are_complete():
    rows = _coverage.table(_spec_text())
    assert len(rows) > 150
    for group, name, tier, st in rows:
        for d, s in st.items():
            assert s != "missing", "{} {} ({}) is neither implemented nor given a reason".format(group, name, d)
            if s.startswith("not supported"):
                assert len(s) > len("not supported: ") + 10
            if group == "nki.isa" and tier in ("1", "2"):
                assert s == "implemented", (name, d, s)


def test_tier3_and_24_reach_90_percent_in_both_dialects():
    # Issue 10: >= 90 % of Tier 3 and §2.4 implemented in both dialects where they exist; a name the spec
    # says NKI itself does not support (builtin_custom_op) is not counted, and raises NotSupportedError.
    imp, total = _coverage.tier3_and_24(_coverage.table(_spec_text()))
    assert total >= 20
    assert imp >= 0.9 * total, "{}/{} of Tier 3 and §2.4 implemented".format(imp, total)

"""The fuzz harness (tests/fuzz/fuzz.py) and its regression corpus: every input that ever made nsim
crash, hang, raise an internal (E901) or uncoded error, or trip a sanitizer is kept in
tests/fuzz/regressions/ and must now end as exit 0 or a coded user error."""
import glob
import importlib.util
import json
import os

import pytest

from conftest import NSIM_BIN, REPO_ROOT, require_core

require_core()

_spec = importlib.util.spec_from_file_location("nsim_fuzz", os.path.join(REPO_ROOT, "tests", "fuzz", "fuzz.py"))
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)

REGRESSIONS = sorted(glob.glob(os.path.join(REPO_ROOT, "tests", "fuzz", "regressions", "*.json")))


def test_the_regression_corpus_is_not_empty():
    assert len(REGRESSIONS) >= 5


def test_every_regression_input_is_ok_or_a_coded_user_error():
    if not os.path.exists(NSIM_BIN):
        pytest.skip("nsim binary not built")
    results = fuzz.replay(REGRESSIONS, NSIM_BIN, timeout=60)
    assert len(results) == len(REGRESSIONS)
    bad = [(os.path.basename(p), o, d) for p, o, d in results if o in fuzz.FAILURES]
    assert not bad
    # Where a regression names the code it must now get, it gets it.
    by_path = {p: (o, d) for p, o, d in results}
    for p in REGRESSIONS:
        with open(p) as f:
            want = json.load(f).get("expect")
        if want:
            outcome, detail = by_path[p]
            assert (outcome == "ok") if want == "ok" else (want in detail), (os.path.basename(p), outcome, detail)


def test_the_seed_corpus_runs_clean():
    for p in sorted(glob.glob(os.path.join(REPO_ROOT, "tests", "fuzz", "corpus", "*.json"))):
        with open(p) as f:
            case = {"kind": "kernel", "kernel": f.read(), "timing_only": True}
        assert fuzz.execute(case, NSIM_BIN, 60) == ("ok", ""), p


@pytest.mark.parametrize("rc,stderr,outcome", [
    (0, "", "ok"),
    (2, "NSIM-E101: unknown config key", "user_error"),
    (1, "NSIM-E901: internal error: vector::_M_default_append", "internal"),
    (1, "terminate called after throwing", "uncoded"),
    (-11, "", "crash"),
    (2, "x.cpp:3:5: runtime error: signed integer overflow", "sanitizer"),
    (1, "==1==ERROR: AddressSanitizer: heap-buffer-overflow", "sanitizer"),
])
def test_outcome_classification(rc, stderr, outcome):
    assert fuzz.classify_cli(rc, stderr)[0] == outcome


def test_a_short_campaign_runs_and_classifies_every_input(tmp_path):
    summary = tmp_path / "summary.json"
    rc = fuzz.main(["run", "--max-inputs", "60", "--time", "600", "--seed", "1", "--cli-fraction", "0.1",
                    "--nsim", NSIM_BIN, "--out", str(tmp_path / "findings"), "--summary", str(summary)])
    s = json.loads(summary.read_text())
    assert s["inputs"] == 60 and sum(s["outcomes"].values()) == 60
    assert s["outcomes"]["user_error"] > 0  # mutants are mostly refused, with a code
    assert rc == 0, s

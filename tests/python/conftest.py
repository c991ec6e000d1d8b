"""Shared fixtures of the Python tests: repository paths and the nsim CLI binary."""
import os
import sys

import pytest

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES_DIR = os.path.join(REPO_ROOT, "examples")
# The CLI under test: $NSIM_BIN (another build directory), else build/nsim.
NSIM_BIN = os.environ.get("NSIM_BIN") or os.path.join(REPO_ROOT, "build", "nsim")
PRESETS = ("trn1", "trn2", "trn3")

# examples/gen_examples.py and examples/reference.py are plain scripts, not a package.
if EXAMPLES_DIR not in sys.path:
    sys.path.insert(0, EXAMPLES_DIR)


@pytest.fixture(scope="session")
def repo_root():
    return REPO_ROOT


@pytest.fixture(scope="session")
def examples_dir():
    return EXAMPLES_DIR


@pytest.fixture(scope="session")
def nsim_bin():
    """Path of the built CLI; skips the test when it has not been built."""
    if not (os.path.isfile(NSIM_BIN) and os.access(NSIM_BIN, os.X_OK)):
        pytest.skip("{} not built (cmake --build build --target nsim)".format(NSIM_BIN))
    return NSIM_BIN

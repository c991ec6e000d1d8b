"""Built binaries find the presets relative to themselves (issue 15): a moved build dir or an installed
binary works without $NSIM_CONFIGS_DIR. Each test copies a binary and a marked copy of configs/ into a
temporary folder (named "nsim", under a path with a space) and checks the marked copy is the one read."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import NSIM_BIN, REPO_ROOT

CONFIGS = os.path.join(REPO_ROOT, "configs")
MARK = "trn2-relocated"


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "NSIM_CONFIGS_DIR"}
    env.update(extra)
    return env


def _marked_configs(dest, mark=MARK):
    """configs/*.yaml copied to `dest`, trn2's name changed to `mark`."""
    os.makedirs(dest)
    for f in os.listdir(CONFIGS):
        if f.endswith(".yaml"):
            shutil.copy(os.path.join(CONFIGS, f), dest)
    path = os.path.join(dest, "trn2.yaml")
    with open(path) as fh:
        text = fh.read()
    text, n = re.subn(r"^name:\s+trn2\b", "name: " + mark, text, flags=re.M)
    assert n == 1
    with open(path, "w") as fh:
        fh.write(text)
    return dest


@pytest.fixture
def root(tmp_path):
    d = tmp_path / "path with space" / "nsim"
    d.mkdir(parents=True)
    return str(d)


def _config_name(nsim, env):
    r = subprocess.run([nsim, "config", "trn2"], capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode == 0, r.stderr
    m = re.search(r"^name:\s*(\S+)", r.stdout, flags=re.M)
    assert m, r.stdout
    return m.group(1)


# binary location -> presets location, both relative to the copy's root (see sim/config.cpp)
LAYOUTS = [
    ("nsim", "configs"),                       # a moved build dir (the build copies configs/ into it)
    ("bin/nsim", "configs"),                   # <exe_dir>/../configs
    ("bin/nsim", "share/nsim/configs"),        # an installed binary: <prefix>/bin, <prefix>/share/nsim
]


@pytest.mark.parametrize("exe,configs", LAYOUTS)
def test_cli_finds_presets_next_to_itself(nsim_bin, root, exe, configs):
    exe = os.path.join(root, exe)
    os.makedirs(os.path.dirname(exe), exist_ok=True)
    shutil.copy2(nsim_bin, exe)
    _marked_configs(os.path.join(root, configs))
    assert _config_name(exe, _env()) == MARK


def test_env_wins_over_presets_next_to_binary(nsim_bin, root):
    exe = os.path.join(root, "nsim")
    shutil.copy2(nsim_bin, exe)
    _marked_configs(os.path.join(root, "configs"))
    other = _marked_configs(os.path.join(root, "other"), mark="trn2-from-env")
    assert _config_name(exe, _env(NSIM_CONFIGS_DIR=other)) == "trn2-from-env"


def test_build_dir_carries_presets(nsim_bin):
    """The build copies configs/ next to the CLI, so moving the build dir keeps the presets."""
    copy = os.path.join(os.path.dirname(os.path.abspath(nsim_bin)), "configs")
    for f in os.listdir(CONFIGS):
        if f.endswith(".yaml"):
            assert os.path.isfile(os.path.join(copy, f)), f


def test_python_module_finds_presets_next_to_itself(root):
    """The _nsim module looks next to its own shared object (dladdr), not next to the python binary."""
    try:
        from nsim import _core
    except ImportError as e:
        pytest.skip("nsim._core not importable: {}".format(e))
    so = getattr(_core._nsim, "__file__", None)
    if not so or not os.path.isfile(so):
        pytest.skip("the _nsim extension is not built")
    pydir = os.path.join(root, "python")  # like build/python: presets in <so_dir>/../configs
    os.makedirs(pydir)
    shutil.copy2(so, pydir)
    _marked_configs(os.path.join(root, "configs"))
    code = "import _nsim, re; print(re.search(r'^name:\\s*(\\S+)', _nsim.effective_config('trn2'), re.M).group(1))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                       env=_env(PYTHONPATH=pydir))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == MARK

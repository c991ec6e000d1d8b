"""The error-code table (sim/errors.def through _nsim.error_codes()): the Python view, the exception
class of each family, the generated docs/errors.md, and that no source outside the table types a code."""
import ast
import os
import re

import numpy as np
import pytest

import nsim
from nsim import _core, _errors, _errors_doc, tracer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "python", "nsim")
# Source folders of the C++ core, the bindings and the Python package (tests/ may name codes in assertions).
SOURCE_DIRS = ("sim", "isa", "memory", "engines", "frontend", os.path.join("python", "src"), os.path.join("python", "nsim"),
               "benchmarks")
SOURCE_EXTS = (".h", ".cpp", ".def", ".py")
TABLE_FILE = os.path.join("sim", "errors.def")


def test_table_rows_are_unique_and_complete():
    assert len(_errors.TABLE) > 0
    codes = [r["code"] for r in _errors.TABLE]
    names = [r["name"] for r in _errors.TABLE]
    assert len(set(codes)) == len(codes)
    assert len(set(names)) == len(names)
    for r in _errors.TABLE:
        assert re.fullmatch(r"NSIM-E\d{3}", r["code"]), r
        assert r["meaning"] and r["hint"], r


def test_every_family_has_an_exception_class():
    assert set(_core.FAMILY_CLASSES) == {r["family"] for r in _errors.TABLE}
    for cls in _core.FAMILY_CLASSES.values():
        assert issubclass(cls, nsim.NsimError)
    assert issubclass(_core.NotSupportedError, nsim.KernelError)


@pytest.mark.parametrize("name,cls", [("BadReshape", _core.KernelValidationError), ("BadIndex", nsim.KernelError),
                                      ("NotSupported", _core.NotSupportedError),
                                      ("BadOperandKind", nsim.OperandError), ("ConfigBadValue", nsim.ConfigError),
                                      ("Internal", nsim.InternalError)])
def test_make_error_takes_code_and_class_from_the_table(name, cls):
    e = tracer.make_error(name, "msg", loc={})
    assert type(e) is cls
    assert e.code == _errors.BY_NAME[name]["code"]
    assert str(e) == "{}: msg".format(e.code)


def test_spec_exception_classes():
    """nki-api.md 4.1: hardware-constraint violations are NkiValidationError, an AssertionError (what the AWS
    simulator raises); an access out of bounds is also an IndexError; a tile used as a bool is a ValueError."""
    import nsim.nki.isa as nisa
    from nsim.nki.beta1 import isa as b1isa
    assert nisa.NkiValidationError is nsim.NkiValidationError is b1isa.NkiValidationError
    assert issubclass(nsim.NkiValidationError, AssertionError)
    assert set(_core.CODE_CLASSES) <= set(_errors.BY_NAME)
    for name, bases in [("OutOfBounds", (AssertionError, IndexError, nsim.AccessError)),
                        ("IndexOutOfBounds", (AssertionError, IndexError, nsim.KernelError)),
                        ("TooManyPartitions", (nsim.NkiValidationError,)), ("BadDtype", (nsim.NkiValidationError,)),
                        ("PartitionMismatch", (nsim.NkiValidationError,)), ("BadView", (nsim.NkiValidationError,)),
                        ("TensorTruthValue", (ValueError, nsim.KernelError)),
                        ("TensorNotIterable", (TypeError, nsim.KernelError))]:
        cls = nsim.error_class(_errors.code(name))
        assert all(issubclass(cls, b) for b in bases), (name, cls.__mro__)
    # the codes of files, command lines and configurations are not hardware rules
    for name in ("JsonSyntax", "Usage", "ConfigUnknownKey", "BadIndex", "Internal"):
        assert not issubclass(nsim.error_class(_errors.code(name)), AssertionError), name


def test_spec_exception_classes_from_a_kernel():
    """What a test written against the AWS simulator catches: a static index out of bounds as IndexError and
    NkiValidationError, 256 partitions as AssertionError, a tile in an ``if`` as ValueError (with nsim's code)."""
    import nsim.nki as nki
    import nsim.nki.isa as nisa
    import nsim.nki.language as nl

    @nki.jit
    def oob(a):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[0:128, 0:64])
        nisa.dma_copy(dst=out, src=t[:, 8:72])
        return out

    @nki.jit
    def parts(a):
        t = nl.ndarray((256, 64), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        return a

    @nki.jit
    def truth(a):
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        if t:
            pass
        return a

    a = np.zeros((128, 64), np.float32)
    with pytest.raises(IndexError) as e:
        oob(a)
    assert isinstance(e.value, nisa.NkiValidationError) and e.value.code == _errors.code("IndexOutOfBounds")
    with pytest.raises(AssertionError) as e:
        parts(a)
    assert isinstance(e.value, nsim.NsimError)
    with pytest.raises(ValueError) as e:
        truth(a)
    assert e.value.code == _errors.code("TensorTruthValue")


def test_unknown_error_name_is_rejected():
    with pytest.raises(LookupError):
        _errors.code("NoSuchError")


def test_default_code_is_internal():
    assert nsim.NsimError("x").code == _errors.code("Internal")


def _py_files():
    for d, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                yield os.path.join(d, f)


def _error_names_used(path):
    """(line, first argument) of every make_error(...) / _errors.code(...) call in a Python file."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        fname = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        owner = fn.value.id if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) else ""
        if fname == "make_error" or (fname == "code" and owner == "_errors"):
            arg = node.args[0] if node.args else None
            if (isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Name) and arg.value.id == "broken"):
                yield node.lineno, "<from _nsim>"  # a rule's result: the name of a row (error_info in C++)
                continue
            yield node.lineno, arg.value if isinstance(arg, ast.Constant) else None


def test_every_error_name_in_the_package_is_in_the_table():
    bad, count = [], 0
    for path in _py_files():
        for line, name in _error_names_used(path):
            if path.endswith(os.path.join("nsim", "tracer.py")) and name is None:
                continue  # make_error's own definition forwards its argument
            count += 1
            if name == "<from _nsim>":
                continue
            if name not in _errors.BY_NAME:
                bad.append("{}:{}: {!r}".format(os.path.relpath(path, ROOT), line, name))
    assert count > 100  # the scan sees the package's raises
    assert not bad, "error names that are not rows of sim/errors.def:\n" + "\n".join(bad)


def test_no_source_outside_the_table_types_an_error_code():
    found = []
    for d in SOURCE_DIRS:
        for dirpath, _, files in os.walk(os.path.join(ROOT, d)):
            for f in files:
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, ROOT)
                if not f.endswith(SOURCE_EXTS) or rel == TABLE_FILE:
                    continue
                for i, line in enumerate(open(path, encoding="utf-8"), 1):
                    if re.search(r"NSIM-E\d|\"NSIM-E", line):  # a code, or a quoted code pattern
                        found.append("{}:{}: {}".format(rel, i, line.strip()))
    assert not found, "error codes typed outside sim/errors.def:\n" + "\n".join(found)


def test_docs_errors_md_is_generated_from_the_table():
    with open(_errors_doc.DOC, encoding="utf-8") as f:
        current = f.read()
    assert _errors_doc.MARKER in current
    assert _errors_doc.render(current) == current, "docs/errors.md is out of date: run python -m nsim._errors_doc"
    for r in _errors.TABLE:
        assert "| {} | {} |".format(r["code"], r["name"]) in current


def test_errors_say_what_fixes_them():
    """Every error carries its table row's fix hint: Python as ``.hint`` and a traceback note, the CLI as a
    ``fix:`` line after the message."""
    from nsim import nki
    import nsim.nki.language as nl

    @nki.jit
    def k(a):
        return nl.load(a.reshape((3, -1)))  # 1024 elements do not split into 3 rows

    with pytest.raises(_core.NsimError) as e:
        k(__import__("numpy").zeros((128, 8), "float32"))
    row = _errors.BY_CODE[e.value.code]
    assert row["name"] == "BadReshape" and e.value.hint == row["hint"] != ""
    if hasattr(e.value, "add_note"):  # Python 3.11+: shown under the message in the traceback
        assert e.value.__notes__ == ["fix: " + row["hint"]]
    assert str(e.value).startswith(e.value.code)  # the message itself is unchanged

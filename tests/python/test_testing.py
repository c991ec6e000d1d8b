"""nsim.testing.assert_kernel_matches: passes on a correct kernel, explains a wrong one."""
import numpy as np
import pytest

nsim = pytest.importorskip("nsim")
if not getattr(nsim, "core_available", False):
    pytest.skip("the _nsim extension is not built", allow_module_level=True)

from nsim import nki  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402
from nsim.testing import assert_kernel_matches, compare_arrays  # noqa: E402


@nki.jit
def scale_add(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    ta = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    nisa.tensor_scalar(dst=ta, data=ta, op0=nl.multiply, operand0=2.0)
    nisa.tensor_tensor(dst=ta, data1=ta, data2=tb, op=nl.add)
    nisa.dma_copy(dst=out, src=ta)
    return out


def test_matching_kernel_passes_on_every_preset():
    a = np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)
    b = np.ones((128, 64), np.float32)
    for cfg in ("trn1", "trn2", "trn3"):
        out = assert_kernel_matches(scale_add, lambda a, b: 2 * a + b, a, b, config=cfg)
        np.testing.assert_allclose(out, 2 * a + b, rtol=1e-6)


def test_mismatch_reports_output_errors_and_first_index():
    a = np.zeros((128, 64), np.float32)
    b = np.ones((128, 64), np.float32)

    def wrong(a, b):
        r = 2 * a + b
        r[3, 5] = 7.0
        r[100, 0] = -1.0
        return r

    with pytest.raises(AssertionError) as e:
        assert_kernel_matches(scale_add, wrong, a, b)
    msg = str(e.value)
    assert "2 of 8192 elements differ" in msg
    assert "first mismatch at index (3, 5): got 1.0, expected 7.0" in msg
    assert "max abs error 6" in msg


def test_nan_location_is_reported():
    got = np.array([[1.0, np.nan, 2.0]], np.float32)
    want = np.array([[1.0, 1.0, 2.0]], np.float32)
    report = compare_arrays("y", got, want, 1e-5, 1e-5)
    assert "NaN/Inf first appears at index (0, 1)" in report
    assert compare_arrays("y", want, want, 1e-5, 1e-5) == ""

"""The nki-samples vision kernels (``select_and_scatter_kernel`` and ``resize_nearest_fixed_dma_kernel``,
tests/python/kernels/nki_samples_vision.py, sample code as the sample writes it) run through ``nsim.compat``:
their outputs against numpy written here (float32 and bfloat16, a partial last partition tile, ties inside a
window, a non-integer resize scale), and the instruction counts their structure implies. The max-pool windows
``padded_operand[i_p, 2 * i_h + i_kh, 2 * i_w + i_kw]`` overlap (3x3, stride 2): nsim reads them as one strided
view (kernel.json ``"strides"``), as the hardware's access patterns do."""
import numpy as np
import pytest

from conftest import executed_ops, require_core, sample_fixture  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, rounded  # noqa: E402

BF16 = ml_dtypes.bfloat16


vs = sample_fixture("nki_samples_vision.py")


def reference_select_and_scatter(operand, source):
    """Max-pool backward, window 3x3, stride 2, padding 1 on every side (padding never selected): each source
    value is added at the first maximum (row-major) of its window. Float64."""
    n, c, h, w = operand.shape
    sh, sw = source.shape[2:]
    xp = np.full((n, c, h + 2, w + 2), -np.inf)
    xp[:, :, 1:-1, 1:-1] = operand.astype(np.float64)
    out = np.zeros((n, c, h + 2, w + 2))
    ni, ci = np.arange(n)[:, None], np.arange(c)[None, :]
    for i in range(sh):
        for j in range(sw):
            first = xp[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].reshape(n, c, 9).argmax(axis=-1)  # the first max
            out[ni, ci, 2 * i + first // 3, 2 * j + first % 3] += source[:, :, i, j].astype(np.float64)
    return out[:, :, 1:-1, 1:-1]


def reference_resize_nearest(x, out_h, out_w):
    """Nearest neighbour: output pixel (i, j) takes input pixel (i * in_h // out_h, j * in_w // out_w)."""
    _, in_h, in_w, _ = x.shape
    rows = np.arange(out_h) * in_h // out_h
    cols = np.arange(out_w) * in_w // out_w
    return x[:, rows][:, :, cols]


@pytest.mark.parametrize("n,c,h,dtype,ties", [
    (2, 64, 16, np.float32, False),   # one full 128-row tile (two images of 64 channels)
    (3, 50, 15, np.float32, False),   # 150 rows: a full tile and a masked one of 22 rows; odd h
    (2, 64, 14, np.float32, True),    # values from {0, 1, 2}: windows hold several maxima, the first is taken
    (4, 64, 12, BF16, False),         # bfloat16 in and out, computed in float32; two tiles
])
def test_select_and_scatter_matches_numpy(vs, n, c, h, dtype, ties):
    """The gradient of each window goes to its first maximum (where windows overlap the contributions add),
    nothing to the padding even where a window's values are all negative (standard normal inputs)."""
    mod = vs[0]
    rng = np.random.default_rng(n * 1000 + h)
    sh = (h + 2 - 3) // 2 + 1
    if ties:
        x = rng.integers(0, 3, (n, c, h, h)).astype(dtype)
    else:
        x = rng.standard_normal((n, c, h, h)).astype(dtype)
    s = rng.standard_normal((n, c, sh, sh)).astype(dtype)
    out = mod.select_and_scatter_kernel(x, s)
    assert out.shape == x.shape and out.dtype == np.dtype(dtype)
    want = reference_select_and_scatter(x, s)
    if dtype == BF16:
        want = rounded(want, BF16)  # float32 sums of bf16 values (at most 4 per element), stored as bf16
    close(np.asarray(out, np.float32), want, dtype)


def test_select_and_scatter_instruction_counts(vs):
    """150 rows = a full 128-row tile and a masked one of 22 rows. Per tile the sample issues 3 DMAs (load the
    operand into the padded tile, load the source, store the unpadded output) and one window max of the 3x3
    windows read in place (a single tensor_reduce over the overlapping strided view: no copy of the windows);
    then per window position (9) one equal, one scalar_tensor_tensor, one maximum, the update of ``selected``,
    the product with the source and the accumulating add: 6 VectorE instructions, 54 per tile. No TensorE.
    The masked tile moves 22 rows: its DMAs have partition dim 22."""
    mod = vs[0]
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 50, 8, 8)).astype(np.float32)
    s = rng.standard_normal((3, 50, 4, 4)).astype(np.float32)
    out = mod.select_and_scatter_kernel(x, s)
    close(np.asarray(out), reference_select_and_scatter(x, s))
    lines = open(mod.__file__).read().splitlines()
    ops = executed_ops(mod.select_and_scatter_kernel.last_json["body"])

    def line_of(text):
        return [i for i, t in enumerate(lines, 1) if text in t][0]

    dmas = [o for o in ops if o["op"] == "dma_copy"]
    assert len(dmas) == 2 * 3
    assert [o["loc"]["line"] for o in dmas] == [line_of("padded_operand[i_p, padding[0]"),
                                                line_of("source_tile = nl.load"),
                                                line_of("nl.store(out_rows")] * 2
    reduce = [o for o in ops if o["op"] == "tensor_reduce"]
    assert len(reduce) == 2 and all("strides" in o["data"] for o in reduce), reduce
    assert reduce[1]["data"]["index"][0] == {"start": 0, "size": 22}
    assert dmas[3]["dst"]["index"][0] == {"start": 0, "size": 22}  # the masked load of the second tile
    first, last = line_of("for kw in nl.sequential_range(sw_w)"), line_of("# (4) store the unpadded part")
    per_position = [o for o in ops if first <= o.get("loc", {}).get("line", 0) <= last]
    assert len(per_position) == 2 * 9 * 6, len(per_position)
    assert mod.select_and_scatter_kernel.last_profile.stat("engine.matmul_instruction_count") == 0


@pytest.mark.parametrize("b,in_hw,out_hw,c,dtype", [
    (1, (30, 20), (59, 38), 4, np.float32),   # the sample's docstring example: scales 30/59 and 20/38
    (2, (5, 4), (9, 7), 3, np.float32),
    (2, (6, 6), (4, 9), 8, BF16),             # shrinks the height, enlarges the width
])
def test_resize_nearest_matches_numpy(vs, b, in_hw, out_hw, c, dtype):
    mod = vs[0]
    rng = np.random.default_rng(sum(in_hw) + sum(out_hw))
    x = rng.standard_normal((b,) + in_hw + (c,)).astype(dtype)
    out = mod.resize_nearest_fixed_dma_kernel(x, (b,) + out_hw + (c,))
    assert out.shape == (b,) + out_hw + (c,) and out.dtype == np.dtype(dtype)
    # a copy: bit-exact
    np.testing.assert_array_equal(np.asarray(out, np.float32),
                                  np.asarray(reference_resize_nearest(x, *out_hw), np.float32))


def test_resize_nearest_is_one_load_and_one_store_per_pixel(vs):
    """The sample resizes with DMAs only: per batch and output pixel one load of its source pixel's ``c``
    channels ([1, c] tile) and one store, 2 x 2 x 9 x 7 = 252 DMAs of 3 x 4 bytes, no compute instruction."""
    mod = vs[0]
    x = np.arange(2 * 5 * 4 * 3, dtype=np.float32).reshape(2, 5, 4, 3)
    out = mod.resize_nearest_fixed_dma_kernel(x, (2, 9, 7, 3))
    np.testing.assert_array_equal(np.asarray(out), reference_resize_nearest(x, 9, 7))
    ops = executed_ops(mod.resize_nearest_fixed_dma_kernel.last_json["body"])
    assert [o["op"] for o in ops] == ["dma_copy"] * 252
    prof = mod.resize_nearest_fixed_dma_kernel.last_profile
    assert prof.stat("dma.descriptor_count") == 252
    assert sum(prof.stat("dma.engine{}.bytes".format(k)) for k in range(16)
               if "engine{}".format(k) in prof.stats["dma"]) == 252 * 3 * 4
    for eng in ("tensor", "vector", "scalar", "gpsimd"):
        assert prof.stat("engine.{}.instruction_count".format(eng)) == 0, eng

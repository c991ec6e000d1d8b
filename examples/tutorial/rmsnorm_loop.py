"""A kernel author's loop on nsim: write -> run -> profile -> find -> fix -> compare (docs/tutorial.md).

An RMSNorm written the way public NKI kernels are (Beta-1 dialect: `neuronxcc.nki`, `nl.load`/`nl.store`,
value-returning `nl.*` ops), in two versions: `rmsnorm_v1` loads the weight inside the row loop, as a
first draft often does; `rmsnorm_v2` is the fix the analyzer suggests (the load hoisted out of the loop, the broadcast with it).

    python examples/tutorial/rmsnorm_loop.py          # prints each step's numbers
"""
import numpy as np

from nsim import compat

compat.install()  # `import neuronxcc.nki` etc. resolve to nsim; the kernels below are unchanged NKI
import neuronxcc.nki as nki  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402

ROWS, COLS = 4096, 2048


@nki.jit
def rmsnorm_v1(a_tensor, g_tensor):
    out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    ix = nl.arange(128)[:, None]
    iw = nl.arange(1)[:, None]
    iy = nl.arange(a_tensor.shape[1])[None, :]
    for i in nl.affine_range(a_tensor.shape[0] // 128):
        g_tile = nl.load(g_tensor.reshape((1, g_tensor.shape[0]))[iw, iy])  # the weight, every iteration
        a_tile = nl.load(a_tensor[i * 128 + ix, iy])
        in_square = nl.square(a_tile)
        square_sum = nl.sum(in_square, axis=[1])
        mean = square_sum / a_tensor.shape[1]
        rms_reciprocal = nl.rsqrt(mean)
        out_tile = nl.multiply(a_tile, rms_reciprocal)
        g_bcast = g_tile.broadcast_to((128, g_tensor.shape[0]))
        out_tile[...] = nl.multiply(out_tile, g_bcast)
        nl.store(out_tensor[i * 128 + ix, iy], value=out_tile)
    return out_tensor


@nki.jit
def rmsnorm_v2(a_tensor, g_tensor):
    out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    ix = nl.arange(128)[:, None]
    iw = nl.arange(1)[:, None]
    iy = nl.arange(a_tensor.shape[1])[None, :]
    g_tile = nl.load(g_tensor.reshape((1, g_tensor.shape[0]))[iw, iy])  # hoisted: loaded once
    g_bcast = g_tile.broadcast_to((128, g_tensor.shape[0]))
    for i in nl.affine_range(a_tensor.shape[0] // 128):
        a_tile = nl.load(a_tensor[i * 128 + ix, iy])
        in_square = nl.square(a_tile)
        square_sum = nl.sum(in_square, axis=[1])
        mean = square_sum / a_tensor.shape[1]
        rms_reciprocal = nl.rsqrt(mean)
        out_tile = nl.multiply(a_tile, rms_reciprocal)
        out_tile[...] = nl.multiply(out_tile, g_bcast)
        nl.store(out_tensor[i * 128 + ix, iy], value=out_tile)
    return out_tensor


def reference(a, g):
    a32 = a.astype(np.float32)
    return a32 / np.sqrt(np.mean(a32 * a32, axis=1, keepdims=True)) * g.astype(np.float32)


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((ROWS, COLS)).astype(np.float32),
            rng.standard_normal(COLS).astype(np.float32))


def main():
    a, g = inputs()
    # 1. run: the kernel's output (checked against numpy) and its profile
    out1, prof1 = rmsnorm_v1.simulate(a, g)
    np.testing.assert_allclose(out1, reference(a, g), rtol=1e-4, atol=1e-4)
    print("v1: {:.1f} us, bound: {}".format(prof1.total_time_ns / 1e3, prof1.bound))
    # 2. profile: the findings, by estimated saving (causes before symptoms), each on its kernel line
    an = prof1.analyze()
    for f in an.findings:
        where = f["lines"][0] if f["lines"] else None
        print("  {:<14} ~{:6.1f} us  line {}: {}".format(f["kind"], f["saving_ns"] / 1e3,
                                                          where["line"] if where else "-", f["title"]))
    # 3. fix (v2) and compare
    out2, prof2 = rmsnorm_v2.simulate(a, g)
    np.testing.assert_allclose(out2, reference(a, g), rtol=1e-4, atol=1e-4)
    estimated = sum(f["saving_ns"] for f in an.findings if f["kind"] in ("pe_broadcast", "redundant_dma"))
    print("v2: {:.1f} us, bound: {}; saved {:.1f} us (the findings it addresses estimated {:.1f} us)".format(
        prof2.total_time_ns / 1e3, prof2.bound, (prof1.total_time_ns - prof2.total_time_ns) / 1e3, estimated / 1e3))
    print(prof1.compare(prof2, labels=("v1", "v2")).text.split("\n\nstat")[0])
    return prof1, prof2, an


if __name__ == "__main__":
    main()

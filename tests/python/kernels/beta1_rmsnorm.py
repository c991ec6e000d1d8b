"""Beta-1 RMSNorm tutorial kernel (``neuronxcc.nki``): masks for the row tail, a (1, F) weight broadcast
to the partitions, nl value functions. No nsim imports."""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def nki_rmsnorm_kernel(a_tensor, g_tensor):
    # a_tensor: (rows, F); g_tensor: (1, F) (the tutorial reshapes a 1-D g in the kernel)
    out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    num_rows = a_tensor.shape[0]

    ix = nl.arange(128)[:, None]
    iw = nl.arange(1)[:, None]
    iy = nl.arange(a_tensor.shape[1])[None, :]

    g_tile = nl.load(g_tensor[iw, iy])

    for i in nl.affine_range(math.ceil(a_tensor.shape[0] / 128)):
        a_tile = nl.load(a_tensor[i * 128 + ix, iy], mask=(i * 128 + ix < num_rows))

        in_square = nl.square(a_tile)
        square_sum = nl.sum(in_square, axis=[1])
        mean = square_sum / a_tensor.shape[1]
        rms_reciprocal = nl.rsqrt(mean)
        out_tile = nl.multiply(a_tile, rms_reciprocal)

        g_bcast = g_tile.broadcast_to((128, g_tensor.shape[1]))
        out_tile[...] = nl.multiply(out_tile, g_bcast, mask=(i * 128 + ix < num_rows))

        nl.store(out_tensor[i * 128 + ix, iy], value=out_tile, mask=(i * 128 + ix < num_rows))
    return out_tensor


def reference_rmsnorm(a, g):
    a32 = a.astype(np.float32)
    r = a32 / np.sqrt(np.mean(a32 * a32, axis=1, keepdims=True))
    return (r * g.astype(np.float32)).astype(a.dtype)


if __name__ == "__main__":
    a = np.random.rand(250, 512).astype(np.float32)
    g = np.random.rand(1, 512).astype(np.float32)
    assert np.allclose(nki_rmsnorm_kernel(a, g), reference_rmsnorm(a, g), rtol=1e-4, atol=1e-4)
    print("OK")

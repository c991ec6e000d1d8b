"""Beta-1 NKI tutorial kernels (``neuronxcc.nki``): tensor add, written exactly like the public
"getting started" / SPMD tensor-add tutorials. No nsim imports: run with ``nsim.compat.install()`` first
(or ``python -m nsim run``)."""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def nki_tensor_add_kernel(a_input, b_input):
    """Whole-tensor add of two (128, 512) inputs, output returned."""
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    a_tile = nl.load(a_input)
    b_tile = nl.load(b_input)
    c_tile = a_tile + b_tile
    nl.store(c_output, value=c_tile)
    return c_output


@nki.jit
def nki_tensor_add_kernel_(a_input, b_input, c_output):
    """SPMD tutorial: one (128, 512) tile per program of a 2-D launch grid; writes c_output."""
    # Calculate tile offsets based on current 'program'
    offset_i_x = nl.program_id(0) * 128
    offset_i_y = nl.program_id(1) * 512

    # Generate tensor indices to index tensors a and b
    ix = offset_i_x + nl.arange(128)[:, None]
    iy = offset_i_y + nl.arange(512)[None, :]

    # Load input data from device memory (HBM) to on-chip memory (SBUF)
    a_tile = nl.load(a_input[ix, iy])
    b_tile = nl.load(b_input[ix, iy])

    # compute a + b
    c_tile = a_tile + b_tile

    # store the addition results back to device memory (c_output)
    nl.store(c_output[ix, iy], value=c_tile)


def nki_tensor_add(a_input, b_input):
    """Launch nki_tensor_add_kernel_ on a 2-D grid of (128, 512) tiles."""
    assert a_input.shape[0] % 128 == 0 and a_input.shape[1] % 512 == 0
    c_output = np.zeros_like(a_input)
    grid_x = a_input.shape[0] // 128
    grid_y = a_input.shape[1] // 512
    nki_tensor_add_kernel_[grid_x, grid_y](a_input, b_input, c_output)
    return c_output


@nki.jit
def nki_tensor_add_grid_out(a_input, b_input):
    """A launch grid whose instances share one shared_hbm output (returned)."""
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    j = nl.program_id(1)
    i_p, i_f = nl.mgrid[0:128, 0:512]
    a_tile = nl.load(a_input[i * 128 + i_p, j * 512 + i_f])
    b_tile = nl.load(b_input[i * 128 + i_p, j * 512 + i_f])
    nl.store(c_output[i * 128 + i_p, j * 512 + i_f], value=a_tile * 2.0 - b_tile)
    return c_output


@nki.jit
def nki_tensor_add_loop(a_input, b_input, c_output):
    """Tiles in a loop (affine_range) with arange offsets; writes c_output."""
    n, f = a_input.shape
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(f)[None, :]
    for i in nl.affine_range(n // 128):
        a_tile = nl.load(a_input[i * 128 + i_p, i_f])
        b_tile = nl.load(b_input[i * 128 + i_p, i_f])
        nl.store(c_output[i * 128 + i_p, i_f], value=nl.add(a_tile, b_tile))


def reference_add(a, b):
    return (a.astype(np.float32) + b.astype(np.float32)).astype(a.dtype)


if __name__ == "__main__":
    a = np.random.rand(256, 1024).astype(np.float32)
    b = np.random.rand(256, 1024).astype(np.float32)
    c = nki_tensor_add(a, b)
    assert np.allclose(c, a + b)
    print("OK")

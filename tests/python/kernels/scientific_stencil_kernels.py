"""Scientific-computing stencils and a Monte Carlo estimator in the Beta-1 dialect (``neuronxcc.nki``), written the
way people port them to Trainium with public NKI (arange index expressions, value-returning ``nl``/``nisa`` calls,
``nl.load``/``nl.store`` with masks for the ragged last tile of rows):

- ``heat2d_jacobi_hbm(u, n_sweeps, alpha)``: explicit heat equation / damped Jacobi on an [N, M] fp32 grid,
  u <- u + alpha * (u_up + u_down + u_left + u_right - 4 u) on the interior, boundary rows and columns fixed
  (Dirichlet). Rows on the partitions in tiles of 128 (ragged last tile masked); the halo rows of a tile are
  fetched by DMA as the rows just above / below each row (``src[r - 1, i_f]``, ``src[r + 1, i_f]``, so the row
  before a tile comes from the previous tile's rows in HBM); left / right neighbours are shifted free-axis slices.
  Each sweep reads the grid from HBM and writes it back: the sweeps ping-pong between the output and an HBM
  scratch grid, arranged so the last sweep lands in the output.
- ``heat2d_jacobi_sbuf(u, n_sweeps, alpha)``: the same sweeps with the whole grid kept in SBUF (N a multiple of
  128; [NT, par_dim(128), M] block tensors, ping-ponged in SBUF). The row above / below comes over the partitions
  by TensorE: a matmul with the band matrix band[k, m] = 1 for |k - m| = 1 (two ``nisa.affine_select``) gives
  u_up + u_down within a tile, two more matmuls with single-element "carry" matrices accumulate the last row of
  the previous tile / the first row of the next tile into the same PSUM tile. One load and one store in all.
- ``game_of_life(grid, n_gens)``: Conway's Game of Life on a uint8 grid [N <= 128, M <= 512] with dead cells
  outside. Per generation: the horizontal 3-sums by shifted free-axis adds, the 3 x 3 box sums by one matmul with
  the tridiagonal ones matrix over the partitions (exact small integers in bf16 / fp32 PSUM), then the integer rule
  next = (box == 3) | (alive & (box == 4)) in int32. The grid stays in SBUF across generations.
- ``monte_carlo_pi(seed, n_tiles, F)``: pi by dart throwing with the on-chip PRNG (``nl.random_seed`` from a
  [1, 1] seed tensor, ``nl.rand`` uniforms): per partition the number of darts with x^2 + y^2 <= 1 over
  ``n_tiles`` tiles of [128, F] pairs, the total by a ones matmul over the partitions. Returns the estimate [1, 1]
  and the per-partition hit counts [128, 1] (int32).

Written for nsim's tests in the style of those kernels; not copies of any file. No nsim imports.
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PMAX = 128


@nki.jit
def heat2d_jacobi_hbm(u, n_sweeps=4, alpha=0.2):
  N, M = u.shape
  assert N >= 3 and M >= 3
  NT = (N + PMAX - 1) // PMAX
  out = nl.ndarray((N, M), dtype=u.dtype, buffer=nl.shared_hbm)
  scratch = nl.ndarray((N, M), dtype=u.dtype, buffer=nl.hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_f = nl.arange(M)[None, :]
  i_c = nl.arange(M - 2)[None, :]  # interior columns are 1 + i_c

  # sweeps alternate between the two grids; the last one writes `out`
  bufs = [out, scratch] if n_sweeps % 2 == 1 else [scratch, out]
  src = u
  for s in nl.static_range(n_sweeps):
    dst = bufs[s % 2]
    for t in nl.affine_range(NT):
      r = t * PMAX + i_p
      inner = (r >= 1) & (r < N - 1)
      c = nl.load(src[r, i_f], mask=(r < N))
      # halo: each row's upper / lower neighbour row straight from HBM
      up = nl.load(src[r - 1, i_f], mask=inner)
      dn = nl.load(src[r + 1, i_f], mask=inner)
      vert = nl.add(up[i_p, 1 + i_c], dn[i_p, 1 + i_c], mask=inner)
      horz = nl.add(c[i_p, i_c], c[i_p, 2 + i_c], mask=inner)
      lap = nl.subtract(nl.add(vert, horz, mask=inner), nl.multiply(c[i_p, 1 + i_c], 4.0, mask=inner), mask=inner)
      c[i_p, 1 + i_c] = nl.add(c[i_p, 1 + i_c], nl.multiply(lap, alpha, mask=inner), mask=inner)
      nl.store(dst[r, i_f], value=c, mask=(r < N))
    src = dst
  return out


@nki.jit
def heat2d_jacobi_sbuf(u, n_sweeps=4, alpha=0.2):
  N, M = u.shape
  assert N % PMAX == 0 and 3 <= M <= 512
  NT = N // PMAX
  out = nl.ndarray((N, M), dtype=u.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(PMAX)[:, None]
  i_q = nl.arange(PMAX)[None, :]
  i_f = nl.arange(M)[None, :]
  i_c = nl.arange(M - 2)[None, :]

  # shift matrices (stationary [k, m]: output row m takes input row k)
  ones = nl.ones((PMAX, PMAX), dtype=nl.float32)
  above = nisa.affine_select(i_q - i_p == 1, ones, 0.0)     # row m <- row m - 1
  below = nisa.affine_select(i_p - i_q == 1, ones, 0.0)     # row m <- row m + 1
  band = nl.add(above, below)
  carry_prev = nisa.affine_select(i_p - i_q == PMAX - 1, ones, 0.0)  # row 0 <- row 127 of the previous tile
  carry_next = nisa.affine_select(i_q - i_p == PMAX - 1, ones, 0.0)  # row 127 <- row 0 of the next tile

  cur = nl.ndarray((NT, nl.par_dim(PMAX), M), dtype=nl.float32, buffer=nl.sbuf)
  nxt = nl.ndarray((NT, nl.par_dim(PMAX), M), dtype=nl.float32, buffer=nl.sbuf)
  for t in nl.affine_range(NT):
    cur[t, i_p, i_f] = nl.load(u[t * PMAX + i_p, i_f])
    nxt[t, i_p, i_f] = nl.copy(cur[t, i_p, i_f])  # the fixed boundary lives in both grids

  for s in nl.static_range(n_sweeps):
    for t in nl.static_range(NT):  # unrolled: the first / last tile have no carry from outside
      r = t * PMAX + i_p
      inner = (r >= 1) & (r < N - 1)
      vert = nl.zeros((PMAX, M), dtype=nl.float32, buffer=nl.psum)
      vert += nisa.nc_matmul(band, cur[t, i_p, i_f])
      if t > 0:
        vert += nisa.nc_matmul(carry_prev, cur[t - 1, i_p, i_f])
      if t < NT - 1:
        vert += nisa.nc_matmul(carry_next, cur[t + 1, i_p, i_f])
      horz = nl.add(cur[t, i_p, i_c], cur[t, i_p, 2 + i_c], mask=inner)
      lap = nl.subtract(nl.add(vert[i_p, 1 + i_c], horz, mask=inner),
                        nl.multiply(cur[t, i_p, 1 + i_c], 4.0, mask=inner), mask=inner)
      nxt[t, i_p, 1 + i_c] = nl.add(cur[t, i_p, 1 + i_c], nl.multiply(lap, alpha, mask=inner), mask=inner)
    cur, nxt = nxt, cur

  for t in nl.affine_range(NT):
    nl.store(out[t * PMAX + i_p, i_f], value=cur[t, i_p, i_f])
  return out


@nki.jit
def game_of_life(grid, n_gens=1):
  N, M = grid.shape
  assert N <= PMAX and 2 <= M <= 512
  out = nl.ndarray((N, M), dtype=grid.dtype, buffer=nl.shared_hbm)

  i_p = nl.arange(N)[:, None]
  i_q = nl.arange(N)[None, :]
  i_f = nl.arange(M)[None, :]
  i_s = nl.arange(M - 1)[None, :]

  # tridiagonal ones: box[m] = h[m - 1] + h[m] + h[m + 1] over the partitions
  ones = nl.ones((N, N), dtype=nl.bfloat16)
  tri = nisa.affine_select(i_q - i_p <= 1, ones, 0.0)
  tri = nisa.affine_select(i_p - i_q <= 1, tri, 0.0)

  alive = nl.load(grid[i_p, i_f], dtype=nl.int32)
  for g in nl.static_range(n_gens):
    cells = nl.copy(alive, dtype=nl.bfloat16)
    # horizontal 3-sums (a dead column outside the grid on both sides)
    h = nl.copy(cells, dtype=nl.bfloat16)
    h[i_p, 1 + i_s] = nl.add(h[i_p, 1 + i_s], cells[i_p, i_s])
    h[i_p, i_s] = nl.add(h[i_p, i_s], cells[i_p, 1 + i_s])
    box_ps = nisa.nc_matmul(tri, h)
    box = nl.copy(box_ps, dtype=nl.int32)
    born = nl.equal(box, 3, dtype=nl.int32)
    stays = nl.logical_and(alive, nl.equal(box, 4, dtype=nl.int32), dtype=nl.int32)
    alive = nl.logical_or(born, stays, dtype=nl.int32)

  nl.store(out[i_p, i_f], value=nl.copy(alive, dtype=grid.dtype))
  return out


@nki.jit
def monte_carlo_pi(seed, n_tiles=8, F=512):
  estimate = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
  hits = nl.ndarray((PMAX, 1), dtype=nl.int32, buffer=nl.shared_hbm)

  nl.random_seed(nl.load(seed))
  acc = nl.zeros((PMAX, 1), dtype=nl.float32)
  for t in nl.sequential_range(n_tiles):
    x = nl.rand((PMAX, F), dtype=nl.float32)
    y = nl.rand((PMAX, F), dtype=nl.float32)
    r2 = nl.add(nl.multiply(x, x), nl.multiply(y, y))
    inside = nl.less_equal(r2, 1.0, dtype=nl.float32)
    acc[...] = nl.add(acc, nl.sum(inside, axis=[1], keepdims=True))

  total = nisa.nc_matmul(nl.ones((PMAX, 1), dtype=nl.float32), acc)
  est = nl.multiply(total, 4.0 / (PMAX * F * n_tiles))
  nl.store(estimate, value=est)
  nl.store(hits, value=nl.copy(acc, dtype=nl.int32))
  return estimate, hits

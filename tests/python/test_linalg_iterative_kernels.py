"""Numerical linear algebra kernels written like public NKI ports of optimizers and scientific codes
(tests/python/kernels/linalg_iterative_kernels.py, Beta-1 dialect, and linalg_iterative_kernels_new.py, new dialect;
both unmodified, through ``nsim.compat``):

- Muon's Newton-Schulz orthogonalisation (quintic, (a, b, c) = (3.4445, -4.7750, 2.0315), 5 steps) of a gradient up
  to 1024 x 512, transposed first when it is tall, in bf16 matmuls with fp32 PSUM accumulation (Beta 1, ragged sizes
  zero-padded on chip; and the new dialect);
- blocked Cholesky factorisation (n <= 512, 128-column blocks: the diagonal block and its panel by an unblocked
  column loop on chip -- row broadcast by a one-hot matmul, ``rsqrt`` pivot, rank-1 elimination --, the trailing
  matrix by matmuls) and the naive unblocked variant (Beta 1);
- blocked forward / back substitution solving L L^T x = b for up to 128 right-hand sides (new dialect; composed with
  the Beta-1 factorisation it solves A x = b);
- Shampoo's coupled Newton-Schulz iteration for A^{-1/2} scaled by the trace or the Frobenius norm (true products,
  and the symmetric shortcut that diverges), and the Newton-Schulz (Hotelling) inverse, fixed iteration counts (new
  dialect);
- the mean-centred sample covariance and a batched 32 x 32 per-head product on the four diagonal PE tiles (Beta 1).

Checked: outputs against float64 numpy references written here. Tolerances: fp32 1e-5 relative and bf16 1e-2
(``close`` / ``close_to_max``) where the kernel is a fixed sequence of sums; the iterative methods are compared with a
float64 run of the *same* fixed iteration, and with a looser bound where the iteration amplifies rounding (stated at
each test: Newton-Schulz maps multiply a perturbation of X by up to |a| = 3.4445 per Muon step, and an inverse /
inverse root has forward error ~ cond(A) * eps); properties that do not depend on rounding (Muon's singular values
inside the quintic's band, L L^T = A, A X = I, Z A Z = I). Every run has every warning an error (sanitizer reports
included); the instruction / DMA counts and HBM traffic the tiling implies; in nsim's timing the blocked Cholesky
(trailing update on the PE) faster than the unblocked one (every rank-1 update on VectorE over whole rows), the PE-tiled
head products keeping TensorE active for less time, and the inverse root's symmetric shortcut (no transposes) faster
-- but numerically unstable: it diverges after ~40 steps, a kernel fact nsim's fp32 arithmetic reproduces exactly as
a float32 numpy emulation of the same products does.

The nsim fixes this family needed: none in python/nsim (every kernel here ran as written once the kernels' own bugs
were fixed: a scratch tile shared by the iterations of an ``affine_range`` was rightly reported, NSIM-W504).

The nsim fix this family needed (``test_unrolled_ragged_psum_tiles_fit`` fails without it):
- a Beta-1 kernel whose ragged tile loop is unrolled (``rw = min(128, m - t * 128)`` sizes) and that declares its
  PSUM accumulators inside the loop body (``a_ps = nl.zeros((rw, m), buffer=nl.psum)`` then ``a_ps += nc_matmul``
  in an inner ``affine_range``), run over a few unrolled iterations, fails with NSIM-E206 "PSUM overflow" although
  at most two such tiles are ever live: the tracer hands a dead tile's storage to the next tile of the same line and
  shape (python/nsim/tracer.py ``_tile``, unrolled reuse), so the reused storage's first..last access spans the
  whole unrolled sequence, and the value-level fallback (frontend/compiler/allocate.cpp ``value_ranges``) gave up
  on tiles accumulated in a loop nested in the alloc's (``+=`` over kt is live into the loop body); it now keeps
  such a tile live across the whole inner loop and splits its lifetime at the evictions. Muon's kernel here pads on
  chip instead (every compute tile whole), as many public kernels do."""
import numpy as np
import pytest

from conftest import require_core, sample_fixture  # noqa: E402
from conftest import run_clean as _run  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close_to_max, f64 as _f64, randn as _randn, rounded  # noqa: E402

BF16 = ml_dtypes.bfloat16
NS_A, NS_B, NS_C = 3.4445, -4.7750, 2.0315

la = sample_fixture("linalg_iterative_kernels.py")
lan = sample_fixture("linalg_iterative_kernels_new.py", module_only=True)


def _cdiv(a, b):
    return (a + b - 1) // b


def _spd(n, seed, cond_shift=1.0):
    """An SPD matrix M M^T / n + shift I (eigenvalues in about [shift, 4 + shift]: well conditioned)."""
    m = np.random.default_rng(seed).standard_normal((n, n))
    return m @ m.T / n + cond_shift * np.eye(n)


# --------------------------------------------------------------------------------------------------
# Muon Newton-Schulz
# --------------------------------------------------------------------------------------------------

def ref_muon(g, steps=5, dtype=None):
    """Keller Jordan's zeropower_via_newtonschulz5 in float64; with ``dtype`` the kernel's stores of X, A and B are
    rounded to it (the matmuls themselves exact)."""
    r = (lambda v: rounded(v, dtype)) if dtype is not None else (lambda v: v)
    x = _f64(g)
    tr = x.shape[0] > x.shape[1]
    if tr:
        x = x.T
    x = r(x / (np.linalg.norm(x) + 1e-7))
    for _ in range(steps):
        a = r(x @ x.T)
        b = r(NS_B * a + NS_C * (a @ a))
        x = r(NS_A * x + b @ x)
    return x.T if tr else x


def _check_muon(out, g, dtype):
    want = ref_muon(g, dtype=None if dtype == np.float32 else dtype)
    assert out.shape == g.shape and out.dtype == np.dtype(dtype)
    if dtype == np.float32:
        # fp32 rounding (~6e-8) amplified by up to |a| = 3.4445 per step over 5 steps (~500x): 1e-4 of the max
        err = np.abs(_f64(out) - want).max() / np.abs(want).max()
        assert err < 1e-4, err
    else:
        # bf16 stores at the same points as the reference; the kernel's fp32 accumulation order and its one
        # rounding of B (the reference rounds b A + c A^2 once too) leave ~1 bf16 ulp per step, amplified as above
        err = np.abs(_f64(out) - want).max() / np.abs(want).max()
        assert err < 3e-2, err
    # the singular values the iteration made (Weyl: within the spectral norm of the difference); and, when G is
    # far from square (its smallest singular value not tiny), the quintic's band: after 5 steps every singular
    # value of X lies in about [0.68, 1.14]
    s = np.linalg.svd(_f64(out), compute_uv=False)
    s_want = np.linalg.svd(want, compute_uv=False)
    assert np.abs(s - s_want).max() < (1e-4 if dtype == np.float32 else 3e-2)
    if min(g.shape) <= max(g.shape) // 2:
        assert 0.6 < s.min() and s.max() < 1.2, (s.min(), s.max())


@pytest.mark.parametrize("M,N,dtype", [
    (256, 512, np.float32),
    (512, 256, np.float32),   # tall: transposed on chip, transposed back for the store
    (1024, 512, BF16),        # the largest size, tall
    (300, 700, BF16),         # ragged both ways (m padded to 384, n to 2 chunks of 384)
    (700, 300, BF16),
    (128, 1000, BF16),
])
def test_muon_newton_schulz_matches_numpy(la, M, N, dtype):
    g = _randn((M, N), dtype, seed=M + N)
    _check_muon(_run(la[0].muon_newton_schulz, g), g, dtype)


@pytest.mark.parametrize("M,N,transposed", [(300, 700, False), (1024, 512, True)])
def test_muon_structure(la, M, N, transposed):
    """m = min(M, N) in MT row tiles, n in NT; B X in NCH column chunks of CW <= 512. Per step: MT * NT transposes
    (X -> X^T), MT * NT matmuls for A = X X^T, MT * MT for A^2, MT * NCH * MT for B X; plus one ones matmul for the
    norm, and when G is tall NT * MT transposes before the loop and MT * NT after it. G crosses HBM once each way:
    one load and one store per 128-row tile of G."""
    m_ = la[0]
    g = _randn((M, N), BF16, seed=1)
    _run(m_.muon_newton_schulz, g)
    m, n = min(M, N), max(M, N)
    MT, NT = _cdiv(m, 128), _cdiv(n, 128)
    NCH = _cdiv(NT, 4)
    c = _ops(m_.muon_newton_schulz)
    assert c["nc_transpose"] == 5 * MT * NT + (2 * MT * NT if transposed else 0), c
    assert c["nc_matmul"] == 1 + 5 * (MT * NT + MT * MT + MT * NCH * MT), c
    assert c["dma_copy"] == 2 * _cdiv(M, 128), c
    prof = m_.muon_newton_schulz.last_profile
    assert prof.stat("memory.hbm_read_bytes") == M * N * 2
    assert prof.stat("memory.hbm_write_bytes") == M * N * 2


@pytest.mark.parametrize("M,N,dtype", [(256, 512, np.float32), (384, 512, BF16), (128, 128, BF16)])
def test_muon_new_dialect_matches_numpy(lan, M, N, dtype):
    g = _randn((M, N), dtype, seed=M * 3 + N)
    _check_muon(_run(lan.muon_ns_new, g), g, dtype)
    MT, NT = M // 128, N // 128
    c = _ops(lan.muon_ns_new)
    assert c["nc_transpose"] == 5 * MT * NT and c["nc_matmul"] == 1 + 5 * (MT * NT + 2 * MT * MT), c


def test_muon_orthogonalises_low_rank_gradient(la):
    """A rank-deficient G (rank 8 of 256): the 8 nonzero singular values go into the band, the zero ones stay 0
    (the quintic is odd: X = U p(S) V^T with p(0) = 0), so X X^T is close to the projector onto range(G)."""
    rng = np.random.default_rng(3)
    g = (rng.standard_normal((256, 8)) @ rng.standard_normal((8, 384))).astype(np.float32)
    out = _f64(_run(la[0].muon_newton_schulz, g))
    s = np.linalg.svd(out, compute_uv=False)
    assert 0.6 < s[7] and s[0] < 1.2 and s[8] < 1e-3, s[:10]
    u = np.linalg.svd(_f64(g))[0][:, :8]
    proj = out @ out.T
    assert np.abs(proj - u @ u.T).max() < 0.5


def test_unrolled_ragged_psum_tiles_fit(la):
    """The natural (unpadded) form of Muon's step on a ragged size: row tiles of 128, 128 and 44 (the tile loops
    unrolled by their ``min`` sizes), PSUM accumulators declared in the loop bodies (``nl.zeros(..., buffer=
    nl.psum)`` then ``+=`` over an inner ``affine_range``), the step repeated twice by ``static_range``. Each
    accumulator is evicted right after its matmuls, so at most two PSUM tiles (2 KiB banks) are ever live and the
    kernel fits PSUM's 8 banks. Regression: nsim reported NSIM-E206 "PSUM overflow" (10 banks "live"); one step alone
    ran."""
    _, nki, nl, nisa = la

    @nki.jit
    def poly_steps(x, xt, steps):
        m, n = x.shape
        MT, NT = _cdiv(m, 128), _cdiv(n, 128)
        out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
        X = nl.zeros((MT, nl.par_dim(128), n), dtype=x.dtype, buffer=nl.sbuf)
        XT = nl.zeros((NT, nl.par_dim(128), m), dtype=x.dtype, buffer=nl.sbuf)
        for t in nl.affine_range(MT):
            rw = min(128, m - t * 128)
            X[t, 0:rw, 0:n] = nl.load(x[t * 128:t * 128 + rw, 0:n])
        for t in nl.affine_range(NT):
            rw = min(128, n - t * 128)
            XT[t, 0:rw, 0:m] = nl.load(xt[t * 128:t * 128 + rw, 0:m])
        A = nl.zeros((MT, nl.par_dim(128), m), dtype=x.dtype, buffer=nl.sbuf)
        B = nl.zeros((MT, nl.par_dim(128), m), dtype=x.dtype, buffer=nl.sbuf)
        acc = nl.zeros((MT, nl.par_dim(128), n), dtype=nl.float32, buffer=nl.sbuf)
        for it in nl.static_range(steps):
            for mb in nl.affine_range(MT):  # A = X X^T
                mw = min(128, m - mb * 128)
                a_ps = nl.zeros((mw, m), dtype=nl.float32, buffer=nl.psum)
                for kt in nl.affine_range(NT):
                    a_ps += nisa.nc_matmul(XT[kt, :, mb * 128:mb * 128 + mw], XT[kt, :, 0:m])
                A[mb, 0:mw, 0:m] = nl.copy(a_ps)
            for mb in nl.affine_range(MT):  # B = b A + c A^2
                mw = min(128, m - mb * 128)
                a2_ps = nl.zeros((mw, m), dtype=nl.float32, buffer=nl.psum)
                for kt in nl.affine_range(MT):
                    a2_ps += nisa.nc_matmul(A[kt, :, mb * 128:mb * 128 + mw], A[kt, :, 0:m])
                B[mb, 0:mw, 0:m] = nl.add(nl.multiply(A[mb, 0:mw, 0:m], NS_B), nl.multiply(a2_ps, NS_C))
            for mb in nl.affine_range(MT):  # acc += B X, one PSUM bank of columns at a time
                mw = min(128, m - mb * 128)
                for c in nl.affine_range(_cdiv(n, 512)):
                    cw = min(512, n - c * 512)
                    bx_ps = nl.zeros((mw, cw), dtype=nl.float32, buffer=nl.psum)
                    for kt in nl.affine_range(MT):
                        bx_ps += nisa.nc_matmul(B[kt, :, mb * 128:mb * 128 + mw], X[kt, :, c * 512:c * 512 + cw])
                    acc[mb, 0:mw, c * 512:c * 512 + cw] = nl.add(acc[mb, 0:mw, c * 512:c * 512 + cw], bx_ps)
        for t in nl.affine_range(MT):
            rw = min(128, m - t * 128)
            nl.store(out[t * 128:t * 128 + rw, 0:n], value=acc[t, 0:rw, 0:n])
        return out

    x = _randn((300, 700), np.float32, seed=2, scale=0.05)
    a = _f64(x) @ _f64(x).T
    want = (NS_B * a + NS_C * a @ a) @ _f64(x)
    close_to_max(_run(poly_steps, x, np.ascontiguousarray(x.T), 1), want, np.float32)  # one step runs
    close_to_max(_run(poly_steps, x, np.ascontiguousarray(x.T), 2), 2 * want, np.float32)


# --------------------------------------------------------------------------------------------------
# Cholesky
# --------------------------------------------------------------------------------------------------

def _check_cholesky(L, a):
    want = np.linalg.cholesky(_f64(a))
    assert L.dtype == np.float32 and L.shape == a.shape
    # nothing above the diagonal (the kernel masks the eliminated rows' rounding residue)
    assert not np.triu(L, 1).any()
    # forward error ~ cond(A) * n * eps for cond ~ 5: 2e-5 of the max
    err = np.abs(_f64(L) - want).max() / np.abs(want).max()
    assert err < 2e-5, err
    close_to_max(_f64(L) @ _f64(L).T, _f64(a), np.float32)


@pytest.mark.parametrize("n", [256, 300, 512, 77])
def test_cholesky_blocked_matches_numpy(la, n):
    a = _spd(n, seed=n).astype(np.float32)
    _check_cholesky(_run(la[0].cholesky_blocked, a), a)


@pytest.mark.parametrize("n", [200, 384])
def test_cholesky_unblocked_matches_numpy(la, n):
    a = _spd(n, seed=n + 1).astype(np.float32)
    _check_cholesky(_run(la[0].cholesky_unblocked, a), a)


def test_cholesky_structure(la):
    """n = 512 (NT = 4 blocks). Per column one row-broadcast matmul (n in all) and one rsqrt; per block k one
    L_kk^T transpose per panel tile below (3 + 2 + 1) and one trailing-update matmul per row tile below (3 + 2 + 1);
    affine_select: the identity once and one upper-triangle mask per diagonal block. The matrix is read once and L
    written once: n^2 fp32 each way, one DMA per row tile each way."""
    m = la[0]
    n, NT = 512, 4
    a = _spd(n, seed=5).astype(np.float32)
    _run(m.cholesky_blocked, a)
    c = _ops(m.cholesky_blocked)
    tri = NT * (NT - 1) // 2
    assert c["nc_matmul"] == n + tri and c["nc_transpose"] == tri, c
    assert c["affine_select"] == 1 + NT and c["dma_copy"] == 2 * NT, c
    # rank-1 eliminations: column j of block k updates the NT - k row tiles at and below the diagonal
    assert c["scalar_tensor_tensor"] == sum(128 * (NT - k) for k in range(NT)), c
    prof = m.cholesky_blocked.last_profile
    assert prof.stat("memory.hbm_read_bytes") == n * n * 4
    assert prof.stat("memory.hbm_write_bytes") == n * n * 4


def test_cholesky_blocked_faster_than_unblocked(la):
    """Same column loop, same instruction count per column; the unblocked variant's rank-1 updates run over whole
    rows (up to 512 columns) on VectorE where the blocked one updates 128 columns and leaves the trailing matrix to
    6 matmuls on the PE: the VectorE work, which bounds this kernel, is about 2.5x smaller (sum over blocks of
    (NT - k) * 128 * 128 against (NT - k) * 128 * (n - 128 k)), so blocked must be faster, by well over 1.3x."""
    m = la[0]
    a = _spd(512, seed=7).astype(np.float32)
    L1 = _run(m.cholesky_blocked, a)
    t_blk = m.cholesky_blocked.last_profile.total_time_ns
    L2 = _run(m.cholesky_unblocked, a)
    t_unb = m.cholesky_unblocked.last_profile.total_time_ns
    close_to_max(L1, _f64(L2), np.float32)
    assert t_unb > 1.3 * t_blk, (t_blk, t_unb)


# --------------------------------------------------------------------------------------------------
# Covariance, batched head products
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N,D,dtype", [
    (300, 200, np.float32),   # ragged sample tiles (44 rows) and feature tiles (72)
    (1000, 512, BF16),
    (129, 64, np.float32),    # a one-row last tile
    (2048, 128, BF16),
])
def test_covariance_centered_matches_numpy(la, N, D, dtype):
    rng = np.random.default_rng(N + D)
    # a mean of 3 and per-feature scales: centring matters
    x = (rng.standard_normal((N, D)) * rng.uniform(0.5, 2, D) + 3.0).astype(dtype)
    out = _run(la[0].covariance_centered, x)
    want = np.cov(_f64(x), rowvar=False)
    assert out.dtype == np.float32
    if dtype == np.float32:
        close_to_max(out, want, np.float32)
    else:  # centred rows stored in bf16 for the bf16 matmuls: ~2^-9 relative per element
        close_to_max(out, want, BF16)


def test_covariance_structure(la):
    """N = 1000 (8 sample tiles, the last 104 rows), D = 320 (3 feature tiles): 8 column-sum matmuls with the ones
    tile, then 3 * 8 Gram matmuls; x read once (N D bf16 bytes), the covariance written once (D^2 fp32)."""
    m = la[0]
    N, D = 1000, 320
    x = _randn((N, D), BF16, seed=3)
    _run(m.covariance_centered, x)
    c = _ops(m.covariance_centered)
    assert c["nc_matmul"] == 8 + 3 * 8 and c["dma_copy"] == 8 + 3, c
    prof = m.covariance_centered.last_profile
    assert prof.stat("memory.hbm_read_bytes") == N * D * 2
    assert prof.stat("memory.hbm_write_bytes") == D * D * 4


@pytest.mark.parametrize("H,dtype", [(4, np.float32), (10, BF16), (32, BF16)])
def test_head_bmm_matches_numpy(la, H, dtype):
    a = _randn((H, 32, 32), dtype, seed=H)
    b = _randn((H, 32, 32), dtype, seed=H + 1)
    out = _run(la[0].head_bmm, a, b)
    want = np.einsum("hij,hjk->hik", _f64(a), _f64(b))
    close_to_max(out, want, np.float32)  # products of bf16 values are exact in fp32; sums of 32 in fp32


def test_head_bmm_structure_and_pe_tiling(la):
    """H = 32: 8 groups of 4 heads; per group one load of b's 128 rows, 4 transposed loads of a (one per head), 4
    matmuls and one store. With PE tiling the four 32 x 32 products of a group run side by side on the four
    diagonal tiles of the array: the same values, and TensorE is active for less time (the union of its
    instruction intervals shrinks as the products overlap). The kernel as a whole is bound by its 40 small DMAs,
    so its total time does not get longer either."""
    m = la[0]
    H = 32
    a = _randn((H, 32, 32), BF16, seed=1)
    b = _randn((H, 32, 32), BF16, seed=2)
    tiled = _run(m.head_bmm, a, b, True)
    c = _ops(m.head_bmm)
    # the transposed per-head loads of a (index expression a2[row + i_t, i_s]) are DMA transposes
    assert c["nc_matmul"] == H and c["dma_copy"] == 8 * (1 + 1) and c["dma_transpose"] == 8 * 4, c
    prof = m.head_bmm.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 2 * H * 32 * 32 * 2
    assert prof.stat("memory.hbm_write_bytes") == H * 32 * 32 * 4
    untiled = _run(m.head_bmm, a, b, False)
    np.testing.assert_array_equal(tiled, untiled)
    prof_u = m.head_bmm.last_profile
    assert prof.stat("engine.tensor.active_time") < prof_u.stat("engine.tensor.active_time")
    assert prof.total_time_ns <= prof_u.total_time_ns


# --------------------------------------------------------------------------------------------------
# Shampoo inverse root, Newton-Schulz inverse (new dialect)
# --------------------------------------------------------------------------------------------------

def ref_inverse_sqrt_coupled(a, iters, scale):
    a = _f64(a)
    c = np.trace(a) if scale == "trace" else np.linalg.norm(a)
    y, z = a / c, np.eye(len(a))
    for _ in range(iters):
        t = 1.5 * np.eye(len(a)) - 0.5 * z @ y
        y, z = y @ t, t @ z
    return z / np.sqrt(c)


def _inv_sqrt(a):
    w, v = np.linalg.eigh(_f64(a))
    return (v / np.sqrt(w)) @ v.T


@pytest.mark.parametrize("n,scale,iters,dtype", [
    (128, "fro", 14, np.float32),
    (200, "trace", 24, np.float32),   # the trace scaling puts the small eigenvalues near 1 / (n cond): more steps
    (300, "fro", 14, np.float32),
    (77, "trace", 20, np.float32),
    (256, "fro", 14, BF16),
])
def test_ns_inverse_sqrt_matches_numpy(lan, n, scale, iters, dtype):
    a = _spd(n, seed=n).astype(dtype)
    z = _run(lan.ns_inverse_sqrt, a, iters, scale)
    want = ref_inverse_sqrt_coupled(a, iters, scale)
    assert z.dtype == np.float32 and z.shape == (n, n)
    if dtype == np.float32:
        # converged (the float64 run equals A^{-1/2} to 1e-14 at these counts) and stable with true products:
        # the fixed point carries fp32 rounding times cond(A) ~ 5, measured ~2e-6 of the max
        close_to_max(z, want, np.float32)
        close_to_max(_f64(z), _inv_sqrt(a), np.float32)
        assert np.abs(_f64(z) @ _f64(a) @ _f64(z) - np.eye(n)).max() < 2e-5  # Z A Z = I
    else:
        # Y, Z and T stored in bf16 for the bf16 matmuls: each step perturbs them by ~2^-9 relative, the stable
        # iteration neither damps nor amplifies that much (its Frechet derivative is idempotent): a few bf16 ulps
        err = np.abs(_f64(z) - want).max() / np.abs(want).max()
        assert err < 3e-2, err


def test_ns_inverse_sqrt_symmetric_shortcut_diverges(lan):
    """Every iterate is symmetric in exact arithmetic, so taking a factor's row tiles as the stationary tiles of its
    transpose (x^T y for x y) skips 3 NT^2 transposes per step and is faster; but in floating point the iterates
    are not exactly symmetric and the coupled iteration amplifies their antisymmetric part: still good after 20
    steps, blown up after 40. With true products (transposes on the PE) 40 steps are as good as 20. (A kernel
    numerics fact, also in nsim: its fp32 matmuls reproduce the float32 numpy emulation's divergence.)"""
    a = _spd(200, seed=2).astype(np.float32)
    res = {}
    for shortcut in (True, False):
        for iters in (20, 40):
            z = _run(lan.ns_inverse_sqrt, a, iters, "trace", shortcut)
            want = ref_inverse_sqrt_coupled(a, iters, "trace")
            res[shortcut, iters] = (np.abs(_f64(z) - want).max() / np.abs(want).max(),
                                    lan.ns_inverse_sqrt.last_profile.total_time_ns,
                                    _ops(lan.ns_inverse_sqrt)["nc_transpose"])
    assert res[True, 20][0] < 1e-3 and res[True, 40][0] > 1.0, res
    assert res[False, 20][0] < 1e-5 and res[False, 40][0] < 1e-5, res
    assert res[True, 40][2] == 0 and res[False, 40][2] == 40 * 3 * 4, res  # NT = 2: 3 * NT^2 per step
    assert res[True, 40][1] < res[False, 40][1], res


@pytest.mark.parametrize("n", [128, 300, 512])
def test_ns_inverse_matches_numpy(lan, n):
    a = _spd(n, seed=n + 9).astype(np.float32)
    x = _run(lan.ns_inverse, a, 16)
    ai = np.linalg.inv(_f64(a))
    # X0 = I / ||A||_F: the residual I - A X0 has norm below 1 - 1 / (5 sqrt(n)); 16 squarings take it to rounding;
    # the iteration is self-correcting, fp32 rounding times cond(A) ~ 5 remains (measured ~8e-7 of the max)
    close_to_max(x, ai, np.float32)
    assert np.abs(_f64(a) @ _f64(x) - np.eye(n)).max() < 1e-5


def test_ns_inverse_sqrt_structure(lan):
    """n = 300 (NT = 3): per iteration three products of NT * NT matmuls each (Z Y, Y T, T Z), each after NT * NT
    PE transposes of its left factor, plus the one partition-sum matmul; trace scaling: one tensor_reduce per tile
    plus one across the tiles; the matrix read once, the result written once (n^2 fp32 each way, one DMA per row
    tile each way)."""
    n, NT, iters = 300, 3, 10
    a = _spd(n, seed=1).astype(np.float32)
    _run(lan.ns_inverse_sqrt, a, iters, "trace")
    c = _ops(lan.ns_inverse_sqrt)
    assert c["nc_matmul"] == 1 + iters * 3 * NT * NT and c["nc_transpose"] == iters * 3 * NT * NT, c
    assert c["tensor_reduce"] == NT + 1 and c["dma_copy"] == 2 * NT, c
    prof = lan.ns_inverse_sqrt.last_profile
    assert prof.stat("memory.hbm_read_bytes") == n * n * 4
    assert prof.stat("memory.hbm_write_bytes") == n * n * 4


# --------------------------------------------------------------------------------------------------
# Cholesky solve (new dialect)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,r", [(300, 16), (512, 128), (77, 1)])
def test_cholesky_solve_matches_numpy(lan, n, r):
    a = _spd(n, seed=n)
    l = np.linalg.cholesky(a).astype(np.float32)
    b = _randn((n, r), np.float32, seed=n + r)
    x = _run(lan.cholesky_solve, l, b)
    want = np.linalg.solve(_f64(l) @ _f64(l).T, _f64(b))
    assert x.shape == (n, r) and x.dtype == np.float32
    # two triangular solves with cond(L) ~ sqrt(5): fp32 forward error well inside 1e-5 of the max
    close_to_max(x, want, np.float32)


def test_cholesky_factor_then_solve_both_dialects(la, lan):
    """A x = b end to end: the Beta-1 blocked factorisation's L fed to the new dialect's substitution."""
    n, r = 300, 8
    a = _spd(n, seed=11).astype(np.float32)
    b = _randn((n, r), np.float32, seed=12)
    l = _run(la[0].cholesky_blocked, a)
    x = _run(lan.cholesky_solve, l, b)
    close_to_max(x, np.linalg.solve(_f64(a), _f64(b)), np.float32)


def test_cholesky_solve_structure(lan):
    """n = 300 (NT = 3), r = 16: per solved column (n forward, n backward) one diag tensor_scalar, one row-broadcast
    matmul, one reciprocal, one tensor_scalar for the solution column and one rank-1 scalar_tensor_tensor; per block
    boundary (NT - 1 each way) one matmul and one transpose of the finished block; plus NT^2 transposes of L, NT of
    b and NT of x. L and b read once, x written once."""
    n, r, NT = 300, 16, 3
    l = np.linalg.cholesky(_spd(n, seed=3)).astype(np.float32)
    b = _randn((n, r), np.float32, seed=4)
    _run(lan.cholesky_solve, l, b)
    c = _ops(lan.cholesky_solve)
    assert c["nc_matmul"] == 2 * n + 2 * (NT - 1), c
    assert c["reciprocal"] == 2 * n and c["scalar_tensor_tensor"] == 2 * n and c["tensor_scalar"] == 4 * n, c
    assert c["nc_transpose"] == NT * NT + NT + 2 * (NT - 1) + NT, c
    assert c["dma_copy"] == 3 * NT, c
    prof = lan.cholesky_solve.last_profile
    assert prof.stat("memory.hbm_read_bytes") == n * n * 4 + n * r * 4
    assert prof.stat("memory.hbm_write_bytes") == n * r * 4

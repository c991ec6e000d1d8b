"""Speech / audio front ends and encoder blocks written like public NKI ports of Whisper, Conformer / wav2vec2 and CTC
ASR (tests/python/kernels/audio_speech_kernels.py, Beta-1 dialect, and audio_speech_kernels_new.py, new dialect;
both unmodified, through ``nsim.compat``):

- the Whisper log-mel front end at Whisper's own sizes (n_fft = 400 = 3 x 128 + 16 samples, 201 = 128 + 73 bins,
  80 mels, hop 160) and a ragged frame count (new dialect): overlapping frames read by one ``.ap`` DMA per
  (frame tile, sample chunk) with the frame stride hop < n_fft (or frame-major: one DMA of contiguous frame rows
  per tile and TensorE transposes), Hann window, cos / sin DFT matmuls accumulated over the sample chunks, power,
  mel matmul accumulated over the bin chunks, log10 with the 1e-10 clamp, and Whisper's global max - 8 clamp and
  (x + 4) / 4 (the max across the partitions by a transpose and a ones-row matmul);
- Whisper's conv stem (both dialects): conv1d k=3 stride 1 + GELU with the channels on the partitions, conv1d k=3
  stride 2 (a stride-2 window of the padded SBUF tile as the stationary operand, output frames on the partitions)
  + GELU + positions; and the two chained (log-mel -> stem);
- the Conformer convolution module: pointwise conv + GLU, depthwise conv1d (K = 15 / 31, same padding), folded
  BatchNorm + Swish, pointwise conv; Beta 1 with one fused multiply-accumulate per tap (or the naive multiply + add),
  new dialect with the taps vectorised through an overlapping unfold view and a stride-0 weight view
  (``.ap``) and one reduce; and wav2vec2's grouped positional conv (even kernel, SamePad, + residual) as 32 x 32
  matmuls on their own PE tiles (``tile_position``);
- CTC greedy decoding: the log-softmax over the vocabulary, per-frame argmax (max + ``iota`` compare in Beta 1,
  ``max8`` / ``nc_find_index8`` in both), the collapse of repeats against the previous frame (an HBM scratch read
  one slot early, an SBUF -> SBUF DMA one partition down, or a [1, T] row compared with itself shifted by one)
  and the blank flags.

Checked: outputs against float64 numpy references (fp32 1e-5, the log-mel 1e-4 absolute: the fp32 DFT's rounding
of low-energy bins seen through a log; bf16 1e-2 of the largest value; the ids and keep flags exactly, ties
included), no warning and no sanitizer report in any run, ragged last tiles everywhere (frames
of 300 / 129 / 1, conv outputs of 151 / 257 rows), the instruction / DMA counts and HBM traffic each tiling implies
(the STFT reads every frame's 400 samples, i.e. each sample 2.5 times, and the DMA descriptors the frame layout
implies), and three timing stories: the frame-major STFT read (contiguous 1600-byte rows, transposed on TensorE)
beats the sample-major one (one descriptor per 4-byte element); wav2vec2's grouped conv with its groups' matmuls on
disjoint PE row tiles finishes well before the same matmuls without PE tiling; and the Conformer's fused per-tap
multiply-accumulate needs less engine time in total than the naive multiply + add (which nsim's automatic engine
placement spreads over VectorE and GpSimd).

The nsim fixes this family needed: none in the Python frontend (every kernel ran as written, in both dialects).
The sanitizer fix this family needed (``test_ctc_shuffle_shift_across_quadrants_has_no_sanitizer_report`` fails
without it): NSIM-W503 nan-produced was reported, falsely, for an ``nc_stream_shuffle`` whose mask leaves some dst
partitions unchanged (entry 255, spec 2.2) while they still hold a fresh tile's NaN fill: engines/check/checker.cpp
``Checker::after`` counted the kept partitions as produced output; such a shuffle's dst is now an input too, as an
accumulation's or a predicated copy's is."""
import math

import numpy as np
import pytest

from conftest import require_core, sample_fixture  # noqa: E402
from conftest import op_counts as _ops  # noqa: E402
from conftest import run_clean as _run  # noqa: E402

_core, ml_dtypes = require_core()
from numeric_helpers import close, close_to_max, f64 as _f64, randn as _randn  # noqa: E402

BF16 = ml_dtypes.bfloat16

sa = sample_fixture("audio_speech_kernels.py")
san = sample_fixture("audio_speech_kernels_new.py", module_only=True)


def _erf(x):
    return np.vectorize(math.erf)(x)


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _nbytes(shape, dtype):
    return int(np.prod(shape)) * np.dtype(dtype).itemsize


# --------------------------------------------------------------------------------------------------
# Whisper log-mel (new dialect)
# --------------------------------------------------------------------------------------------------

def mel_bank(sr, n_fft, n_mels):
    """Slaney-normalised triangular filters on the rfft bins (HTK mel scale), [F, M] fp32."""
    F = n_fft // 2 + 1
    hz = np.linspace(0, sr / 2, F)
    edges = 700.0 * (10 ** (np.linspace(0, 2595 * np.log10(1 + sr / 2 / 700), n_mels + 2) / 2595) - 1)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    w = np.maximum(0, np.minimum((hz - lo) / (mid - lo), (hi - hz) / (hi - mid)))
    w *= (2.0 / (hi - lo))
    return w.T.astype(np.float32)


def stft_inputs(n_fft, hop, n_frames, n_mels, seed, silent=False):
    """A (reflect-padded by the host) waveform of exactly n_frames frames, the periodic Hann window, the real DFT
    bases [n_fft, F] (cos, -sin) and the filterbank. ``silent``: the second half is 1e-6 of the first, so
    Whisper's max - 8 clamp is active there."""
    L = n_fft + (n_frames - 1) * hop
    rng = np.random.default_rng(seed)
    t = np.arange(L) / 16000.0
    sig = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(L)
    if silent:
        sig[L // 2:] *= 1e-6
    n = np.arange(n_fft)
    win = 0.5 - 0.5 * np.cos(2 * np.pi * n / n_fft)
    ang = 2 * np.pi * np.outer(n, np.arange(n_fft // 2 + 1)) / n_fft
    return (sig.astype(np.float32), win.astype(np.float32), np.cos(ang).astype(np.float32),
            (-np.sin(ang)).astype(np.float32), mel_bank(16000, n_fft, n_mels))


def ref_log_mel(sig, win, fb, n_fft, hop):
    T = 1 + (sig.size - n_fft) // hop
    frames = np.stack([_f64(sig)[i * hop:i * hop + n_fft] for i in range(T)]) * _f64(win)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    lg = np.log10(np.maximum(power @ _f64(fb), 1e-10))
    lg = np.maximum(lg, lg.max() - 8.0)
    return ((lg + 4.0) / 4.0).T


@pytest.mark.parametrize("n_fft,hop,n_mels,T,silent,frame_major", [
    (400, 160, 80, 300, False, False),  # Whisper's sizes: 3 frame tiles (128, 128, 44), 4 sample chunks, 2 bin chunks
    (400, 160, 80, 300, False, True),
    (400, 160, 80, 257, True, False),   # clamp active on the quiet half; last tile of one frame
    (400, 160, 80, 257, True, True),
    (256, 64, 32, 129, False, False),   # a small test size: 32 mels (the [32, 1] max column transposes on VectorE)
    (400, 160, 80, 1, False, True),     # a single frame
])
def test_log_mel_matches_numpy(san, n_fft, hop, n_mels, T, silent, frame_major):
    sig, win, cb, sb, fb = stft_inputs(n_fft, hop, T, n_mels, seed=T, silent=silent)
    out = _run(san.log_mel, sig, win, cb, sb, fb, hop, frame_major)
    want = ref_log_mel(sig, win, fb, n_fft, hop)
    assert out.shape == (n_mels, T) and out.dtype == np.float32
    # 1e-4 absolute: the fp32 DFT's rounding of a low-energy bin (a relative error e of a power 1e-5 of the
    # loudest) comes out of log10 and the / 4 as e / (4 ln 10) absolute, beyond fp32's 1e-5 for e ~ 1e-4
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
    if silent:  # the clamp floor (max - 8 + 4) / 4 is reached by part of the quiet half
        floor = want.max() - 2.0
        assert (np.abs(want - floor) < 1e-12).sum() > n_mels


def test_log_mel_structure(san):
    """Whisper sizes, T = 300: NK = 4 sample chunks (128, 128, 128, 16), NF = 2 bin chunks (128, 73), NT = 3 frame
    tiles. DMAs: 3 constant loads per sample chunk (window column, cos rows, sin rows) + 1 filterbank load per bin
    chunk = 14, one overlapping frame read per (tile, chunk) = 12, one store = 27. Matmuls: per tile and bin chunk
    2 NK DFT + 1 mel = 9, so 18 per tile, 54, + the ones-row broadcast of the max = 55; one transpose. ScalarE: two
    squares per (tile, bin chunk) and a log per tile = 15 activations. HBM: the constants once, each frame's 400
    samples once (T n_fft = 2.5 x the signal: the frames overlap), the [80, T] output once."""
    n_fft, hop, M, T = 400, 160, 80, 300
    sig, win, cb, sb, fb = stft_inputs(n_fft, hop, T, M, seed=1)
    _run(san.log_mel, sig, win, cb, sb, fb, hop)
    c = _ops(san.log_mel)
    NK, NF, NT = 4, 2, 3
    assert c["dma_copy"] == 3 * NK + NF + NT * NK + 1, c
    assert c["nc_matmul"] == NT * NF * (2 * NK + 1) + 1 and c["nc_transpose"] == 1, c
    assert c["activation"] == NT * (2 * NF + 1), c
    assert c["tensor_reduce"] == NT + 2, c   # a row max per tile, the max over tiles, the max of the transposed row
    F = n_fft // 2 + 1
    prof = san.log_mel.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 4 * (n_fft + 2 * n_fft * F + F * M + T * n_fft)
    assert prof.stat("memory.hbm_write_bytes") == 4 * M * T


def test_log_mel_frame_major_is_faster(san):
    """Whisper sizes, T = 300. The sample-major frame read (samples on the partitions, frame stride hop on the free
    axis) has no two consecutive elements contiguous in HBM: one 4-byte descriptor per element, T n_fft = 120000;
    the constants add 400 (the window column, one element per partition) + 2 x 400 (basis rows) + 201 (filterbank
    rows) and the store 80 rows: 121481. Frame-major reads each frame as one contiguous 1600-byte row (one DMA per
    tile, 300 rows) and transposes the 4 sample chunks on TensorE. Same HBM bytes and (bitwise) the same result;
    the element-granular DMA dominates the sample-major kernel, so the frame-major one takes well under half the
    time."""
    n_fft, hop, M, T = 400, 160, 80, 300
    NK, NT = 4, 3
    sig, win, cb, sb, fb = stft_inputs(n_fft, hop, T, M, seed=2)
    out, prof, c = {}, {}, {}
    for fm in (False, True):
        out[fm] = _run(san.log_mel, sig, win, cb, sb, fb, hop, fm)
        prof[fm] = san.log_mel.last_profile
        c[fm] = _ops(san.log_mel)
    np.testing.assert_array_equal(out[True], out[False])
    consts = n_fft + 2 * n_fft + (n_fft // 2 + 1) + M
    assert prof[False].stat("dma.descriptor_count") == T * n_fft + consts
    assert prof[True].stat("dma.descriptor_count") == T + consts
    assert c[True]["dma_copy"] == c[False]["dma_copy"] - NT * (NK - 1), c
    assert c[True]["nc_transpose"] == NT * NK + 1 and c[False]["nc_transpose"] == 1
    assert prof[True].stat("memory.hbm_read_bytes") == prof[False].stat("memory.hbm_read_bytes")
    assert prof[True].total_time_ns < 0.5 * prof[False].total_time_ns, (prof[True].total_time_ns,
                                                                        prof[False].total_time_ns)


# --------------------------------------------------------------------------------------------------
# Whisper conv stem (both dialects)
# --------------------------------------------------------------------------------------------------

def stem_inputs(C, T, D, dtype, seed):
    T2 = (T - 1) // 2 + 1
    return (_randn((C, T), dtype, seed), _randn((3, C, D), dtype, seed + 1, 0.1),
            _randn((D, 1), np.float32, seed + 2, 0.1), _randn((3, D, D), dtype, seed + 3, 0.1),
            _randn((1, D), np.float32, seed + 4, 0.1), _randn((T2 + 3, D), np.float32, seed + 5))


def ref_stem(mel, w1, b1, w2, b2, pos, h_dtype=np.float32):
    """conv1d(k=3, pad 1) + GELU, conv1d(k=3, pad 1, stride 2) + GELU, transposed to [T2, D], + positions. The
    hidden activations are rounded to ``h_dtype`` (the kernel keeps them in mel's dtype)."""
    C, T = mel.shape
    T2 = (T - 1) // 2 + 1
    xp = np.pad(_f64(mel), ((0, 0), (1, 1)))
    h = gelu(sum(_f64(w1[k]).T @ xp[:, k:k + T] for k in range(3)) + _f64(b1))
    hp = np.pad(_f64(h.astype(h_dtype)), ((0, 0), (1, 1)))
    y = sum(_f64(w2[k]).T @ hp[:, k:k + 2 * T2 - 1:2] for k in range(3)).T + _f64(b2)
    return gelu(y) + _f64(pos[:T2])


@pytest.mark.parametrize("dialect", ["beta1", "new"])
@pytest.mark.parametrize("C,T,D,dtype", [
    (80, 301, 64, np.float32),    # T2 = 151: output tiles of 128 + 23
    (80, 300, 128, BF16),
    (64, 513, 64, np.float32),    # conv 1 in two chunks (512 + 1 frames), T2 = 257 (128 + 128 + 1)
    (80, 2, 32, BF16),            # two frames in, one out
])
def test_conv_stem_matches_numpy(sa, san, dialect, C, T, D, dtype):
    k = sa[0].whisper_conv_stem if dialect == "beta1" else san.whisper_conv_stem
    args = stem_inputs(C, T, D, dtype, seed=T + D)
    out = _run(k, *args)
    assert out.shape == ((T - 1) // 2 + 1, D) and out.dtype == np.dtype(dtype)
    want = ref_stem(*args, h_dtype=dtype)
    if dtype == np.float32:
        close(out, want)
    else:
        close_to_max(out, want, dtype)


def test_conv_stem_dialects_agree_bitwise(sa, san):
    """Same instructions in the same order of accumulation: the two dialects' outputs are identical."""
    args = stem_inputs(80, 300, 64, BF16, seed=3)
    a = _run(sa[0].whisper_conv_stem, *args)
    b = _run(san.whisper_conv_stem, *args)
    np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


def test_conv_stem_structure(sa):
    """C = 80, T = 300, D = 64 (Beta 1): conv 1 in one chunk of 300 frames (3 tap matmuls), conv 2 in two output
    tiles (128 + 22 of T2 = 150 frames), each 3 tap matmuls + 1 bias matmul: 11 matmuls. DMAs: 3 + 3 weight taps,
    2 biases, the mel = 9, + a positions load and an output store per tile = 13. GELU: one activation per conv-1
    chunk, one per conv-2 tile. HBM reads: weights, biases, the mel and only the T2 rows of the positions used."""
    m = sa[0]
    C, T, D = 80, 300, 64
    T2 = 150
    args = stem_inputs(C, T, D, np.float32, seed=9)
    _run(m.whisper_conv_stem, *args)
    c = _ops(m.whisper_conv_stem)
    assert c["nc_matmul"] == 3 + 2 * 4 and c["dma_copy"] == 9 + 2 * 2 and c["activation"] == 1 + 2, c
    prof = m.whisper_conv_stem.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 4 * (3 * C * D + 3 * D * D + 2 * D + C * T + T2 * D)
    assert prof.stat("memory.hbm_write_bytes") == 4 * T2 * D


def test_log_mel_into_conv_stem(sa, san):
    """The encoder's front: the new-dialect log-mel's [80, T] output fed to the Beta-1 conv stem."""
    sig, win, cb, sb, fb = stft_inputs(400, 160, 200, 80, seed=4)
    mel = _run(san.log_mel, sig, win, cb, sb, fb, 160)
    _, w1, b1, w2, b2, pos = stem_inputs(80, 200, 64, np.float32, seed=5)
    out = _run(sa[0].whisper_conv_stem, mel, w1, b1, w2, b2, pos)
    close_to_max(out, ref_stem(ref_log_mel(sig, win, fb, 400, 160), w1, b1, w2, b2, pos), np.float32)


# --------------------------------------------------------------------------------------------------
# Conformer convolution module and wav2vec2 positional conv
# --------------------------------------------------------------------------------------------------

def conformer_inputs(T, D, K, dtype, seed):
    rng = np.random.default_rng(seed)
    return (_randn((T, D), dtype, seed), _randn((D, 2 * D), dtype, seed + 1, 1 / math.sqrt(D)),
            _randn((2 * D, 1), np.float32, seed + 2, 0.1), _randn((D, K), np.float32, seed + 3, 0.3),
            (0.8 + 0.4 * rng.random((D, 1))).astype(np.float32), _randn((D, 1), np.float32, seed + 4, 0.1),
            _randn((D, D), dtype, seed + 5, 1 / math.sqrt(D)), _randn((1, D), np.float32, seed + 6, 0.1))


def ref_conformer(x, w1, b1, wdw, scale, shift, w2, b2, s_dtype=np.float32):
    T, D = x.shape
    K = wdw.shape[1]
    a = _f64(x) @ _f64(w1) + _f64(b1[:, 0])
    g = a[:, :D] * sigmoid(a[:, D:])                                   # GLU
    gp = np.pad(g, ((K // 2, K // 2), (0, 0)))
    dw = sum(gp[k:k + T] * _f64(wdw[:, k]) for k in range(K))         # depthwise, same padding
    bn = dw * _f64(scale[:, 0]) + _f64(shift[:, 0])                    # BatchNorm, folded
    s = _f64((bn * sigmoid(bn)).astype(s_dtype))                       # Swish
    return s @ _f64(w2) + _f64(b2)


@pytest.mark.parametrize("T,D,K,dtype,fused", [
    (300, 64, 15, np.float32, True),    # output tiles 128 + 128 + 44
    (300, 64, 15, np.float32, False),
    (600, 128, 31, BF16, True),         # pointwise conv 1 in chunks of 512 + 88 frames
    (77, 32, 31, np.float32, True),     # fewer frames than 2 x 31
])
def test_conformer_conv_module_matches_numpy(sa, T, D, K, dtype, fused):
    m = sa[0]
    args = conformer_inputs(T, D, K, dtype, seed=T + K)
    # Beta 1 takes the GLU bias as a 1-D [2D] vector
    out = _run(m.conformer_conv_module, args[0], args[1], args[2][:, 0].copy(), *args[3:], fused)
    assert out.shape == (T, D) and out.dtype == np.dtype(dtype)
    want = ref_conformer(*args, s_dtype=dtype)
    if dtype == np.float32:
        close(out, want)
    else:
        close_to_max(out, want, dtype)


def test_conformer_fused_taps_do_less_engine_work(sa):
    """T = 300, D = 64, K = 15, fp32. Fused: one scalar_tensor_tensor per tap (+ the GLU's) and BatchNorm + Swish
    as one activation; naive: per tap a tensor_scalar multiply and a tensor_tensor add, BatchNorm as two
    tensor_scalars, Swish as a sigmoid and a multiply. Same 8 matmuls (2 + 2 x 3 tiles). The fused form issues
    K + 3 fewer instructions and keeps the engines busy for less time in total (a scalar_tensor_tensor costs as
    much as the tensor_tensor add alone). The naive form's independent multiplies are free to go to GpSimd under
    nsim's automatic engine placement, which is why the fused one is not asserted to finish first."""
    m = sa[0]
    T, D, K = 300, 64, 15
    x, w1, b1, wdw, sc, sh, w2, b2 = conformer_inputs(T, D, K, np.float32, seed=1)
    busy, counts = {}, {}
    for fused in (True, False):
        _run(m.conformer_conv_module, x, w1, b1[:, 0].copy(), wdw, sc, sh, w2, b2, fused)
        c = _ops(m.conformer_conv_module)
        assert c["nc_matmul"] == 2 + 2 * 3 and c["dma_transpose"] == 1, c
        counts[fused] = c
        prof = m.conformer_conv_module.last_profile
        busy[fused] = sum(prof.stat("engine.{}.busy_time".format(e)) for e in ("vector", "gpsimd", "scalar"))
    assert counts[True]["scalar_tensor_tensor"] == K + 1 and counts[True]["activation"] == 2, counts[True]
    assert counts[False]["tensor_scalar"] == K + 2 and counts[False]["tensor_tensor"] == K + 1, counts[False]
    assert sum(counts[False].values()) - sum(counts[True].values()) == K + 3
    assert busy[True] < 0.85 * busy[False], busy


@pytest.mark.parametrize("T,D,K,dtype", [(300, 64, 15, np.float32), (257, 128, 31, BF16), (128, 96, 15, np.float32)])
def test_conformer_unfold_matches_numpy(sa, san, T, D, K, dtype):
    """New dialect: the depthwise conv as one multiply of the overlapping [D, T, K] unfold view by the stride-0
    weight view and one reduce over the taps; equal to the reference and (fp32) to the Beta-1 kernel."""
    args = conformer_inputs(T, D, K, dtype, seed=K + D)
    out = _run(san.conformer_conv_unfold, *args)
    want = ref_conformer(*args, s_dtype=dtype)
    if dtype == np.float32:
        close(out, want)
        b1 = _run(sa[0].conformer_conv_module, args[0], args[1], args[2][:, 0].copy(), *args[3:], True)
        close(out, b1)
    else:
        close_to_max(out, want, dtype)
    c = _ops(san.conformer_conv_unfold)
    NT = (T + 127) // 128
    # one multiply + one reduce for all K taps; x transposed per tile; 2 GLU + 2 per output tile matmuls
    assert c["tensor_tensor"] == 1 and c["tensor_reduce"] == 1 and c["nc_transpose"] == NT, c
    assert c["nc_matmul"] == 2 + 2 * NT and c["activation"] == 2, c


def w2v_inputs(T, D, K, groups, dtype, seed):
    """x [T, D], torch's weight [D, D / groups, K] and the kernel's [D, K, cg] layout of it, bias [D, 1]."""
    cg = D // groups
    x = _randn((T, D), dtype, seed)
    wt = _randn((D, cg, K), dtype, seed + 1, 1 / math.sqrt(cg * K))
    w = np.empty((D, K, cg), dtype)
    for g in range(groups):
        # w[g cg + j, k, o] = wt[g cg + o, j, k]
        w[g * cg:(g + 1) * cg] = wt[g * cg:(g + 1) * cg].transpose(1, 2, 0)
    return x, wt, w, _randn((D, 1), np.float32, seed + 2, 0.1)


def ref_w2v(x, wt, b, groups):
    T, D = x.shape
    K = wt.shape[2]
    cg = D // groups
    xp = np.pad(_f64(x).T, ((0, 0), (K // 2, K // 2)))
    conv = np.zeros((D, T))
    for g in range(groups):
        sl = slice(g * cg, (g + 1) * cg)
        for k in range(K):
            conv[sl] += _f64(wt[sl, :, k]) @ xp[sl, k:k + T]   # T + 1 outputs, SamePad keeps the first T
    return _f64(x) + gelu(conv + _f64(b)).T


@pytest.mark.parametrize("T,D,K,groups,dtype,pe_tiles", [
    (300, 128, 16, 4, np.float32, True),
    (300, 128, 16, 4, BF16, True),
    (200, 128, 8, 2, np.float32, True),     # 64-channel groups on 64 x 64 PE tiles
    (129, 128, 16, 4, np.float32, False),
])
def test_wav2vec2_pos_conv_matches_numpy(san, T, D, K, groups, dtype, pe_tiles):
    x, wt, w, b = w2v_inputs(T, D, K, groups, dtype, seed=T + K)
    out = _run(san.wav2vec2_pos_conv, x, w, b, groups, pe_tiles)
    want = ref_w2v(x, wt, b, groups)
    if dtype == np.float32:
        close(out, want)
    else:
        close_to_max(out, want, dtype)
    c = _ops(san.wav2vec2_pos_conv)
    NT = (T + 127) // 128
    assert c["nc_matmul"] == groups * K and c["nc_transpose"] == 2 * NT, c


def test_wav2vec2_pe_tiles_run_concurrently(san):
    """4 groups of 32 channels, K = 16, T = 300, fp32: 64 matmuls of K = 32 rows, each 4 x max(64, 300) cycles on
    TensorE. Issued tap-major (the groups of one tap back to back), on disjoint PE row tiles they run concurrently
    (neuroncore.md 3.1: "with PE tiling, matmuls on disjoint row tiles run concurrently"): the conv takes about a
    quarter of its time without ``tile_position``, and the whole kernel under 60 % of it. Same results."""
    x, wt, w, b = w2v_inputs(300, 128, 16, 4, np.float32, seed=2)
    outs, t = {}, {}
    for pe in (True, False):
        outs[pe] = _run(san.wav2vec2_pos_conv, x, w, b, 4, pe)
        t[pe] = san.wav2vec2_pos_conv.last_profile.total_time_ns
    np.testing.assert_array_equal(outs[True], outs[False])
    assert t[True] < 0.6 * t[False], t


# --------------------------------------------------------------------------------------------------
# CTC greedy decoding
# --------------------------------------------------------------------------------------------------

def ctc_logits(T, V, dtype, seed):
    """Logits with long runs (repeats to collapse), frequent blanks (id 0) and exact ties for the max (the first
    index must win)."""
    rng = np.random.default_rng(seed)
    lg = rng.standard_normal((T, V))
    run_ids = np.repeat(rng.integers(0, V, (T + 2) // 3), 3)[:T]
    lg[np.arange(T), run_ids] += 4.0
    lg[rng.random(T) < 0.3, 0] += 8.0
    lg = lg.astype(dtype)
    for t in rng.choice(T, max(1, T // 10), replace=False):
        j = rng.integers(0, V)
        lg[t, j] = lg[t].max()
        lg[t, rng.integers(0, V)] = lg[t].max()
    return lg


def ref_ctc(lg, blank=0):
    x = _f64(lg)
    mx = x.max(1, keepdims=True)
    logp = x - mx - np.log(np.exp(x - mx).sum(1, keepdims=True))
    ids = x.argmax(1)
    prev = np.concatenate([[-1], ids[:-1]])
    return logp, ids, ((ids != prev) & (ids != blank)).astype(np.int32)


def ctc_collapse(ids, keep):
    return [int(i) for i, k in zip(ids, keep) if k]


CTC_CASES = [
    (300, 40, np.float32),    # 3 frame tiles, the last of 44
    (129, 32, BF16),          # the last tile a single frame
    (1, 16, np.float32),
    (257, 1000, BF16),
]


@pytest.mark.parametrize("T,V,dtype", CTC_CASES)
@pytest.mark.parametrize("kernel", ["ctc_greedy_decode", "ctc_greedy_rows", "ctc_greedy"])
def test_ctc_greedy_matches_numpy(sa, san, kernel, T, V, dtype):
    lg = ctc_logits(T, V, dtype, seed=T + V)
    k = getattr(san, kernel) if kernel == "ctc_greedy" else getattr(sa[0], kernel)
    logp, ids, keep = _run(k, lg, 0)
    want_lp, want_ids, want_keep = ref_ctc(lg)
    close(logp, want_lp)
    ids, keep = ids.reshape(-1), keep.reshape(-1)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(keep, want_keep)
    assert ctc_collapse(ids, keep) == ctc_collapse(want_ids, want_keep)


def test_ctc_nonzero_blank(sa, san):
    """blank = V - 1 (some vocabularies put it last): the flags follow the argument."""
    lg = ctc_logits(200, 29, np.float32, seed=8)
    lg[::4, 28] += 10.0
    want = ref_ctc(lg, blank=28)
    for k in (sa[0].ctc_greedy_decode, sa[0].ctc_greedy_rows, san.ctc_greedy):
        _, ids, keep = _run(k, lg, 28)
        np.testing.assert_array_equal(keep.reshape(-1), want[2])


def test_ctc_structure(sa, san):
    """T = 300, V = 40 fp32, NT = 3 frame tiles.
    Beta 1 (``ctc_greedy_decode``): one iota for the whole kernel; per tile a logits load, stores of the log-probs,
    the ids, the ids into the scratch and the flags, and the shifted load of the scratch (6), + the scratch's -1
    slot: 19 DMAs. HBM: the logits and the scratch's ids read back (T int32); the log-probs, ids, scratch
    (T + 1 int32) and flags written.
    New dialect (``ctc_greedy``): per tile one max8 and one nc_find_index8, 7 DMAs (logits, ids, log-probs, flags
    and the three SBUF -> SBUF moves: carry -> partition 0, the ids one partition down, last id -> carry), so 21.
    HBM: the logits only; the SBUF -> SBUF moves cross no HBM byte.
    ``ctc_greedy_rows``: per tile max8, nc_find_index8, one transpose; a load and a store per tile, 2 row stores."""
    T, V, NT = 300, 40, 3
    lg = ctc_logits(T, V, np.float32, seed=1)
    m = sa[0]
    _run(m.ctc_greedy_decode, lg, 0)
    c = _ops(m.ctc_greedy_decode)
    assert c["iota"] == 1 and c["dma_copy"] == 6 * NT + 1, c
    prof = m.ctc_greedy_decode.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 4 * (T * V + T)
    assert prof.stat("memory.hbm_write_bytes") == 4 * (T * V + T + (T + 1) + T)

    _run(san.ctc_greedy, lg, 0)
    c = _ops(san.ctc_greedy)
    assert c["max8"] == NT and c["nc_find_index8"] == NT and c["dma_copy"] == 7 * NT, c
    prof = san.ctc_greedy.last_profile
    assert prof.stat("memory.hbm_read_bytes") == 4 * T * V
    assert prof.stat("memory.hbm_write_bytes") == 4 * (T * V + 2 * T)

    _run(m.ctc_greedy_rows, lg, 0)
    c = _ops(m.ctc_greedy_rows)
    assert c["max8"] == NT and c["nc_transpose"] == NT and c["dma_copy"] == 2 * NT + 2, c
    assert c["activation_reduce"] == NT, c


def test_ctc_bf16_reads_half_the_bytes(san):
    """bf16 logits are cast to fp32 by the load DMA: half the HBM bytes read, the same decoding."""
    lg = ctc_logits(256, 512, BF16, seed=3)
    _, ids, keep = _run(san.ctc_greedy, lg, 0)
    assert san.ctc_greedy.last_profile.stat("memory.hbm_read_bytes") == _nbytes(lg.shape, BF16)
    want = ref_ctc(lg)
    np.testing.assert_array_equal(ids.reshape(-1), want[1])
    np.testing.assert_array_equal(keep.reshape(-1), want[2])


def test_ctc_shuffle_shift_within_one_quadrant(san):
    """``shift="shuffle"`` with at most 32 frames: the shuffle's one kept partition (0) already holds the carried
    id, every frame decodes as the DMA-shifted variant does, and no report is due."""
    lg = ctc_logits(30, 40, np.float32, seed=30)
    _, ids, keep = _run(san.ctc_greedy, lg, 0, "shuffle")
    want = ref_ctc(lg)
    np.testing.assert_array_equal(ids.reshape(-1), want[1])
    np.testing.assert_array_equal(keep.reshape(-1), want[2])
    assert _ops(san.ctc_greedy)["nc_stream_shuffle"] == 1


def test_ctc_shuffle_shift_across_quadrants_has_no_sanitizer_report(san):
    """Regression (a false NSIM-W503 nan-produced before). T = 300: the shuffle shifts the ids one partition down inside each 32-partition quadrant and leaves each
    quadrant's first partition (mask entry 255) for a one-partition DMA from the previous quadrant's last, issued
    after it. Partitions 32, 64 and 96 of the fresh ``prev`` tile are unwritten when the shuffle runs; nothing
    reads them before the DMAs fill them, the decoding is right, and no report is due."""
    lg = ctc_logits(300, 40, np.float32, seed=31)
    _, ids, keep = _run(san.ctc_greedy, lg, 0, "shuffle")
    want = ref_ctc(lg)
    np.testing.assert_array_equal(ids.reshape(-1), want[1])
    np.testing.assert_array_equal(keep.reshape(-1), want[2])

"""``neuronxcc.nki.language`` (Beta 1, NKI 0.1): value semantics on top of the new-dialect implementation.

What differs from ``nsim.nki.language`` (spec §1.2, §3.6, §3.8):

- every tensor of a Beta-1 kernel is a :class:`Tensor` (an ``NkiTensor`` subclass) with tile operators
  (``a + b``, ``a * 2.0``, ``-a``, comparisons, ...), ``t[idx] = value`` (copy with cast / free-dim
  broadcast) and PSUM accumulation ``psum[idx] += nisa.nc_matmul(...)`` / ``+= nl.matmul(...)``;
- ``nl.arange`` / ``nl.mgrid`` affine index expressions in subscripts (mapped to start/size/step views);
- ``nl.par_dim`` block dims: ``nl.ndarray((n, nl.par_dim(128), F))`` is a :class:`BlockTensor` whose
  ``t[i]`` is a ``(128, F)`` tile (storage: one ``(128, n, F)`` tile);
- ``mask=``: a comparison of ``nl.arange`` expressions (and loop indices) holding on a rectangle of the
  instruction's index space restricts it to that rectangle (most value functions and nisa ops;
  :func:`mask_box`); a bool mask (a comparison of loop indices in an unrolled loop) that is False issues
  nothing (:func:`skipped`), one that is True is no mask; a few nisa ops reject other masks (NotSupportedError);
  a non-rectangular mask (a padding window ``2 * i_h + i_kh - 1 >= 0``) on loads, stores and element-wise value
  functions issues one instruction per box of its true region (:func:`mask_boxes`);
- launch-grid queries ``program_id`` / ``num_programs`` / ``program_ndim``.
"""
from __future__ import annotations

import builtins as _b
import copy as _copy
import math
import sys as _sys

import numpy as np

from ... import tracer as _tr
from ...tracer import NkiTensor, DynSlice, make_error, KernelError
from .. import language as _nl
from .. import isa as _nisa

# re-export the new-dialect names (buffers, dtypes, tile_size, op tables, loops, ...)
from ..language import (  # noqa: F401
    MemoryRegion, sbuf, psum, private_hbm, shared_hbm, hbm, is_sbuf, is_psum, is_hbm, is_on_chip,
    bool_, int8, int16, int32, uint8, uint16, uint32, float16, float32, tfloat32, fp32, bfp16, finfo,
    tile_size, ALU_OPS, ACT_FUNCS, OpCode, opcode, alu_name, act_name, par_dim, ds, dynamic_range, fori_loop,
    while_loop, NKIObject, no_reorder, promote)

for _n in ("bfloat16", "float8_e4m3", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float8_e5m2_x4",
           "float8_e4m3fn_x4", "float4_e2m1fn_x4"):
    if hasattr(_nl, _n):
        globals()[_n] = getattr(_nl, _n)

_MASK_MSG = ("mask= is not supported yet here (it is on loads, stores, element-wise and value functions, "
             "reductions, softmax, matmuls, transposes, iota, memset, affine_select and the max8 family); restrict the "
             "index ranges instead")


def _eval_expr(e, shape, env=None):
    """Values of an index expression (or int) broadcast to ``shape`` (left-aligned padding). ``env``: values
    of the open loop indices ({tracer.LoopVar: int}) for a symbolic offset (mask_box)."""
    if isinstance(e, (bool, np.bool_)):
        return np.full(shape, bool(e))
    x = IndexExpr._lift(e)
    if x is None:
        raise make_error("BadMask", "err_unsupported_expression_in_mask: {!r}".format(e))
    nd = len(shape)
    # trailing size-1 dims beyond the instruction's are harmless: a 1-D ``ids[i * 128 + i_p]`` (i_p of shape
    # (128, 1)) is a (128,) view, masked by ``i * 128 + i_p < n``
    if x.ndim > nd and (_b.any(int(n) != 1 for n in tuple(x.shape)[nd:]) or _b.any(a >= nd for a in x.coefs)):
        raise make_error("BadMask", "mask has more dims ({}) than the instruction ({})".format(
            x.ndim, nd))
    off = x.offset
    if isinstance(off, _tr.Sym) and env is not None:
        c, terms = off._open()
        off = c + _b.sum(k * env[v] for v, k in terms)
    v = np.full(shape, off, dtype=np.int64)
    for a, c in x.coefs.items():
        if x.shape[a] != shape[a]:
            raise make_error("BadMask", "mask axis {} has size {} but the instruction has {}".format(
                a, x.shape[a], shape[a]))
        idx = [1] * nd
        idx[a] = shape[a]
        v = v + c * np.arange(shape[a], dtype=np.int64).reshape(idx)
    return v


_CMPF = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal,
         "!=": np.not_equal, "&": np.logical_and, "|": np.logical_or}


def _eval_mask(m, shape, env=None):
    if isinstance(m, (bool, np.bool_)):
        return np.full(shape, bool(m))
    if not isinstance(m, _Mask):
        raise make_error("BadMask", "err_unsupported_expression_in_mask: {!r}".format(m))
    if m.op in ("&", "|"):
        return _CMPF[m.op](_eval_mask(m.a, shape, env), _eval_mask(m.b, shape, env))
    return _CMPF[m.op](_eval_expr(m.a, shape, env), _eval_expr(m.b, shape, env))


def _mask_loop_vars(m, out):
    """The open loop indices (tracer.LoopVar) in the offsets of mask ``m``; False when ``m`` is not made of
    <, <=, >, >= and & only (then whether it holds everywhere cannot be read off its corners)."""
    if isinstance(m, (bool, np.bool_)):
        return True
    if not isinstance(m, _Mask):
        return True  # reported by _eval_mask
    if m.op == "&":
        return _mask_loop_vars(m.a, out) and _mask_loop_vars(m.b, out)
    found = []
    for e in (m.a, m.b):
        x = IndexExpr._lift(e)
        if x is not None and isinstance(x.offset, _tr.Sym):
            found.extend(v for v in x.offset.vars() if v not in found)
    for v in found:
        if v not in out:
            out.append(v)
    return not found or m.op in ("<", "<=", ">", ">=")


def _symbolic_mask_box(mask, shape, loop_vars, convex):
    """mask_box of a mask over the index of loops the tracer keeps: the whole shape when the mask holds
    everywhere in every iteration (each element's condition is linear in the indices, so holding at every
    corner of their ranges is holding everywhere), else the loop is peeled (its first and last iterations
    run with int indices: ``i * 128 + ix < n`` on a last, partial tile) or unrolled."""
    full = [(0, n) for n in shape]
    if convex:
        import itertools
        corners = itertools.product(*[(v.lo, v.hi) for v in loop_vars])
        if _b.all(np.all(_eval_mask(mask, shape, dict(zip(loop_vars, c)))) for c in corners):
            return full
    inner = _b.max(loop_vars, key=lambda v: v.depth)
    raise _tr._NeedsConcrete("a mask on the loop index '{}' that does not hold everywhere in every "
                             "iteration".format(inner.name), inner.key, peel=True)


def _mask_rects(m):
    """The true region of the boolean array ``m`` split into boxes [[(lo, hi), ...], ...] (disjoint): runs of
    equal rows along axis 0 share the split of one row (recursively), so a padding mask
    ``(2 * i_h + i_kh - 1 >= 0) & ...`` gives a few boxes per padded edge, not one per element."""
    if m.ndim == 0:
        return [[]] if m else []
    if m.all():
        return [[(0, int(n)) for n in m.shape]]
    if not m.any():
        return []
    out, i, n = [], 0, m.shape[0]
    while i < n:
        j = i + 1
        while j < n and np.array_equal(m[j], m[i]):
            j += 1
        out.extend([(i, j)] + b for b in _mask_rects(m[i]))
        i = j
    return out


def mask_boxes(mask, shape):
    """The region of ``shape`` where ``mask`` holds as a list of disjoint boxes (spec §3.8: any mask, also a
    non-rectangular one such as a padding mask ``2 * i_h + i_kh - 1 >= 0``); ``[]`` when it holds nowhere, one
    box (mask_box's) when it holds on a rectangle. The caller issues one access per box."""
    try:
        box = mask_box(mask, shape)
    except Exception as e:  # (NotSupportedError: the mask is not a rectangle)
        if "non-rectangular" not in str(e):
            raise
        shape = tuple(int(n) for n in shape)
        # (conjuncts on the index of a loop the tracer keeps were found to hold everywhere by mask_box)
        rest = True
        for leaf in _mask_leaves(mask):
            lv = []
            _mask_loop_vars(leaf, lv)
            if not lv:
                rest = leaf if rest is True else _Mask(rest, leaf, "&")
        return [[tuple(b) for b in r] for r in _mask_rects(np.broadcast_to(_eval_mask(rest, shape), shape))]
    return [] if box is None else [box]


def mask_box(mask, shape):
    """The rectangle [(lo, hi), ...] of ``shape`` where ``mask`` holds; None when it holds nowhere.
    Non-rectangular masks raise here (loads, stores and element-wise value functions split them with
    :func:`mask_boxes`). A Python or numpy bool (``q_tile_idx * 128 >= k_i * 128`` in
    an unrolled loop: the flash attention samples' ``forward_mask``) holds everywhere or nowhere."""
    shape = tuple(int(n) for n in shape)
    if isinstance(mask, (bool, np.bool_)):
        return [(0, n) for n in shape] if mask else None
    loop_vars = []
    convex = _mask_loop_vars(mask, loop_vars)
    if loop_vars:
        # conditions on kept loops' indices must hold everywhere; the others give the rectangle
        # (``(m * 128 + i_m < M) & (n * 512 + i_n < N)`` with m kept and n, in a peeled iteration, an int)
        sym, rest = [], True
        for leaf in _mask_leaves(mask):
            lv = []
            c = _mask_loop_vars(leaf, lv)
            if lv:
                sym.append((leaf, lv, c))
            else:
                rest = leaf if rest is True else _Mask(rest, leaf, "&")
        if rest is True:
            return _symbolic_mask_box(mask, shape, loop_vars, convex)
        for leaf, lv, c in sym:
            _symbolic_mask_box(leaf, shape, lv, c)
        return mask_box(rest, shape)
    m = np.broadcast_to(_eval_mask(mask, shape), shape)
    if not m.any():
        return None
    box = []
    for a in range(len(shape)):
        proj = m.any(axis=tuple(i for i in range(len(shape)) if i != a))
        idx = np.nonzero(proj)[0]
        lo, hi = int(idx[0]), int(idx[-1]) + 1
        if not proj[lo:hi].all():
            raise make_error("NotSupported", "non-rectangular masks are not supported yet")
        box.append((lo, hi))
    if not m[tuple(slice(lo, hi) for lo, hi in box)].all():
        raise make_error("NotSupported", "non-rectangular masks are not supported yet")
    return box


def _mask_leaves(m):
    """The conjuncts of mask ``m``: the leaves of its ``&`` tree."""
    if isinstance(m, _Mask) and m.op == "&":
        return _mask_leaves(m.a) + _mask_leaves(m.b)
    return [m]


def _mask_terms(m):
    """The compared terms of mask ``m`` (index expressions, ints, loop indices)."""
    if isinstance(m, _Mask):
        return _mask_terms(m.a) + _mask_terms(m.b)
    return [m]


def _srcs(exprs):
    """The nl.arange / nl.mgrid tokens of index expressions (IndexExpr.src; others have none)."""
    out = set()
    for x in exprs:
        out |= getattr(x, "src", frozenset())
    return out


def operand_mask_ranges(mask, spaces, what):
    """A mask over the index spaces of an instruction's operands (spec §3.8: ``nc_matmul`` / ``nl.matmul`` take
    operand masks restricting K, M and N separately; a transpose's mask is over its input or its output).
    ``spaces``: ``[(shape, dims, keys, is_output)]``, each naming its axes (``dims``: e.g. ``("k", "m")``) and
    holding the subscript items the operand was indexed with (``keys``; None for the output). Each ``&``-conjunct
    of the mask belongs to the spaces whose subscripts are built from the same ``nl.arange`` / ``nl.mgrid``
    variables as its terms (``k * 128 + i_k < K`` names the operands indexed with ``i_k``); one built from other
    variables, to the output space (its sizes permitting); without variables to go by, to the operand spaces its
    axis sizes fit (the output's only when no operand's does). One that fits operands on different dims is
    ambiguous (NotSupportedError: index the operands with the expressions the mask compares). Returns
    ``{dim: (lo, hi)}``, or None where the mask holds nowhere."""
    ranges = {}
    for shape, dims, _, _ in spaces:
        for n, d in zip(shape, dims):
            ranges[d] = (0, int(n))
    for leaf in _mask_leaves(mask):
        if isinstance(leaf, (bool, np.bool_)):
            if not leaf:
                return None
            continue
        objs = _mask_terms(leaf)
        xs = [x for x in (IndexExpr._lift(o) for o in objs) if x is not None]
        axes = sorted({a for x in xs for a in x.coefs})

        def fits(shape):
            return _b.all(x.ndim <= len(shape) and _b.all(x.shape[a] == shape[a] for a in x.coefs) for x in xs)

        cands = [sp for sp in spaces if fits(sp[0])]
        if axes:
            named = [sp for sp in cands if sp[2] and _srcs(xs) & _srcs(IndexExpr._lift(k) for k in sp[2])]
            ops, outs = [sp for sp in cands if not sp[3]], [sp for sp in cands if sp[3]]
            # variables no operand was indexed with: the result's, when the operands were indexed with others
            foreign = _srcs(xs) and _b.any(sp[2] for sp in spaces if not sp[3])
            cands = named or ((outs or ops) if foreign else (ops or outs))
        else:
            cands = spaces[:1]  # no index expression: holds everywhere or nowhere
        if not cands:
            raise make_error("BadMask", "{}: a mask condition of axis sizes {} fits none of the operands ({})".format(
                what, [x.shape for x in xs if x.coefs], ", ".join(str(tuple(sp[0])) for sp in spaces)))
        if len({tuple(sp[1][a] for a in axes) for sp in cands}) > 1:
            raise make_error("NotSupported", "{}: a mask condition could restrict either operand ({}); index the "
                             "operands with the nl.arange/nl.mgrid expressions the mask compares".format(
                                 what, ", ".join(str(tuple(sp[0])) for sp in cands)))
        shape, dims = cands[0][0], cands[0][1]
        box = mask_box(leaf, shape)
        if box is None:
            return None
        for a in (axes if axes else ()):
            lo, hi = ranges[dims[a]]
            ranges[dims[a]] = (_b.max(lo, box[a][0]), _b.min(hi, box[a][1]))
            if ranges[dims[a]][0] >= ranges[dims[a]][1]:
                return None
    return ranges


def transpose_mask(mask, data, what):
    """The boxes of a masked 2-D transpose of ``data`` ``(P, F)``: ``(input box, output box)``, or None where the
    mask holds nowhere. The mask compares the input's index expressions (``i_p < n`` on ``data[i_p, i_f]``) or
    the output's."""
    if data.ndim != 2:
        raise make_error("NotSupported", "{} under mask= needs a 2-D tile, got shape {}".format(
            what, tuple(data.shape)))
    p, f = (int(n) for n in data.shape)
    r = operand_mask_ranges(mask, [((p, f), ("p", "f"), getattr(data, "_keys", None), False),
                                   ((f, p), ("f", "p"), None, True)], what)
    if r is None:
        return None
    return [r["p"], r["f"]], [r["f"], r["p"]]


def _is_mask(mask):
    return mask is not None and mask is not True


def skipped(mask):
    """``mask=False`` (a bool: a comparison of loop indices in an unrolled loop): the instruction is not issued.
    Its value-returning form gives a tile with nothing written (``_box == ()``): assigning it or ``+=``-ing it
    into a tile changes nothing, as on hardware, where the masked-off instruction does not run."""
    return isinstance(mask, (bool, np.bool_)) and not mask


def nothing(shape, dtype, buffer="sbuf"):
    """The value of an instruction masked off everywhere: a fresh tile with nothing written (``_box == ()``), so
    that assigning it or ``+=``-ing it changes nothing (:func:`skipped`)."""
    out = _nl._new_tile(tuple(shape), dtype, buffer)
    out._box = ()
    return out


def _box_onto(box, shape, target):
    """``box`` (one (lo, hi) per dim of ``shape``) on a ``target`` shape holding the same dims with size-1
    dims added or left out (``res[:, 0] = ...`` assigns a (P,) result to a (P, 1) view); None when the
    shapes do not correspond."""
    if len(box) != len(shape):
        return None
    out, i = [], 0
    for n in target:
        while i < len(shape) and shape[i] == 1 and n != 1:
            i += 1  # a size-1 dim of the value that the target leaves out
        if i < len(shape) and shape[i] == n:
            out.append(tuple(box[i]))
            i += 1
        elif n == 1:
            out.append((0, 1))
        else:
            return _box_onto_partitions(box, shape, target)
    while i < len(shape) and shape[i] == 1:
        i += 1
    return out if i == len(shape) else _box_onto_partitions(box, shape, target)


def _box_onto_partitions(box, shape, target):
    """``box`` restricting only the partitions of ``shape`` (every free element written) on a ``target`` with the
    same partitions and free element count in other free dims (a masked matmul's [M, N] result ``+=`` into an
    [M, OH, OW] PSUM view); else None."""
    if (len(shape) > 1 and len(target) > 1 and shape[0] == target[0]
            and _b.all(tuple(b) == (0, n) for b, n in zip(box[1:], shape[1:]))
            and int(np.prod(shape[1:])) == int(np.prod(target[1:]))):
        return [tuple(box[0])] + [(0, int(n)) for n in target[1:]]
    return None


def _restrict_rows(view, box):
    """The part inside ``box`` of a row gather/scatter view ``hbm[idx_tile[i_p, 0], i_f]`` (spec §3.8; a
    vector-offset view, §3.9): partitions [lo, hi) keep their own row indices ``idx_tile[lo:hi]`` (a row's
    address comes from its index alone: the pattern's partition step is 0); the free dims are cut as in a
    static view. A mask on such a load/store (a capacity bound ``i_p < n_valid``) restricts it this way."""
    _, off, pat = view._flat()
    if len(box) != len(pat):
        raise make_error("NotSupported", "mask of {} dims on a view of shape {}".format(len(box), tuple(view.shape)))
    ind = view._ind
    if isinstance(view, Tensor) and view._rows_oob is not None:
        # free items reaching out of bounds: index again with them cut to the box (raises if still out)
        base, t, rest, _ = view._rows_oob
        items = []
        for x in rest:
            e = IndexExpr._lift(x)
            if e is None or not e.coefs:
                items.append(x)
                continue
            shp = list(e.shape)
            for a in e.coefs:
                shp[a] = box[a][1] - box[a][0]
            items.append(IndexExpr(e.offset + _b.sum(c * box[a][0] for a, c in e.coefs.items()), dict(e.coefs), shp))
        rows = NkiTensor.__getitem__(t, (slice(box[0][0], box[0][1]),))
        return base._indirect_index((rows,) + tuple(items), defer_oob=False)
    (lo0, hi0), new = box[0], [(0, box[0][1] - box[0][0])]
    for (s, _n), (lo, hi) in zip(pat[1:], box[1:]):
        off += s * lo
        new.append((s, hi - lo))
    v = view._static()._pattern_view(off, new)
    v._ind = _tr.Indirection(NkiTensor.__getitem__(ind.offsets, (slice(lo0, hi0),)), False, ind.bound, ind.stride,
                             ind.dim)
    return v


def _restrict(view, box):
    """The part of the (arange or tile) view inside ``box`` (coordinates of the view's shape)."""
    if tuple(n for n in (hi - lo for lo, hi in box)) == tuple(view.shape):
        if not (isinstance(view, Tensor) and view._adv is not None and view._adv[3]):
            return view
    if isinstance(view, Tensor) and view._adv is not None:
        base, items, rshape, _ = view._adv
        vshape, nv = tuple(view.shape), len(view.shape)
        if len(rshape) > nv == len(box) and tuple(rshape[:nv]) == vshape and _b.all(n == 1 for n in rshape[nv:]):
            # a 1-D ``ids[i * 128 + i_p]`` (i_p of shape (128, 1)) is a (128,) view of index space (128, 1)
            box = list(box) + [(0, 1)] * (len(rshape) - nv)
            vshape = tuple(rshape)
        elif (len(rshape) > nv and len(box) == len(rshape) and nv and rshape[0] == vshape[0] and
              _squeezed(rshape) == _squeezed(vshape)):
            vshape = tuple(rshape)  # a box over the index space (nl.load's tile): its size-1 axes index nothing
        if tuple(rshape) != vshape or len(box) != len(rshape):
            raise make_error("NotSupported", "this masked access is not supported yet (shape {} vs index space "
                             "{})".format(tuple(view.shape), rshape))
        new = []
        for e in items:
            if not e.coefs:
                new.append(e)
                continue
            shp = list(e.shape)
            for a in e.coefs:
                shp[a] = box[a][1] - box[a][0]
            new.append(IndexExpr(e.offset + _b.sum(c * box[a][0] for a, c in e.coefs.items()), dict(e.coefs),
                                 shp))
        return base._adv_index(tuple(new), defer_oob=False)
    if isinstance(view, NkiTensor) and view.is_indirect() and not view._ind.scalar:
        return _restrict_rows(view, box)
    if len(box) != view.ndim:
        raise make_error("NotSupported", "mask of {} dims on a view of shape {}".format(len(box), tuple(view.shape)))
    return NkiTensor.__getitem__(view, tuple(slice(lo, hi) for lo, hi in box))


def _check_mask(mask, what=""):
    """Masks: ``None`` / ``True`` accepted; anything else is not supported yet by the op (NotSupportedError)."""
    if mask is None or mask is True or (isinstance(mask, np.bool_) and mask):
        return
    if mask is False:
        raise make_error("NotSupported", "mask=False (skip the instruction) is not supported yet" +
                         (" ({})".format(what) if what else ""))
    raise make_error("NotSupported", _MASK_MSG + (" ({})".format(what) if what else ""))


# --------------------------------------------------------------------------------------------------
# Index expressions: nl.arange / nl.mgrid (§3.8)
# --------------------------------------------------------------------------------------------------


def _idx_err(msg):
    return make_error("BadIndex", msg)


class IndexExpr:
    """An affine integer array ``offset + sum_a coef[a] * i_a`` where ``i_a`` runs over ``0..shape[a]-1``
    (numpy-broadcastable ``shape``). ``offset`` is an int, or a tracer.Sym (affine in the indices of the loops
    the tracer keeps: ``i * 128 + ix`` in an ``nl.affine_range`` body); whatever needs its int value (a mask)
    makes the tracer unroll that loop."""

    __slots__ = ("offset", "coefs", "shape", "src")

    def __init__(self, offset, coefs, shape, src=frozenset()):
        # src: the nl.arange / nl.mgrid objects (their tokens) the expression is built from: a mask names an
        # operand by the index expressions it shares with the operand's subscript (operand_mask_ranges)
        self.src = src
        self.offset = offset if isinstance(offset, _tr.Sym) else int(offset)
        self.coefs = {int(a): int(c) for a, c in coefs.items() if c != 0 and shape[a] > 1}
        # terms on size-1 axes are constants: fold them into the offset (i_a == 0 there)
        self.shape = tuple(int(s) for s in shape)

    def __repr__(self):
        return "IndexExpr({} + {}, shape={})".format(self.offset, self.coefs, self.shape)

    @property
    def ndim(self):
        return len(self.shape)

    def _pad(self, nd):
        k = nd - len(self.shape)
        return IndexExpr(self.offset, {a + k: c for a, c in self.coefs.items()}, (1,) * k + self.shape, self.src)

    @staticmethod
    def _lift(x):
        if isinstance(x, IndexExpr):
            return x
        if isinstance(x, _Arange1D):
            return x._expr()
        if isinstance(x, (bool, np.bool_)):
            return None
        if isinstance(x, (int, np.integer)):
            return IndexExpr(int(x), {}, ())
        if isinstance(x, _tr.Sym):
            return IndexExpr(x.resolved(), {}, ())
        return None

    def _combine(self, other, sign):
        o = IndexExpr._lift(other)
        if o is None:
            return NotImplemented
        nd = _b.max(self.ndim, o.ndim)
        a, b = self._pad(nd), o._pad(nd)
        shape = []
        for x, y in zip(a.shape, b.shape):
            if x != y and 1 not in (x, y):
                raise _idx_err("index expressions of shapes {} and {} do not broadcast".format(a.shape, b.shape))
            shape.append(_b.max(x, y))
        coefs = dict(a.coefs)
        for ax, c in b.coefs.items():
            coefs[ax] = coefs.get(ax, 0) + sign * c
        return IndexExpr(a.offset + sign * b.offset, coefs, shape, a.src | b.src)

    def __add__(self, other):
        return self._combine(other, 1)

    __radd__ = __add__

    def __sub__(self, other):
        return self._combine(other, -1)

    def __rsub__(self, other):
        r = (-self)._combine(other, 1)
        return r

    def __neg__(self):
        return IndexExpr(-self.offset, {a: -c for a, c in self.coefs.items()}, self.shape, self.src)

    def __mul__(self, other):
        if isinstance(other, (int, np.integer)) and not isinstance(other, (bool, np.bool_)):
            k = int(other)
            return IndexExpr(self.offset * k, {a: c * k for a, c in self.coefs.items()}, self.shape, self.src)
        if isinstance(other, IndexExpr):  # (was a bare TypeError from Python)
            raise _idx_err("non-affine index expression (a product of two nl.arange / nl.mgrid expressions) is not "
                           "supported: index expressions are affine (a sum of aranges times integers)")
        return NotImplemented

    __rmul__ = __mul__

    def _non_affine(self, what):
        raise _idx_err("err_unsupported_expression_in_mask: an index expression is affine (nl.arange / nl.mgrid "
                       "terms combined with + - * and ints); {} is not".format(what))

    # (//, %, / and ** on either side: _non_affine, set after the class)

    def __setitem__(self, key, value):
        raise make_error("ItemAssignment", "err_cannot_assign_to_index: an nl.arange / nl.mgrid index expression "
                         "cannot be assigned into (make a tile of indices with nisa.iota)")

    def _cmp(self, other, op):
        return _Mask(self, other, op)

    def __lt__(self, other):
        return _Mask(self, other, "<")

    def __le__(self, other):
        return _Mask(self, other, "<=")

    def __gt__(self, other):
        return _Mask(self, other, ">")

    def __ge__(self, other):
        return _Mask(self, other, ">=")

    def __eq__(self, other):
        return _Mask(self, other, "==")

    def __ne__(self, other):
        return _Mask(self, other, "!=")

    __hash__ = object.__hash__

    def __bool__(self):
        raise make_error("ControlFlowOnArange", "err_control_flow_condition_depending_on_arange: an "
                         "nl.arange/nl.mgrid expression cannot drive Python control flow")

    def __getitem__(self, key):
        raise _idx_err("index expressions cannot be subscripted (apply [:, None] to nl.arange directly)")


# not affine: an error naming the operator
for _dunder, _sym in (("__floordiv__", "//"), ("__rfloordiv__", "//"), ("__mod__", "%"), ("__rmod__", "%"),
                     ("__truediv__", "/"), ("__rtruediv__", "/"), ("__pow__", "**")):
    setattr(IndexExpr, _dunder, lambda self, other, _s=_sym: self._non_affine(_s))


class _Mask:
    """A comparison of index expressions (a Beta-1 mask predicate), evaluated by :func:`mask_box` and
    :func:`operand_mask_ranges`."""

    def __init__(self, a, b, op):
        self.a, self.b, self.op = a, b, op

    def __and__(self, other):
        return _Mask(self, other, "&")

    __rand__ = __and__

    def __or__(self, other):
        return _Mask(self, other, "|")

    def __bool__(self):
        raise make_error("ControlFlowOnArange", "err_control_flow_condition_depending_on_arange: a mask "
                         "expression cannot drive Python control flow")


_SRC = [0]


def _new_src():
    """A fresh token for an nl.arange / nl.mgrid index variable (IndexExpr.src)."""
    _SRC[0] += 1
    return frozenset((_SRC[0],))


class _Arange1D:
    """``nl.arange(start, stop)`` before it gets a shape with ``[:, None]`` / ``[None, :]``."""

    __slots__ = ("start", "n", "src")

    def __init__(self, start, n):
        self.start, self.n = int(start), int(n)
        self.src = _new_src()

    def _expr(self):
        return IndexExpr(self.start, {0: 1}, (self.n,), self.src)

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        shape, axis = [], None
        for i, k in enumerate(key):
            if k is None:
                shape.append(1)
            elif isinstance(k, slice) and k == slice(None):
                if axis is not None:
                    raise _idx_err("nl.arange(...)[...] takes exactly one ':'")
                axis = i
                shape.append(self.n)
            elif k is Ellipsis:
                raise _idx_err("nl.arange(...)[...]: use ':' and None only")
            else:
                raise _idx_err("nl.arange(...)[{!r}]: use ':' and None only".format(k))
        if axis is None:
            raise _idx_err("nl.arange(...)[...] needs one ':'")
        return IndexExpr(self.start, {axis: 1}, shape, self.src)

    def __getattr__(self, name):
        raise AttributeError(name)

    # 1-D arithmetic (lenient: used directly as a 1-D index)
    def __add__(self, o):
        return self._expr() + o

    __radd__ = __add__

    def __sub__(self, o):
        return self._expr() - o

    def __rsub__(self, o):
        return o - self._expr()

    def __mul__(self, o):
        return self._expr() * o

    __rmul__ = __mul__

    def __lt__(self, o):
        return self._expr() < o

    def __le__(self, o):
        return self._expr() <= o

    def __mod__(self, o):
        return self._expr() % o

    def __floordiv__(self, o):
        return self._expr() // o

    def __truediv__(self, o):
        return self._expr() / o

    def __setitem__(self, key, value):
        self._expr()[key] = value

    def __gt__(self, o):
        return self._expr() > o

    def __ge__(self, o):
        return self._expr() >= o


def arange(*args):
    """``nl.arange(stop)`` / ``nl.arange(start, stop)``: a 1-D index expression (give it a 2-D shape with
    ``[:, None]`` / ``[None, :]``)."""
    if len(args) == 1:
        start, stop = 0, args[0]
    elif len(args) == 2:
        start, stop = args
    else:
        raise _idx_err("nl.arange takes (stop) or (start, stop)")
    if int(stop) <= int(start):
        raise _idx_err("nl.arange({}, {}) is empty".format(start, stop))
    return _Arange1D(int(start), int(stop) - int(start))


class _MGridResult(tuple):
    _NAMES = ("p", "x", "y", "z", "w")

    def __getattr__(self, name):
        if name in self._NAMES and self._NAMES.index(name) < len(self):
            return self[self._NAMES.index(name)]
        raise AttributeError(name)


class _MGrid:
    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        nd = len(key)
        out = []
        for i, k in enumerate(key):
            if not isinstance(k, slice) or k.stop is None or k.step not in (None, 1):
                raise _idx_err("nl.mgrid[a:b, ...] needs start:stop slices (step 1)")
            a = 0 if k.start is None else int(k.start)
            n = int(k.stop) - a
            if n < 1:
                raise _idx_err("nl.mgrid: empty range {}:{}".format(a, k.stop))
            shape = [1] * nd
            shape[i] = n
            out.append(IndexExpr(a, {i: 1}, shape, _new_src()))
        return _MGridResult(out)


mgrid = _MGrid()


def _is_expr(k):
    return isinstance(k, (IndexExpr, _Arange1D))


class RuntimeIndex:
    """A runtime index item of a Beta-1 subscript: the value of a one-element SBUF int tile plus an affine
    index expression, as public kernels write it: ``src[i_p, idx_tile[0, j] + i_f]`` (the value moves the
    ``i_f`` window). Only ``+``/``-`` of index expressions and ints combine with it."""

    __slots__ = ("tile", "expr")

    def __init__(self, tile, expr):
        self.tile, self.expr = tile, expr

    def __repr__(self):
        return "RuntimeIndex({} + {!r})".format(self.tile.name, self.expr)

    def __add__(self, o):
        e = IndexExpr._lift(o)
        if e is None:
            return NotImplemented
        return RuntimeIndex(self.tile, self.expr + e)

    __radd__ = __add__

    def __sub__(self, o):
        e = IndexExpr._lift(o)
        if e is None:
            return NotImplemented
        return RuntimeIndex(self.tile, self.expr - e)

    def __bool__(self):
        raise make_error("DynamicIndex", "err_dynamic_control_flow_not_supported: a runtime index cannot drive "
                         "Python control flow")


def _runtime_item(x, on_chip):
    """The RuntimeIndex of subscript item ``x`` when it is a runtime index on an on-chip tensor (a one-element
    SBUF tile, or such a tile plus an index expression), else None."""
    if isinstance(x, RuntimeIndex):
        return x
    if on_chip and isinstance(x, NkiTensor) and x.size == 1:
        return RuntimeIndex(x, IndexExpr(0, {}, ()))
    return None


def _scalar_first_item(key):
    """An HBM subscript ``w[e_tile[0, 0], k * 128 + i_p, i_f]``: a one-element tile first, and another item
    varying along the result's partition axis. Under numpy semantics (spec §3.8) the (1, 1) value broadcasts
    over the partitions, so it is one runtime index on the first dim (an expert id), not a row gather of a
    single partition (``data[idx_tile, i_f]`` with a (P, 1) tile)."""
    if not key or not isinstance(key[0], NkiTensor) or key[0].size != 1:
        return False
    es = [IndexExpr._lift(x) for x in key[1:] if _is_expr(x)]
    nd = _b.max([2] + [e.ndim for e in es])
    return _b.any(a + nd - e.ndim == 0 and e.shape[a] > 1 for e in es for a in e.coefs)


# --------------------------------------------------------------------------------------------------
# Tensors with value semantics
# --------------------------------------------------------------------------------------------------


# The subscript item types Tensor.__getitem__ hands to NkiTensor.__getitem__ directly (exact types)
_PLAIN_ITEMS = frozenset((int, slice, type(Ellipsis), DynSlice, _tr.Sym))


def _isscalar(x):
    return isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating))


class Tensor(NkiTensor):
    """A Beta-1 tensor / view: NkiTensor + tile operators, item assignment, PSUM ``+=`` and arange
    indexing."""

    __slots__ = ("_mm", "_iadd", "_adv", "_t2d", "_t2d_oob", "_box", "_keys", "_pe_tmp", "_rows_oob", "_parts",
                 "_opmask")

    def _ragged_fix(self, tile, rows, cols):
        """NkiTensor._ragged_fix in Beta 1: its kernels take the last tile under a mask (spec 3.8)."""
        return ("take them under a mask, e.g. i_p = nl.arange({t})[:, None]; i_f = nl.arange({c})[None, :]; "
                "{n}[i * {t} + i_p, i_f] with mask=(i * {t} + i_p < {r})".format(t=tile, c=cols, n=self.name, r=rows))

    def __init__(self, storage, dims=None, tracer=None):
        NkiTensor.__init__(self, storage, dims, tracer)
        self._pe_tmp = False  # a TensorE result in PSUM returned as a temporary (nisa.nc_transpose / nc_matmul)
        self._box = None  # a masked result: the part of it that was written ([(lo, hi)] per dim)
        self._parts = None  # a result under a non-rectangular mask: the boxes of it that were written
        self._mm = None  # the nc_matmul statement that produced this fresh PSUM tile (for `+=`)
        self._iadd = False  # set by __iadd__; recognised (and cleared) by __setitem__
        self._adv = None  # arange views: (base view, index items, result shape, out-of-bounds message)
        self._t2d = False  # a transposed 2-D arange view (storage order dims; only nl.load / nl.store)
        self._t2d_oob = None  # such a view reaching out of bounds: the message (usable only under a clipping mask)
        self._keys = None  # arange views: the subscript's items as written (operand_mask_ranges)
        self._rows_oob = None  # a row gather view whose free items reach out of bounds: (base, idx tile, items,
        # message); usable only under a mask that clips it (_restrict_rows)
        self._opmask = None  # ``t[cond]``: an operand mask for nc_matmul / nl.matmul (operand_masks)

    @property
    def shape(self):
        s = NkiTensor.shape.fget(self)
        return _tr.Shape(tuple(reversed(s))) if self._t2d else s

    def _storage_order(self, box=None):
        """This transposed view as a plain view in storage order (shape reversed). ``box``: the part of it
        inside ``box`` (coordinates of the transposed view's shape, a mask's rectangle); without one, a view
        reaching out of bounds raises (its mask must clip it)."""
        v = NkiTensor(self._st, self._dims, self._tracer)
        v._dt = self._dt  # (a reinterpreting view keeps its dtype)
        if box is None:
            if self._t2d_oob:
                raise make_error("IndexOutOfBounds", self._t2d_oob)
            return v
        return NkiTensor.__getitem__(v, tuple(slice(lo, hi) for lo, hi in reversed(box)))

    def access(self, indirect_ok=False):
        if self._t2d:
            raise make_error("NotSupported", "a transposed arange access (partition index on a later dim) is "
                             "supported only as the HBM operand of nl.load / nl.store")
        if self._adv is not None and self._adv[3]:
            # an out-of-bounds arange view is only usable under a mask that clips it
            raise make_error("IndexOutOfBounds", self._adv[3])
        if self._rows_oob is not None:
            raise make_error("IndexOutOfBounds", self._rows_oob[3])
        return NkiTensor.access(self, indirect_ok)

    # --- indexing -----------------------------------------------------------------------------
    def __getitem__(self, key):
        k = key if isinstance(key, tuple) else (key,)
        if _PLAIN_ITEMS.issuperset(map(type, k)) and not (len(k) == 2 and type(k[1]) is int and self.ndim == 1):
            # ints, slices, nl.ds and loop indices only (most subscripts of a kernel): none of the cases below
            # applies (their items are masks, tensors, index expressions or None; the (P,) tile's ``t[i, 0]`` is
            # the one with plain items), so their scans of the items are skipped
            return NkiTensor.__getitem__(self, key)
        if k and _b.all(isinstance(x, _Mask) for x in k):
            return self._operand_mask(k)
        chip = self.buffer in _tr.ON_CHIP
        if chip and self.ndim == 1 and len(k) == 2 and isinstance(k[1], (int, np.integer)) and int(k[1]) in (0, -1) \
                and (_is_expr(k[0]) or isinstance(k[0], (int, np.integer, slice))):
            # a (P,) tile (an ``nl.load`` of a 1-D ``ids[i * 128 + i_p]``) is the (P, 1) tile numpy indexing gives
            # in NKI: ``ids[i_p, 0]`` (an indirect index) addresses its one column, ``e_tile[0, 0]`` its first element
            k = key = k[:1]
        elif chip and self.ndim == 2 and int(self.shape[1]) == 1 and len(k) == 1 and _is_expr(k[0]):
            # the converse: ``idx_tile[ix]`` on the (P, 1) tile of ``nl.load(idx[ix])`` (the NKI docs' indirect
            # DMA examples) selects rows of its one column
            k = key = (k[0], 0)
        if any(_runtime_item(x, chip) is not None for x in k) or _scalar_first_item(k):
            return self._runtime_index(k)
        if any(isinstance(x, NkiTensor) for x in k):
            return self._indirect_index(k)
        if any(_is_expr(x) for x in k):
            return self._adv_index(k)
        if any(x is None for x in k):
            return self._new_axes(k)
        return NkiTensor.__getitem__(self, key)

    def _operand_mask(self, conds):
        """``lhs_T[i_lhs_f <= 64]`` (spec §3.8: ``nc_matmul`` / ``nl.matmul`` take operand masks written as
        subscripts of the operands, restricting M and N separately): the whole view, carrying the mask (several
        conditions ``t[c0, c1]``: all of them) for the matmul, which applies it as part of its ``mask=``
        (operand_masks; operand_mask_ranges names this operand by the mask's nl.arange / nl.mgrid variables).
        Any other use of such a view is an error."""
        if self._adv is not None or self._t2d or self.is_indirect():
            raise make_error("NotSupported", "an operand mask t[cond] of an index-expression or runtime-indexed "
                             "view; write the condition as the matmul's mask= instead")
        # the conditions' index expressions, tagged as this operand's own (operand_mask_ranges then gives them to
        # this operand, even where the other operand's subscript or mask uses the same nl.arange)
        src = _new_src()

        def own(c):
            if isinstance(c, _Mask):
                return _Mask(own(c.a), own(c.b), c.op)
            x = IndexExpr._lift(c)
            return c if x is None else IndexExpr(x.offset, x.coefs, x.shape, src)
        m = own(conds[0])
        for c in conds[1:]:
            m = _Mask(m, own(c), "&")
        shape = tuple(int(n) for n in self.shape)
        for x in _mask_terms(m):
            if isinstance(x, IndexExpr) and (x.ndim > len(shape) or _b.any(x.shape[a] != shape[a] for a in x.coefs)):
                raise make_error("BadMask", "operand mask {}[...]: a condition of shape {} does not index the view "
                                 "of shape {} (left-aligned)".format(self.name, x.shape, shape))
        v = NkiTensor.__getitem__(self, (slice(None),) * self.ndim)
        v._opmask = m
        v._keys = tuple(x for x in _mask_terms(m) if isinstance(x, IndexExpr))
        return v

    def _new_axes(self, key):
        """``t[:, None, :]`` (spec §3.8: None in a subscript inserts a size-1 dim): the view of the other items
        with size-1 dims added where the Nones stand in the result."""
        rest = tuple(x for x in key if x is not None)
        explicit = _b.sum(1 for x in rest if x is not Ellipsis)
        pos, out = [], 0
        for x in key:
            if x is None:
                pos.append(out)
                out += 1
            elif x is Ellipsis:
                out += self.ndim - explicit
            elif not isinstance(x, (int, np.integer)):
                out += 1  # a slice keeps its dim (an int drops it)
        v = NkiTensor.__getitem__(self, rest) if rest else self
        for p in pos:
            v = v.expand_dim(p)
        return v

    def _runtime_index(self, key):
        """``src[i_p, idx_tile[0, j] + i_f]`` / ``src[i_p, idx_tile[0, j], i_z]`` on an on-chip tile (the Beta-1
        form of tensor_copy_dynamic_src/dst, docs/isa.md): the view at runtime index 0, moved at run time by the
        value of the one-element SBUF tile along that item's dim."""
        kept = [i for i, d in enumerate(self._dims) if d[3]]
        rt = [(i, _runtime_item(x, True)) for i, x in enumerate(key) if _runtime_item(x, True) is not None]
        if len(rt) > 1:
            raise make_error("DynamicIndex", "tensor '{}': one runtime index per subscript (spec §3.9), got {}".format(
                self.name, len(rt)))
        pos, ri = rt[0]
        if pos >= len(kept):
            raise make_error("BadSubscript", "too many indices for tensor '{}' of shape {}".format(
                self.name, tuple(self.shape)))
        static = list(key)
        e = ri.expr
        static[pos] = e if e.coefs else e.offset  # the item at runtime value 0
        static = tuple(static)
        if _b.any(_is_expr(x) for x in static):
            v = self._adv_index(static, defer_oob=False)
        else:
            v = NkiTensor.__getitem__(self, static)
        return v._dynamic(kept[pos], ri.tile)

    def _indirect_index(self, key, defer_oob=True):
        """``data[idx_tile[i_p, 0], i_f]`` / ``data[idx_tile, i_f]`` (spec §3.8): a tile of row indices as the
        first item of an HBM subscript; partition p reads (or, stored to, writes) row ``idx_tile[p]``. Free
        items reaching out of bounds (a ragged last column chunk) are an error only when the view is used
        without a mask that clips them (``defer_oob``; spec §3.8: masked-out positions are not checked)."""
        t = key[0]
        if not isinstance(t, NkiTensor) or _b.any(isinstance(x, NkiTensor) for x in key[1:]):
            raise make_error("BadSubscript", "err_indirect_indices_free_dim: runtime (tile) indices are allowed only "
                             "as the first index item of tensor '{}'".format(self.name))
        if self.buffer != "hbm":
            raise make_error("NotSupported", "runtime (tile) indices on the on-chip tensor '{}' are not supported: "
                             "they address HBM rows".format(self.name))
        n = int(t.shape[0])
        if t.size != n:
            raise make_error("ShapeMismatch", "indirect indices must be one per partition, (P, 1); got a tile of "
                             "shape {}".format(tuple(t.shape)))
        rest = tuple(key[1:])
        # the static part: row 0 and the other items (every partition starts there; its row comes from the
        # index alone, so the tensor may have fewer rows than there are partitions)
        oob = None
        if _b.any(_is_expr(x) for x in rest):  # the other items are arange/mgrid expressions
            static = self._adv_index((arange(1)[:, None],) + rest, defer_oob=defer_oob)
            oob = static._adv[3] if static._adv is not None else None
        else:
            static = self[(slice(0, 1),) + rest]
        if t.ndim == 1:
            t = t.reshape((n, 1))
        _b0, s_off, s_pat = static._flat()
        v = static.ap([(0, n)] + list(s_pat[1:]), vector_offset=t)
        if s_pat and s_pat[0][1] > 1 and s_pat[0][0]:
            # a later item also varies along the partitions (``lora_a[ids[i_p, 0], i_p, i_f]``: row idx[p], then
            # its sub-row p): partition p starts at its static address, moved by idx[p] rows (numpy semantics)
            if s_pat[0][1] != n:
                raise make_error("ShapeMismatch", "indirect indices of {} partitions against a partition index of "
                                 "{} in the other items of tensor '{}'".format(n, s_pat[0][1], self.name))
            v = static._pattern_view(s_off, [(s_pat[0][0], n)] + list(s_pat[1:]))
        # The tile selects rows of the tensor indexed here (a reshape such as vLLM's flattened KV cache, or an
        # int-indexed view), not rows of its storage: row p starts idx[p] x the step of this view's first dim,
        # and the valid indices are [0, self.shape[0]).
        row_step, rows = self._flat()[2][0]
        v._ind = _tr.Indirection(t, False, int(rows), int(row_step))
        if oob:
            v._rows_oob = (self, t, rest, oob)
        return v

    def _adv_index(self, key, defer_oob=True):
        if any(isinstance(x, (slice, DynSlice)) or x is Ellipsis or x is None for x in key):
            raise make_error("BadSubscript", "err_unsupported_mixing_basic_advanced_tensor_indexing: "
                             "index expressions (nl.arange/nl.mgrid) cannot be mixed with slices in one "
                             "subscript")
        kept = [i for i, d in enumerate(self._dims) if d[3]]
        if len(key) != len(kept):
            raise make_error("BadSubscript", "an arange subscript of tensor '{}' of shape {} needs one "
                             "item per dim, got {}".format(self.name, tuple(self.shape), len(key)))
        items = []
        for x in key:
            e = IndexExpr._lift(x)
            if e is None:
                raise make_error("BadSubscript", "unsupported index {!r}".format(x))
            items.append(e)
        nd = _b.max(e.ndim for e in items)
        if nd == 1:  # nki-api.md 3.8: a 1-D nl.arange needs a shape ([:, None] / [None, :]) to index with
            raise make_error("BadSubscript", "err_1d_arange_not_supported: a 1-D nl.arange expression indexes tensor "
                             "'{}'; give it a 2-D shape, e.g. nl.arange(n)[:, None] for the partition dim or "
                             "nl.arange(n)[None, :] for a free dim".format(self.name))
        items = [e._pad(nd) for e in items]
        rshape = [1] * nd
        for e in items:
            for a, s in enumerate(e.shape):
                if s != 1:
                    if rshape[a] not in (1, s):
                        raise make_error("BadSubscript", "index expressions do not broadcast")
                    rshape[a] = s
        if _b.any(len(e.coefs) > 1 for e in items):
            return self._keyed(self._affine_view(items, rshape, defer_oob), key)
        dims = [list(d) for d in self._dims]
        axis_of = {}  # storage dim -> result axis
        consts = []
        oob = None
        for vd, (bi, e) in enumerate(zip(kept, items)):
            start, size, step, _ = dims[bi]
            if len(e.coefs) > 1:
                raise make_error("NotSupported", "an index item that depends on several arange axes ({}) is "
                                 "not supported yet".format(e))
            if not e.coefs:
                i = e.offset
                if not 0 <= i < size:
                    msg = "err_tensor_access_out_of_bound: index {} is out of bounds for dim {} of size {} of " \
                          "tensor '{}'".format(i, vd, size, self.name)
                    if not (defer_oob and e.src):
                        raise make_error("IndexOutOfBounds", msg)
                    # an arange item over a size-1 axis (``i_h + kh - 1`` of a 1-row image): a constant, out of
                    # bounds only where a mask may exclude it (spec §3.8), like the ranges below
                    oob = oob or msg + " (use a mask= that excludes the out-of-bounds positions)"
                dims[bi] = [start + i * step, 1, step, False]
                consts.append(bi)
                continue
            (a, c), = e.coefs.items()
            n = rshape[a]
            first, last = e.offset, e.offset + (n - 1) * c
            if _b.min(first, last) < 0 or _b.max(first, last) >= size:
                oob = oob or ("err_tensor_access_out_of_bound: index range {}..{} is out of bounds for dim {} of "
                              "size {} of tensor '{}' (use a mask= that excludes the out-of-bounds "
                              "positions)".format(first, last, vd, size, self.name))
                if not defer_oob:
                    raise make_error("IndexOutOfBounds", oob)
            if a in axis_of.values():
                if self._st.buffer == "hbm":  # a diagonal (``x[i_p, i_p]``): the numpy elements, by their strides
                    return self._keyed(self._affine_view(items, rshape, defer_oob), key)
                raise make_error("NotSupported", "two index items on the same arange axis (a diagonal access) "
                                 "of the on-chip tensor '{}' are not supported".format(self.name))
            axis_of[bi] = a
            dims[bi] = [start + first * step, n, step * c, True]
        order = [axis_of[bi] for bi in sorted(axis_of)]
        if order == [1, 0] and nd == 2 and self._st.buffer == "hbm":
            v = type(self)(self._st, dims, self._tracer)
            v._dt = self._dt
            v._t2d = True
            v._t2d_oob = oob  # (an out-of-bounds window: only under a mask that clips it)
            v._keys = tuple(key)
            return v
        if order != sorted(order):
            if self._st.buffer == "hbm":  # a transposed window of more dims (``x[i_f, i_g, i_p]``): by its strides
                return self._keyed(self._affine_view(items, rshape, defer_oob), key)
            raise make_error("NotSupported", "transposed arange accesses (the partition index on a later dim) "
                             "of the on-chip tensor '{}' are not supported; use nisa.nc_transpose".format(self.name))
        # result axes not driven by any item: size-1 (else a broadcast read, not supported)
        used = set(axis_of.values())
        for a in range(nd):
            if a in used:
                continue
            if rshape[a] != 1:
                if self._st.buffer == "hbm":  # ``x[b + 0 * i_p, i_f]``: numpy broadcasts it (a stride-0 read)
                    return self._keyed(self._affine_view(items, rshape, defer_oob), key)
                raise make_error("NotSupported", "arange axis {} of size {} does not index any dim of the on-chip "
                                 "tensor '{}'".format(a, rshape[a], self.name))
            lo = _b.max([bi for bi, ax in axis_of.items() if ax < a], default=-1)
            hi = _b.min([bi for bi, ax in axis_of.items() if ax > a], default=len(dims))
            for bi in consts:
                if lo < bi < hi and not dims[bi][3]:
                    dims[bi][3] = True
                    axis_of[bi] = a
                    break
        if self._st.buffer in _tr.ON_CHIP and not dims[0][3] and kept and kept[0] == 0:
            dims[0][3] = True  # on-chip views keep the partition dim
        v = type(self)(self._st, dims, self._tracer)
        v._dt = self._dt  # (a view of a reinterpreting view keeps its dtype)
        v._adv = (self, items, tuple(rshape), oob)
        v._keys = tuple(key)
        return v

    @staticmethod
    def _keyed(v, key):
        v._keys = tuple(key)
        return v

    def _affine_view(self, items, rshape, defer_oob):
        """Index items combining several arange axes (``x[i_p, 2 * i_f + i_k]``): result element ``[a...]`` is
        at ``offset + sum_a stride_a * a`` of the storage (a re-dimensioned view; its kernel-IR access exists
        when the result visits the storage in row-major order, e.g. non-overlapping pooling windows)."""
        _base, off, pat = self._flat()
        strides = [0] * len(rshape)
        oob = None
        for vd, e in enumerate(items):
            s_vd, size = pat[vd]
            lo = e.offset + _b.sum(_b.min(0, c * (rshape[a] - 1)) for a, c in e.coefs.items())
            hi = e.offset + _b.sum(_b.max(0, c * (rshape[a] - 1)) for a, c in e.coefs.items())
            if lo < 0 or hi >= size:
                oob = oob or ("err_tensor_access_out_of_bound: index range {}..{} is out of bounds for dim {} of "
                              "size {} of tensor '{}' (use a mask= that excludes the out-of-bounds "
                              "positions)".format(lo, hi, vd, size, self.name))
                if not defer_oob:
                    raise make_error("IndexOutOfBounds", oob)
            off += e.offset * s_vd
            for a, c in e.coefs.items():
                strides[a] += c * s_vd
        v = self._pattern_view(off, list(zip(strides, rshape)))
        v._adv = (self, items, tuple(rshape), oob)
        return v

    def __setitem__(self, key, value):
        view = self[key]
        if isinstance(value, Tensor) and value._iadd:
            value._iadd = False
            if value._st is view._st and value._dims == view._dims:
                return  # `t[idx] += x`: __iadd__ did the work
        # (a temporary: referenced by the caller's evaluation, this frame and getrefcount's argument)
        fresh = isinstance(value, Tensor) and hasattr(_sys, "getrefcount") and _sys.getrefcount(value) <= 3 \
            and _sys.getrefcount(value._st) <= 2
        _store(view, value, fresh)

    # --- PSUM accumulation ----------------------------------------------------------------------
    def __iadd__(self, other):
        tr = _tr.current("+=")
        if isinstance(other, Tensor) and other._box == ():  # a masked-off instruction's value: adds nothing
            self._iadd = True
            return self
        mm = getattr(other, "_mm", None) if isinstance(other, Tensor) else None
        box = other._box if isinstance(other, Tensor) else None
        target = self
        if box is not None:  # a masked result: only its written part is added, to that part of self
            vbox = _box_onto(box, tuple(other.shape), tuple(self.shape))
            if vbox is None:
                raise make_error("ShapeMismatch", "+=: destination {} and masked value {} differ".format(
                    tuple(self.shape), tuple(other.shape)))
            target = _restrict(self, vbox)
        if mm is not None and self.buffer == "psum" and tr.body and tr.body[-1] is mm:
            if self.shape[0] != other.shape[0] or self.size != other.size:
                raise make_error("ShapeMismatch", "psum += matmul: destination {} and matmul result {} "
                                 "differ".format(tuple(self.shape), tuple(other.shape)))
            # `+=` adds to what the tile holds; onto a PSUM tile nothing wrote since its allocation it starts the
            # accumulation group (the matmul overwrites), as the compiler does with a `+=` into an
            # `nl.ndarray(buffer=nl.psum)` (the nki-samples rmsnorm_qkv's accumulator; docs/timing-model.md).
            fresh_dst = self.name in tr.unwritten_psum or (box is None and tr.fold_zero_fill(self.name, target.access()))
            flags = [f for f in mm.get("flags", []) if f != "accumulate"] + ([] if fresh_dst else ["accumulate"])
            # `psum += nisa.nc_matmul(...)`: the result tile is a temporary (referenced only by the
            # evaluation stack, this frame and getrefcount's argument) -> retarget the just-emitted matmul to
            # accumulate into this view. A result the kernel also keeps (`r = nc_matmul(..); p += r`) keeps
            # its own matmul; an accumulating copy of the instruction is emitted.
            if hasattr(_sys, "getrefcount") and _sys.getrefcount(other) <= 3 and _sys.getrefcount(other._st) <= 2:
                mm["flags"] = flags
                tr.retarget(mm, target.access())
                tr.written.add(self.name)
                tr.unwritten_psum.discard(self.name)
                other._mm = None
            else:
                dup = _copy.deepcopy({k: v for k, v in mm.items() if k != "loc"})
                dup["dst"] = target.access()
                dup["flags"] = flags
                tr.emit(dup)
        elif box is not None:
            part = _restrict(other, box)
            if part is other:  # the mask held everywhere (a full tile): all of the value was written
                other._box = None
            target += part
        else:
            if self.buffer == "hbm":
                raise make_error("BadBuffer", "+= on an HBM tensor is not supported (load, add, store)")
            if isinstance(other, Tensor) and other.buffer == "hbm":
                raise make_error("BadBuffer", "+=: the right operand is an HBM tensor; load it first")
            if _isscalar(other):
                _nisa.tensor_scalar(dst=self, data=self, op0=_nl.add, operand0=other)
            else:
                src = other
                if self.buffer == "psum" and src.buffer == "psum":
                    src = _nl.copy_(src)  # at most one PSUM operand per vector instruction
                if tuple(src.shape) != tuple(self.shape) and src.ndim == self.ndim:
                    for d in range(1, src.ndim):
                        if src.shape[d] == 1 and self.shape[d] != 1:
                            src = src.broadcast(d, self.shape[d])
                if _nl._free_elems(src) == 1 and _nl._free_elems(self) > 1:
                    _nisa.tensor_scalar(dst=self, data=self, op0=_nl.add, operand0=src)
                else:
                    _nisa.tensor_tensor(dst=self, data1=self, data2=src, op=_nl.add)
        self._iadd = True
        return self

    # --- tile operators -------------------------------------------------------------------------
    def _binop(self, other, name, rev=False, **kw):
        if _is_expr(other) and name == "add" and self.size == 1 and self.buffer in _tr.ON_CHIP:
            return RuntimeIndex(self, IndexExpr._lift(other))  # idx_tile[0, j] + i_f: a runtime index item
        if _is_expr(other) or not (isinstance(other, NkiTensor) or _isscalar(other)):
            return NotImplemented
        f = _B1OPS[name]
        return f(other, self, **kw) if rev else f(self, other, **kw)

    def __add__(self, o):
        return self._binop(o, "add")

    def __radd__(self, o):
        return self._binop(o, "add", True)

    def __sub__(self, o):
        return self._binop(o, "subtract")

    def __rsub__(self, o):
        return self._binop(o, "subtract", True)

    def __mul__(self, o):
        return self._binop(o, "multiply")

    def __rmul__(self, o):
        return self._binop(o, "multiply", True)

    def __truediv__(self, o):
        return self._binop(o, "divide")

    def __rtruediv__(self, o):
        return self._binop(o, "divide", True)

    def __pow__(self, o):
        return self._binop(o, "power")

    def __rpow__(self, o):
        return self._binop(o, "power", True)

    def __mod__(self, o):
        return self._binop(o, "mod")

    def __neg__(self):
        return _B1OPS["negative"](self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _B1OPS["abs"](self)

    def __lt__(self, o):
        return self._binop(o, "less")

    def __le__(self, o):
        return self._binop(o, "less_equal")

    def __gt__(self, o):
        return self._binop(o, "greater")

    def __ge__(self, o):
        return self._binop(o, "greater_equal")

    def __eq__(self, o):
        if self.buffer == "hbm" or not (isinstance(o, NkiTensor) or _isscalar(o)):
            return self is o
        return self._binop(o, "equal")

    def __ne__(self, o):
        if self.buffer == "hbm" or not (isinstance(o, NkiTensor) or _isscalar(o)):
            return self is not o
        return self._binop(o, "not_equal")

    __hash__ = NkiTensor.__hash__

    def _logic(self, o, name_int, name_bool, rev=False):
        integer = np.issubdtype(self.dtype, np.integer)
        return self._binop(o, name_int if integer else name_bool, rev)

    def __and__(self, o):
        return self._logic(o, "bitwise_and", "logical_and")

    def __rand__(self, o):
        return self._logic(o, "bitwise_and", "logical_and", True)

    def __or__(self, o):
        return self._logic(o, "bitwise_or", "logical_or")

    def __ror__(self, o):
        return self._logic(o, "bitwise_or", "logical_or", True)

    def __xor__(self, o):
        return self._logic(o, "bitwise_xor", "logical_xor")

    def __rxor__(self, o):
        return self._logic(o, "bitwise_xor", "logical_xor", True)

    def __invert__(self):
        if np.issubdtype(self.dtype, np.integer):
            return _B1OPS["invert"](self)
        return _B1OPS["logical_not"](self)

    # --- methods ------------------------------------------------------------------------------
    def astype(self, dtype):
        return copy(self, dtype=dtype)

    def broadcast_to(self, shape):
        return broadcast_to(self, shape=shape)

    def expand_dims(self, axis):
        return self.expand_dim(axis)

    def assert_shape(self, shape):
        if tuple(self.shape) != tuple(shape):
            raise make_error("ShapeMismatch", "assert_shape: expected {}, got {}".format(
                tuple(shape), tuple(self.shape)))
        return self


class BlockTensor:
    """An on-chip tensor with block dims before the partition dim: ``(b0, .., par_dim(P), F..)``.
    Storage: one ``(P, b0, .., F..)`` tile; ``t[i0, ..]`` (all block dims indexed) is a tile."""

    def __init__(self, tile, nblock, placed=None, merged=None):
        self._t = tile
        self._nb = nblock
        # More block and free dims than a tile has (P + blocks + free > 5): (logical block dims, logical first
        # free dim F0); the storage is then (P, blocks * F0, F1..), block k at [k * F0, (k + 1) * F0) of dim 1.
        self._merged = merged
        # Manual placement (an ncc allocator): (logical block dims, slot_of, logical first free dim or
        # None); the storage is then (P, slots, F0 padded to the slot stride, F1..).
        self._placed = placed

    @property
    def shape(self):
        s = tuple(self._t.shape)
        if self._placed is not None:
            blocks, _, f0 = self._placed
            free = s[2:]
            if f0 is not None:
                free = (f0,) + free[1:]
            return _tr.Shape(tuple(blocks) + s[:1] + tuple(free))
        if self._merged is not None:
            blocks, f0 = self._merged
            return _tr.Shape(tuple(blocks) + s[:1] + (f0,) + s[2:])
        return _tr.Shape(s[1:1 + self._nb] + s[:1] + s[1 + self._nb:])

    @property
    def dtype(self):
        return self._t.dtype

    @property
    def buffer(self):
        return self._t.buffer

    @property
    def name(self):
        return self._t.name

    @property
    def ndim(self):
        return len(self.shape)

    def __repr__(self):
        return "BlockTensor({}, shape={}, dtype={}, buffer={})".format(self.name, tuple(self.shape),
                                                                       self._t._st.dtype, self.buffer)

    def _tile(self, key):
        k = key if isinstance(key, tuple) else (key,)
        if len(k) < self._nb or any(x is Ellipsis for x in k[:self._nb]):
            raise make_error("TileInference", "err_failed_to_infer_tile_from_local_tensor: a tensor with "
                             "block dims {} must be indexed on all block dims to give a tile".format(
                                 tuple(self.shape)))
        blk = []
        for x in k[:self._nb]:
            e = IndexExpr._lift(x)
            if e is None or e.coefs:
                raise make_error("NotSupported", "block dims must be indexed with ints or loop indices (got "
                                 "{!r})".format(x))
            blk.append(e.offset)
        if self._placed is not None:
            blocks, slot_of, f0 = self._placed
            for b, n in zip(blk, blocks):
                if not 0 <= b < n:
                    raise make_error("IndexOutOfBounds", "block index {} is outside the tensor's block dims "
                                     "{}".format(tuple(blk), tuple(blocks)))
            t = self._t[(slice(None), slot_of(tuple(blk)))]
            if f0 is not None:
                t = t[(slice(None), slice(0, f0))]
        elif self._merged is not None:
            blocks, f0 = self._merged
            flat = 0
            for b, n in zip(blk, blocks):
                if isinstance(b, (int, np.integer)) and not 0 <= b < n:
                    raise make_error("IndexOutOfBounds", "block index {} is outside the tensor's block dims "
                                     "{}".format(tuple(blk), tuple(blocks)))
                flat = flat * n + b
            t = self._t[(slice(None), slice(flat * f0, (flat + 1) * f0))]
        else:
            t = self._t[(slice(None),) + tuple(blk)]
        rest = k[self._nb:]
        return t[rest] if rest else t

    def __getitem__(self, key):
        return self._tile(key)

    def __setitem__(self, key, value):
        view = self._tile(key)
        if isinstance(value, Tensor) and value._iadd:
            value._iadd = False
            if value._st is view._st and value._dims == view._dims:
                return
        fresh = isinstance(value, Tensor) and hasattr(_sys, "getrefcount") and _sys.getrefcount(value) <= 3 \
            and _sys.getrefcount(value._st) <= 2
        _store(view, value, fresh)

    def __bool__(self):
        raise make_error("TensorTruthValue", "the truth value of a tensor is ambiguous")


_RETARGET_OPS = frozenset(("dma_copy", "activation", "tensor_tensor", "tensor_scalar", "tensor_copy", "tensor_reduce",
                           "memset", "iota", "reciprocal", "nc_matmul", "nc_transpose", "activation_reduce",
                           "scalar_tensor_tensor", "affine_select", "dma_transpose", "bn_stats", "bn_aggr"))
# instructions that move bytes without an output cast: they write a view directly only of the value's dtype
_NO_CAST_OPS = frozenset(("dma_transpose",))


def _mentions(stmt, name, skip=()):
    """True when kernel.json statement ``stmt`` accesses tensor ``name`` in a field other than ``skip``."""
    def walk(x):
        if isinstance(x, str):
            return x == name
        if isinstance(x, dict):
            return x.get("tensor") == name or _b.any(walk(v) for v in x.values())
        if isinstance(x, (list, tuple)):
            return _b.any(walk(v) for v in x)
        return False
    if "alloc" in stmt:
        return stmt["alloc"].get("name") == name
    return _b.any(walk(v) for k, v in stmt.items() if k not in skip and k != "loc")


def _where_fill(tr, i, stmt, wrote, value, view):
    """``t[idx] = nl.where(cond, x, y)``: the value was made by two instructions, a fill (memset, or a copy of
    ``y``) and then the predicated copy of ``x`` (``stmt``, at ``tr.body[i]``). Returns the fill when it is the
    last access to the temporary before ``stmt`` and nothing in between nor ``stmt``'s operands touch the view
    (then both may write the view directly), else None."""
    if stmt.get("op") != "tensor_copy_predicated" or view.dtype != value.dtype:
        return None
    if _mentions(stmt, value.name, skip=("dst",)) or _mentions(stmt, view.name, skip=("dst",)):
        return None
    j = i - 1
    while j >= 0 and not _mentions(tr.body[j], value.name):
        if _mentions(tr.body[j], view.name):
            return None
        j -= 1
    first = tr.body[j] if j >= 0 else None
    if first is None or first.get("op") not in ("memset", "tensor_copy") or first.get("dst") != wrote:
        return None
    if _mentions(first, value.name, skip=("dst",)):
        return None
    return first


def _store(view, value, fresh):
    """``t[idx] = value`` (Tensor and BlockTensor ``__setitem__``): a ``fresh`` temporary's instruction writes the
    view directly when it can (:func:`_retarget_fresh`), else the value is copied. A masked result (``_box``) is
    stored in its written part only (on hardware the masked instruction writes ``t[idx]`` directly and leaves the
    rest of it alone); a masked-off one (``_box == ()``) stores nothing."""
    box = value._box if isinstance(value, Tensor) else None
    if box == ():
        return
    if isinstance(value, Tensor) and value._parts is not None:
        # a non-rectangular masked result: each written box goes to its part of the view; the instructions that
        # wrote the boxes (one per box, just emitted) write the view directly when they can, else one copy per box
        vbs = [_box_onto(part, tuple(value.shape), tuple(view.shape)) for part in value._parts]
        if _b.any(vb is None for vb in vbs):
            raise make_error("ShapeMismatch", "a masked value of shape {} assigned to a view of shape {}".format(
                tuple(value.shape), tuple(view.shape)))
        if not (fresh and _retarget_parts(view, value, vbs)):
            for part, vb in zip(value._parts, vbs):
                assign(_restrict(view, vb), _restrict(value, part))
        return
    vbox = _box_onto(box, tuple(value.shape), tuple(view.shape)) if box is not None else None
    if vbox is not None:
        if not (fresh and _retarget_fresh(view, value, box)):
            assign(_restrict(view, vbox), _restrict(value, box))
        return
    if not (fresh and _retarget_fresh(view, value)):
        assign(view, value)


def _widening_transpose(stmt, view):
    """A transpose into a float32 tile (the flash attention sample's bf16 ``p_local`` transposed into a float32
    PSUM tile, ``p_local_t_tmp[:, j] = nisa.nc_transpose(p_local[:, j])``), or on VectorE, whose output
    cast converts any dtype: the instruction writes the tile directly (decision, docs/timing-model.md: on
    TensorE the compiler transposes as a matmul with an identity, which writes float32 PSUM and is exact for
    every narrower float input). A TensorE transpose into a narrower PSUM tile keeps its copy."""
    return stmt["op"] == "nc_transpose" and (stmt.get("engine") == "vector" or view.dtype == "float32")


def _whole_shape(value):
    """The shape of the storage of ``value`` when it covers it whole: its own shape, or for a 1-D result (a (P, 1)
    tile viewed as (P,), which behaves as (P, 1): spec §3.10) the storage's (P, 1); else None."""
    if value.is_full():
        return tuple(value.shape)
    st = value._st
    if isinstance(st, _tr._ViewStorage) or len(value._dims) != len(st.shape):
        return None
    for d, n in zip(value._dims, st.shape):
        if isinstance(d[0], _tr.Sym) or d[0] != 0 or d[1] != n or d[2] != 1 or not (d[3] or n == 1):
            return None
    return tuple(st.shape)


def _retarget_parts(view, value, vbs):
    """``t[idx] = <fresh value written in boxes value._parts>`` (a load under a non-rectangular mask): when the last
    instructions emitted are the ones that wrote those boxes, in order, point each at its part of ``t[idx]``
    (``vbs``). Returns True when done."""
    tr = _tr.active()
    parts = value._parts
    if tr is None or view.buffer == "hbm" or value.buffer != view.buffer or not value.is_full():
        return False
    stmts, i = [], len(tr.body) - 1
    while i >= 0 and len(stmts) < len(parts):
        st = tr.body[i]
        if "alloc" in st:
            if st["alloc"].get("name") == view.name:
                return False  # the view's own tile is younger than the instructions
        elif "op" in st:
            stmts.append(st)
        else:
            return False
        i -= 1
    stmts.reverse()
    if len(stmts) != len(parts):
        return False
    for st, part in zip(stmts, parts):
        if st["op"] not in _RETARGET_OPS or st["op"] in _NO_CAST_OPS or st.get("dst") != _restrict(value, part).access():
            return False
        if _mentions(st, view.name, skip=("dst",)):
            return False
    for st, vb in zip(stmts, vbs):
        tr.retarget(st, _restrict(view, vb).access())
    tr.written.add(view.name)
    return True


def _retarget_fresh(view, value, box=None, reuse=True):
    """``t[idx] = <fresh temporary>``: when the instruction that just produced the temporary (the last one
    emitted) wrote exactly it, let that instruction write ``t[idx]`` instead (no extra copy; the
    conversion to t.dtype happens in the instruction's output cast). ``box``: a masked result, of which the
    instruction wrote that part (``t[...] = nl.load(x, mask=m)``): it writes that part of ``t[idx]`` instead.
    ``reuse``: the temporary's storage may go to its line's next tile (not for a masked value function's
    internal result: that made the iterations of a kept loop trace differently). Returns True when done."""
    tr = _tr.active()
    whole = _whole_shape(value) if box is None else (tuple(value.shape) if value.is_full() else None)
    if tr is None or not tr.body or whole is None or value.buffer != view.buffer:
        return False
    if whole != tuple(view.shape) or view.buffer == "hbm":
        return False
    i = len(tr.body) - 1
    while i > 0 and "alloc" in tr.body[i]:  # (tiles allocated since: no access in between)
        if tr.body[i]["alloc"].get("name") == view.name:
            return False  # the view's own tile is younger than the instruction
        i -= 1
    stmt = tr.body[i]
    # (a whole value: the instruction wrote the tile itself, also when the value is its (P, 1) tile viewed as (P,))
    if box is not None:
        wrote = _restrict(value, box).access()
    else:
        wrote = value.access() if stmt.get("dst") == value.access() else value.name
    fill = _where_fill(tr, i, stmt, wrote, value, view) if box is None else None
    if (stmt.get("op") not in _RETARGET_OPS and fill is None) or stmt.get("dst") != wrote:
        return False
    if box is not None:
        view = _restrict(view, box)
    if stmt["op"] in ("nc_matmul", "nc_transpose") and view.dtype != value.dtype and not _widening_transpose(stmt, view):
        return False
    if stmt["op"] in _NO_CAST_OPS and view.dtype != value.dtype:
        return False
    if stmt["op"] in ("dma_copy", "dma_transpose") and isinstance(stmt.get("src"), (str, dict)):
        src = stmt["src"]
        if (src if isinstance(src, str) else src.get("tensor")) == view.name:
            return False  # an on-chip copy of the same tensor: keep the two steps
    if fill is not None:
        tr.retarget(fill, view.access())
    tr.retarget(stmt, view.access())
    tr.written.add(view.name)
    if reuse:
        tr.unused_storage(value.name)
    if stmt["op"] == "nc_matmul":
        value._mm = None
    return True


class _LoopReduce:
    """The value of ``nl.loop_reduce(x, op, loop_indices)``: assigning it to ``T[idx]`` performs
    ``T[idx] = op(T[idx], x)``."""

    __slots__ = ("x", "op")

    def __init__(self, x, op):
        self.x, self.op = x, op


_STORE_OPS = {"STORE_FAST": "f_locals", "STORE_DEREF": "f_locals", "STORE_NAME": "f_locals",
              "STORE_GLOBAL": "f_globals"}
_CALL_TARGETS = {}  # (code, instruction offset) -> the name the call's value is bound to, or None


def _rebound_name(f):
    """``(name, namespace)`` when the statement running in frame ``f`` binds the value of the call at its current
    instruction to a plain name (``b = nl.loop_reduce(...)``: the call is followed by a STORE of ``b``), else None
    (``T[idx] = ...``, an argument of another call, ...). Decoded from the bytecode once per call site."""
    key = (f.f_code, f.f_lasti)
    if key not in _CALL_TARGETS:
        import dis
        hit = None
        for ins in dis.get_instructions(f.f_code):
            if ins.offset > f.f_lasti:
                if ins.opname in _STORE_OPS:
                    hit = (ins.argval, _STORE_OPS[ins.opname])
                elif ins.opname == "STORE_FAST_LOAD_FAST":  # Python 3.13+: the store fused with the next load
                    hit = (ins.argval[0], "f_locals")
                break
        _CALL_TARGETS[key] = hit
    return _CALL_TARGETS[key]


def loop_reduce(x, op, loop_indices, *, dtype=None, mask=None):
    """``T[idx] = nl.loop_reduce(x, op=np.add, loop_indices=(i,))`` (Beta 1): ``T[idx] = op(T[idx], x)``, a
    reduction over the loop iterations (not reported as an affine_range write conflict). nsim policy (spec
    §2.3): the first assignment to a region that nothing wrote yet stores ``x``. ``mask=False`` (the flash
    attention backward sample's causal mask of a tile pair above the diagonal) reduces nothing.

    The form of the API reference, ``b = nl.loop_reduce(a, op=np.add, loop_indices=[k_i])`` ("the destination
    tile is also the rhs input to op"): the destination is the tile ``b`` is bound to when the call runs; it is
    updated in place (``b = op(b, a)``) and returned, so the rebinding keeps it. With ``b`` not yet bound to an
    on-chip tile the value is a fresh copy of ``a`` (cast to ``dtype``): the reduction's first value."""
    if skipped(mask):
        _tr.current("nl.loop_reduce")
        return _LoopReduce(None, op)
    _check_mask(mask, "nl.loop_reduce")
    _tr.current("nl.loop_reduce")
    if not isinstance(x, NkiTensor) and not _isscalar(x):
        raise make_error("BadOperandKind", "nl.loop_reduce: x must be a tile or a scalar, got {!r}".format(_tr.shown(x)))
    _nl.opcode(op, "op")
    if not isinstance(loop_indices, (tuple, list)) and not _is_expr(loop_indices):
        loop_indices = (loop_indices,)
    f = _tr.user_frame()
    target = _rebound_name(f) if f is not None else None
    if target is None:
        return _LoopReduce(x, op)
    name, space = target
    cur = getattr(f, space).get(name)
    if isinstance(cur, Tensor) and cur.buffer in _tr.ON_CHIP:
        _assign_loop_reduce(cur, _LoopReduce(x, op))
        return cur
    if _isscalar(x):
        raise make_error("BadOperandKind", "nl.loop_reduce: '{} = nl.loop_reduce(x, ...)' with a scalar x needs "
                         "'{}' bound to a tile first".format(name, name))
    out = _nl._new_tile(x.shape, dtype if dtype is not None else x.dtype)
    _nisa.tensor_copy(dst=out, src=x)
    return out


def _assign_loop_reduce(dst, r):
    tr = _tr.current("nl.loop_reduce")
    if r.x is None or (isinstance(r.x, Tensor) and r.x._box == ()):
        return None  # masked off: T[idx] keeps its value
    st = tr.dialect_state
    regions, only = st.setdefault("loop_reduce_regions", set()), st.setdefault("loop_reduce_only", set())
    key = (dst.name, repr(dst.access()))
    if key not in regions and (dst.name not in tr.written or dst.name in only):
        regions.add(key)
        only.add(dst.name)
        return assign(dst, r.x)  # the first value of the reduction
    regions.add(key)
    saved, tr._affine = tr._affine, []  # a reduction across iterations is not a write conflict
    try:
        if dst.buffer == "hbm":
            cur = _nl.load(dst)
            _nl.store(dst, _nl._binary_call(_nl.opcode(r.op, "op"), cur, r.x))
        elif _isscalar(r.x):
            _nisa.tensor_scalar(dst=dst, data=dst, op0=r.op, operand0=r.x)
        else:
            _nisa.tensor_tensor(dst=dst, data1=dst, data2=r.x, op=r.op)
    finally:
        tr._affine = saved


def assign(dst, value):
    """``dst = value`` (Beta-1 item assignment): copy with cast to dst.dtype and broadcast of value."""
    if isinstance(value, _LoopReduce):
        return _assign_loop_reduce(dst, value)
    if isinstance(value, BlockTensor):
        raise make_error("TileInference", "err_failed_to_infer_tile_from_local_tensor: index the block "
                         "dims of the value")
    if _is_expr(value):
        value = _iota_value(IndexExpr._lift(value), np.int32)
    if _isscalar(value):
        if dst.buffer == "hbm":
            _nl.store(dst, value)
        else:
            v = value
            if np.issubdtype(dst.dtype, np.integer) or dst.dtype == np.bool_:
                v = _tr.int_immediate(value, "assigned value")
            _nisa.memset(dst, v)
        return
    if not isinstance(value, NkiTensor):
        raise make_error("BadOperandKind", "cannot assign {!r} to a tensor".format(value))
    for v, fn in ((value, "tensor_copy_dynamic_src(src)"), (dst, "tensor_copy_dynamic_dst(dst=, src=)")):
        if v.is_indirect() and v.buffer in _tr.ON_CHIP:
            raise make_error("DynamicIndex", "err_copy_dynamic_indirect_indices_not_natively_supported: an "
                             "assignment copy cannot use the runtime index of '{}'; use nisa.{}".format(v.name, fn))
    if dst.buffer == "hbm":
        _nl.store(dst, value)
        return
    if value.buffer == "hbm":
        if value.size != dst.size:
            raise make_error("ShapeMismatch", "assignment: shapes {} and {} differ".format(
                tuple(dst.shape), tuple(value.shape)))
        _nisa.dma_copy(dst=dst, src=value)
        return
    src = value
    if src.size != dst.size:
        if src.shape[0] != dst.shape[0] and src.shape[0] != 1:
            raise make_error("ShapeMismatch", "err_store_dst_shape_smaller_than_other_shape: cannot "
                             "assign shape {} to {}".format(tuple(src.shape), tuple(dst.shape)))
        if src.ndim <= dst.ndim and _b.all(a in (1, b) for a, b in zip(src.shape, dst.shape)):
            if src.shape[0] == 1 and dst.shape[0] > 1:
                src = _nl.partition_broadcast(src, dst.shape[0])
            src = NkiTensor.broadcast_to(src, tuple(dst.shape))
        if src.size != dst.size:
            raise make_error("ShapeMismatch", "err_store_dst_shape_smaller_than_other_shape: cannot "
                             "assign shape {} to {}".format(tuple(value.shape), tuple(dst.shape)))
    _nisa.tensor_copy(dst=dst, src=src)


# --------------------------------------------------------------------------------------------------
# Creation (§3.4) with par_dim
# --------------------------------------------------------------------------------------------------


def _under(r, directive):
    with directive:
        yield from r


def _directed(r, directives):
    """A loop with ``directives=`` (e.g. ``nki.compiler.no_reorder()``): the iterations run inside it."""
    if directives is None:
        return r
    if isinstance(directives, (list, tuple)):
        for d in reversed(directives):
            r = _directed(r, d)
        return r
    if not (hasattr(directives, "__enter__") and hasattr(directives, "__exit__")):
        raise make_error("BadDirective", "directives= must be a compiler directive such as "
                         "nki.compiler.no_reorder(), got {!r}".format(directives))
    return _under(r, directives)


def affine_range(start, stop=None, step=1, *, directives=None):
    return _directed(_nl.affine_range(start, stop, step), directives)


def sequential_range(start, stop=None, step=1, *, directives=None):
    return _directed(_nl.sequential_range(start, stop, step), directives)


def static_range(start, stop=None, step=1, *, directives=None):
    return _directed(_nl.static_range(start, stop, step), directives)


def _grid_state():
    tr = _tr.active()
    return tr.dialect_state if tr is not None else {}


def ndarray(shape, dtype, *, buffer=None, name="", **kwargs):
    tr = _tr.current("nl.ndarray")
    _nl._shape(shape)  # validated (an int or a tuple of ints; nl.par_dim entries are ints)
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    shape = tuple(shape)
    pidx = [i for i, s in enumerate(shape) if isinstance(s, par_dim)]
    if len(pidx) > 1:
        raise make_error("BadTensorShape", "more than one nl.par_dim in shape {}".format(shape))
    dims = tuple(int(s) for s in shape)
    b = _nl._ir_buffer(buffer)
    if b == "hbm":
        st = tr.dialect_state
        if str(buffer) == "shared_hbm" and "grid" in st:
            # one tensor per launch: the k-th shared_hbm allocation of every instance binds to the same one
            k = st["shared_k"]
            st["shared_k"] = k + 1
            lst = st["shared"]
            if k < len(lst):
                t = lst[k]
                if tuple(t.shape) != dims or t.dtype != np.dtype(dtype):
                    raise make_error("SpmdDivergence", "shared_hbm allocation #{} differs between launch "
                                     "instances ({} {} vs {} {})".format(k, tuple(t.shape), t.dtype, dims,
                                                                         np.dtype(dtype)))
                return t
            t = tr.hbm_tensor(name or None, dtype, dims, grid_shared=True)
            lst.append(t)
            return t
        return tr.hbm_tensor(name or None, dtype, dims, private=not (buffer == "shared_hbm"))
    layout = getattr(buffer, "layout", None) if isinstance(buffer, str) else None
    if callable(layout):  # a manual allocation (ncc.sbuf/psum.alloc, mod_alloc, auto_alloc): compiler.py
        return _placed_ndarray(tr, buffer, layout, dims, pidx[0] if pidx else 0, dtype, b, name)
    if pidx and pidx[0] > 0:
        p = pidx[0]
        storage = (dims[p],) + dims[:p] + dims[p + 1:]
        if len(storage) == 2:
            storage = storage + (1,)
        if len(storage) > 5:
            # a logical list of tiles (spec §1.2): only each (P, F..) tile is limited to 5 dims, not the number
            # of block dims; lay the blocks one after the other along the first free dim
            free = dims[p + 1:] or (1,)
            t = tr.tile(b, dtype, (dims[p], int(np.prod(dims[:p])) * free[0]) + free[1:], name=name or None)
            return BlockTensor(t, p, merged=(dims[:p], free[0]))
        return BlockTensor(tr.tile(b, dtype, storage, name=name or None), p)
    if len(dims) == 1:
        return _nl._new_tile(dims, dtype, b)
    return tr.tile(b, dtype, dims, name=name or None)


def _placed_ndarray(tr, buffer, layout, dims, p, dtype, b, name):
    """``nl.ndarray(..., buffer=ncc.sbuf.mod_alloc(...))``: the tensor's storage at the placement's address;
    blocks that the placement maps to one physical tile share its storage (as on hardware)."""
    blocks, free = dims[:p], dims[p + 1:]
    if not free:
        free = (1,)
    tile_bytes = int(np.prod(free)) * np.dtype(dtype).itemsize
    got = layout(blocks, tile_bytes, int(_nl.tile_size.psum_bank_fmax_bytes))
    if got is None:  # auto_alloc(): the compiler model places it
        return ndarray(blocks + (par_dim(dims[p]),) + dims[p + 1:] if blocks else dims, dtype, buffer=str(buffer),
                       name=name)
    address, slots, stride, slot_of = got
    if not blocks:
        return tr.tile(b, dtype, (dims[p],) + free, name=name or None, address=address)
    f0 = None
    if stride != tile_bytes:  # slots further apart than a tile: pad the first free dim to the stride
        row = int(np.prod(free[1:])) * np.dtype(dtype).itemsize
        if stride % row:
            raise make_error("BadPlacement", "{!r}: tiles {} bytes apart cannot hold a ({}) {} tile "
                             "evenly".format(buffer, stride, ", ".join(map(str, free)), np.dtype(dtype).name))
        f0, free = free[0], (stride // row,) + free[1:]
    t = tr.tile(b, dtype, (dims[p], slots) + free, name=name or None, address=address)
    return BlockTensor(t, p, placed=(blocks, slot_of, f0))


def _fill(t, value):
    st = t._t if isinstance(t, BlockTensor) else t
    if not isinstance(value, (int, float, np.integer, np.floating, np.bool_)):
        raise make_error("BadArgument", "the fill value of nl.full / zeros / ones must be a number, got {!r}".format(
            value))
    if st.buffer == "hbm":
        if np.issubdtype(st.dtype, np.integer) or st.dtype == np.bool_:
            value = _tr.int_immediate(value, "fill value")
        _nl.fill_hbm(st, value, "nl.zeros / ones / full")
        return t
    if np.issubdtype(st.dtype, np.integer) or st.dtype == np.bool_:
        value = _tr.int_immediate(value, "fill value")
    _nisa.memset(st, value)
    _tr.current("nl.zeros").note_fill(st.name, zero=not isinstance(value, bool) and value == 0)
    return t


def zeros(shape, dtype, *, buffer=None, name="", lazy_initialization=False, **kwargs):
    """``nl.zeros``. ``lazy_initialization=`` (the flash attention samples' accumulators; not in the spec) is
    accepted and changes nothing: the tile is zero-filled as without it, and the fill dropped when the tile is
    next overwritten whole (a dead store; decision, docs/timing-model.md)."""
    return _fill(ndarray(shape, dtype, buffer=buffer, name=name), 0)


def ones(shape, dtype, *, buffer=None, name="", lazy_initialization=False, **kwargs):
    return _fill(ndarray(shape, dtype, buffer=buffer, name=name), 1)


def full(shape, fill_value, dtype, *, buffer=None, name="", lazy_initialization=False, **kwargs):
    return _fill(ndarray(shape, dtype, buffer=buffer, name=name), fill_value)


def zeros_like(a, dtype=None, *, buffer=None, name="", **kwargs):
    return zeros(a.shape, dtype or a.dtype, buffer=buffer, name=name)


def empty_like(a, dtype=None, *, buffer=None, name="", **kwargs):
    b = buffer if buffer is not None else (a.buffer if a.buffer != "hbm" else shared_hbm)
    return ndarray(a.shape, dtype or a.dtype, buffer=b, name=name)


def ones_like(a, dtype=None, *, buffer=None, name="", **kwargs):
    return ones(a.shape, dtype or a.dtype, buffer=buffer, name=name)


def full_like(a, fill_value, dtype=None, *, buffer=None, name="", **kwargs):
    return full(a.shape, fill_value, dtype or a.dtype, buffer=buffer, name=name)


# --------------------------------------------------------------------------------------------------
# Value-returning functions (§3.6)
# --------------------------------------------------------------------------------------------------

_PREFIX = "neuronxcc.nki.language"


_BOOL_RESULT = frozenset(("equal", "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and",
                          "logical_or", "logical_xor", "logical_not"))


class B1OpCode(OpCode):
    """A Beta-1 op code: the same op code as the new dialect, callable with ``mask=``; comparisons and logical
    functions default to ``dtype=nl.bool_`` (spec §3.3; values 1/0, computed in fp32)."""

    __slots__ = ()

    def __call__(self, *args, mask=None, **kwargs):
        if self.name in _BOOL_RESULT and kwargs.get("dtype") is None:
            kwargs["dtype"] = bool_
        for a in args:
            if isinstance(a, BlockTensor):
                raise make_error("TileInference", "err_failed_to_infer_tile_from_local_tensor")
        if _is_mask(mask):
            if self.name in ("sum", "max", "min", "prod") or "axis" in kwargs:
                args, kw = list(args), dict(kwargs)
                x = args.pop(0) if args else kw.pop("x")
                axis = args.pop(0) if args else kw.pop("axis")
                if args:
                    kw["dtype"] = args.pop(0)
                if args:
                    kw["keepdims"] = args.pop(0)
                keepdims = bool(kw.pop("keepdims", False))
                return masked_reduce(lambda t: _nl._call_opcode(self, (t, axis), dict(kw, keepdims=True), _PREFIX),
                                     x, axis, keepdims, mask, "nl." + self.name)
            return masked_elementwise(lambda *a: _nl._call_opcode(self, a, kwargs, _PREFIX), args, mask,
                                      "nl." + self.name)
        return _nl._call_opcode(self, args, kwargs, _PREFIX)


def masked_elementwise(fn, args, mask, what, dtype=None, out=None):
    """Run the element-wise value function ``fn`` only inside the mask's rectangle: the tile arguments of the
    full shape are restricted to it, and its instruction writes that part of a fresh full-size tile (``out``:
    that part of ``out``; the rest stays unwritten)."""
    tiles = [a for a in args if isinstance(a, NkiTensor)]
    if not tiles:
        raise make_error("BadOperandKind", "{}: no tile operand".format(what))
    shape = tuple(_b.max((t.shape for t in tiles), key=math.prod))
    boxes = [mask] if isinstance(mask, list) else mask_boxes(mask, shape)  # (a list: one box of a split mask)
    if len(boxes) > 1:  # a non-rectangular mask: one instruction per box of its true region (spec §3.8)
        _note_split_starts(boxes)
        kept = getattr(out, "_box", None)
        if out is None:
            guess = dtype
            for t in ([] if dtype is not None else tiles):
                guess = t.dtype if guess is None else _nl.promote(guess, t.dtype)
            out = _nl._new_tile(shape, guess)
            res = out
        else:
            res = None
        for box in boxes:
            masked_elementwise(fn, args, list(box), what, dtype, out)
        if isinstance(out, Tensor):
            out._box = kept if res is None else None
        if res is not None:
            res._parts = [list(b) for b in boxes]
        return out
    box = boxes[0] if boxes else None
    res_full = None
    if box is None:  # masked off everywhere: nothing runs, nothing is written
        return out if out is not None else nothing(shape, dtype if dtype is not None else tiles[0].dtype)
    sub = []
    for a in args:
        if isinstance(a, NkiTensor) and tuple(a.shape) == shape:
            sub.append(_restrict(a, box))
        elif isinstance(a, NkiTensor) and a.shape[0] == shape[0] and _nl._free_elems(a) == 1:
            sub.append(NkiTensor.__getitem__(a, (slice(box[0][0], box[0][1]),) + (slice(None),) * (a.ndim - 1)))
        elif (isinstance(a, NkiTensor) and a.ndim == len(shape)
              and _b.all(n == s or n == 1 for n, s in zip(a.shape, shape))):
            # a broadcasting operand (a [1, F] row against [P, F], spec 3.10): cut its full-size dims to the box
            sub.append(NkiTensor.__getitem__(a, tuple(slice(lo, hi) if n == s else slice(None)
                                                      for (lo, hi), n, s in zip(box, a.shape, shape))))
        else:
            sub.append(a)
    if out is None:
        guess = dtype
        for t in ([] if dtype is not None else tiles):
            guess = t.dtype if guess is None else _nl.promote(guess, t.dtype)
        out = _run_into(fn, sub, shape, box, dtype, guess)
    else:
        _write_part(out, box, fn(*sub), sub)
    if isinstance(out, Tensor) and _restrict(out, box) is not out:
        out._box = [tuple(b) for b in box]
    return out


def _note_split_starts(boxes):
    """A compute instruction split by a non-rectangular mask into boxes of its true region: when a box starts at a
    partition the hardware's start-partition rule does not allow for its size (a triangle's boxes are its rows), the
    tracer notes the user's line, so that the sanitizer's NSIM-W509 for those boxes, nsim's own lowering and not a
    view the kernel wrote, is not reported (tracer.run)."""
    for box in boxes:
        lo, hi = box[0]
        n = hi - lo
        if lo % (128 if n > 64 else 64 if n > 32 else 32):
            tr = _tr.active()
            if tr is not None:
                loc = _tr.user_loc()
                tr.split_sites.add((loc["file"], loc["line"]))
            return


def _run_into(fn, args, shape, box, dtype, guess):
    """``fn(*args)`` (a value function) written into the ``box`` part of a fresh tile of ``shape``, returned. The
    tile is made first (``dtype``, else the ``guess`` of fn's result dtype; made again if fn's result has
    another), so that fn's instruction can write into it."""
    out = _nl._new_tile(shape, dtype if dtype is not None else guess)
    r = fn(*args)
    if dtype is None and np.dtype(r.dtype) != np.dtype(out.dtype):
        out = _nl._new_tile(shape, r.dtype)
    _write_part(out, box, r, args)
    return out


def _write_part(out, box, r, args):
    """Put ``r`` (a value function's result on ``args``) in the ``box`` part of ``out``: the instruction that made
    r writes there instead (as the masked instruction does on hardware); a copy only where it cannot (r is one
    of the arguments, or the last instruction did not write r whole)."""
    part = _restrict(out, box)
    own = isinstance(r, NkiTensor) and not _b.any(isinstance(a, NkiTensor) and a._st is r._st for a in args)
    if not (own and _retarget_fresh(part, r, reuse=False)):
        _nisa.tensor_copy(dst=part, src=r)


def masked_reduce(fn, x, axis, keepdims, mask, what):
    """A reduction under ``mask=`` (evaluated over the input space, §3.8): ``fn`` (a keepdims reduction) runs
    on the part of ``x`` inside the mask's rectangle and writes that part of a fresh result tile (result
    positions outside the mask stay unwritten)."""
    if not isinstance(x, NkiTensor):
        raise make_error("BadOperandKind", "{}: x must be a tile, got {!r}".format(what, _tr.shown(x)))
    axes = _nl._axes(x, axis, what.split(".")[-1])
    box = mask_box(mask, x.shape)
    kshape = [1 if a in axes else n for a, n in enumerate(x.shape)]
    if box is None:
        out = _nl._new_tile(kshape, x.dtype)
    else:
        obox = [(0, 1) if a in axes else lh for a, lh in enumerate(box)]
        out = _run_into(fn, (_restrict(x, box),), kshape, obox, None, x.dtype)
    res = out if keepdims else _nl._drop(out, axes)
    if box is not None and isinstance(res, Tensor):
        res._box = [tuple(lh) for a, lh in enumerate(obox) if keepdims or a not in axes]
    elif box is None and isinstance(res, Tensor):
        res._box = ()  # masked off everywhere: nothing written
    return res


_B1OPS = {}
for _name, _op in list(_nl._OPS.items()):
    _B1OPS[_name] = B1OpCode(_op.name, _op.alu, _op.act)
    globals()[_name] = _B1OPS[_name]
for _name, _alu in (("sum", "add"), ("max", "maximum"), ("min", "minimum"), ("prod", "multiply")):
    _B1OPS[_name] = B1OpCode(_name, _alu)
    globals()[_name] = _B1OPS[_name]
identity = _B1OPS.get("copy")
_nl_copy = _B1OPS.get("copy")


def mean(x, axis, *, dtype=None, keepdims=False, mask=None, **kwargs):
    """``nl.mean``; under ``mask=`` the mean of the masked elements (the count is the mask's)."""
    if _is_mask(mask):
        return masked_reduce(lambda t: _nl.mean(t, axis, dtype=dtype, keepdims=True), x, axis, keepdims, mask,
                             "nl.mean")
    return _nl.mean(x, axis, dtype=dtype, keepdims=keepdims)


def transpose(x, *, dtype=None, mask=None, **kwargs):
    """``nl.transpose``; under ``mask=`` (over x's index expressions or the result's) only the masked part is
    transposed into the fresh result (the rest stays unwritten)."""
    _nl._tensor_arg(x, "transpose")
    shape = (x.shape[1], x.shape[0]) if x.ndim == 2 else tuple(x.shape)
    if skipped(mask):
        return nothing(shape, dtype if dtype is not None else x.dtype, "psum")
    if not _is_mask(mask):
        return _nl.transpose(x, dtype=dtype)
    boxes = transpose_mask(mask, x, "nl.transpose")
    if boxes is None:
        return nothing(shape, dtype if dtype is not None else x.dtype, "psum")
    out = _nl._new_tile(shape, x.dtype, "psum")
    _nisa.nc_transpose(dst=_boxed(out, boxes[1]), data=_nl._to_sbuf(_restrict(x, boxes[0])))
    return cast_box(out, dtype, boxes[1])


def _boxed(out, box):
    """``out`` restricted to ``box``, marking ``out`` as written only there (a masked instruction's result)."""
    if _b.all(lo == 0 and hi == n for (lo, hi), n in zip(box, out.shape)):
        return out
    out._box = [tuple(b) for b in box]
    return _restrict(out, box)


def cast_box(out, dtype, box):
    """A masked result ``out`` (written in ``box`` only) as ``dtype``: the written part copied with a cast."""
    if dtype is None or np.dtype(dtype) == out.dtype:
        return out
    cast = _nl._new_tile(tuple(out.shape), dtype)
    _nisa.tensor_copy(dst=_boxed(cast, box), src=_restrict(out, box))
    return cast


def operand_masks(stat, mov, mask):
    """The operand masks of ``t[cond]`` views (Tensor._operand_mask) folded into a matmul's ``mask=``: the operands
    as plain views (keeping the subscript's variables for operand_mask_ranges) and the combined mask."""
    ms = [x._opmask for x in (stat, mov) if getattr(x, "_opmask", None) is not None]
    if not ms:
        return stat, mov, mask

    def plain(x):
        if getattr(x, "_opmask", None) is None:
            return x
        w = NkiTensor.__getitem__(x, (slice(None),) * x.ndim)
        w._keys = x._keys
        return w
    if mask is not False:
        for m in ms:
            mask = m if not _is_mask(mask) else _Mask(mask, m, "&")
    return plain(stat), plain(mov), mask


def masked_matmul(stat, mov, mask, what, issue, stat_dims=("k", "m")):
    """A matmul under ``mask=``: operand masks restricting K (the partitions of both), M (the stationary's free
    dim) and N (the moving's free dim) separately (spec §3.8), or conditions on the result's index expressions.
    ``stat_dims``: the stationary operand's dims as passed (``("m", "k")``: nl.matmul's x without transpose_x).
    ``issue(dst, stat, mov)`` issues the matmul of the restricted operands into ``dst``, the masked part of a
    fresh fp32 ``[M, N]`` PSUM tile, and returns its statement; the rest of the result stays unwritten
    (``psum[...] += ...`` adds only that part)."""
    for t, nm in ((stat, "stationary"), (mov, "moving")):
        if not isinstance(t, NkiTensor) or t.ndim != 2 and (nm == "stationary" or t.ndim < 2):
            raise make_error("NotSupported", "{} under mask= needs a 2-D stationary and a moving of 2 or more "
                             "dims ({} is {})".format(what, nm, tuple(t.shape) if isinstance(t, NkiTensor) else t))
    size = dict(zip(stat_dims, (int(n) for n in stat.shape)))
    # the moving's free dims (several: a conv's shifted window [C_in, OH, OW]) are the result's N dims
    mfree = tuple(int(x) for x in mov.shape[1:])
    ndims = ("n",) if len(mfree) == 1 else tuple("n{}".format(i) for i in range(len(mfree)))
    m, n = size["m"], int(np.prod(mfree))
    r = operand_mask_ranges(mask, [(tuple(stat.shape), stat_dims, getattr(stat, "_keys", None), False),
                                   ((int(mov.shape[0]),) + mfree, ("k",) + ndims, getattr(mov, "_keys", None), False),
                                   ((m,) + mfree, ("m",) + ndims, None, True)], what)
    if r is None:
        return nothing((m, n), np.float32, "psum")
    nbox = [r[d] for d in ndims]
    if _b.all(tuple(b) == (0, x) for b, x in zip(nbox, mfree)):
        out = _nl._new_tile((m, n), np.float32, "psum")  # [M, N] as unmasked; only M (and K) restricted
        obox = [r["m"], (0, n)]
    else:
        out = _nl._new_tile((m,) + mfree, np.float32, "psum")
        obox = [r["m"]] + nbox
    out._mm = issue(_boxed(out, obox), _restrict(stat, [r[d] for d in stat_dims]), _restrict(mov, [r["k"]] + nbox))
    return out


def matmul(x, y, *, transpose_x=False, mask=None, **kwargs):
    """``nl.matmul``: a fresh fp32 PSUM tile; ``psum[...] += nl.matmul(...)`` accumulates; ``mask=False``
    issues nothing; a mask (:func:`masked_matmul`) computes the part of the result it selects."""
    x, y, mask = operand_masks(x, y, mask)
    if skipped(mask):
        return nothing((x.shape[-1] if transpose_x else x.shape[0], y.shape[-1]), np.float32, "psum")
    tr = _tr.current("nl.matmul")
    if _is_mask(mask):
        def issue(dst, s, mv):
            _nisa.nc_matmul(dst=dst, stationary=_nl._to_sbuf(s) if transpose_x else _nl.copy_(_nl.transpose(s)),
                            moving=_nl._to_sbuf(mv), accumulate=False)
            return tr.body[-1]
        return masked_matmul(x, y, mask, "nl.matmul", issue, ("k", "m") if transpose_x else ("m", "k"))
    out = _nl.matmul(x, y, transpose_x=transpose_x)
    if tr.body and tr.body[-1].get("op") == "nc_matmul":
        out._mm = tr.body[-1]
    return out


def _numpy_index_shape(src):
    """The tile shape numpy indexing gives an arange subscript with index axes of size 1 that index no dim of the
    tensor (``a[h, i * L + i_p]`` of a 2-D ``a``, ``ids[i * 128 + i_p]`` of a 1-D ``ids``: (L, 1); ``x[i_p, i_g]``
    with i_g = nl.arange(n)[None, None, :]: (P, 1, n); spec §3.8: the broadcast shape of the items), where the view
    itself has fewer dims (the same elements, the same partitions); None when it is the view's."""
    if isinstance(src, Tensor) and src._adv is not None and not src._t2d:
        rshape, shp = tuple(src._adv[2]), tuple(src.shape)
        if len(rshape) > len(shp) and shp and rshape[0] == shp[0] and _squeezed(rshape) == _squeezed(shp):
            return rshape
    return None


def _squeezed(shape):
    return tuple(n for n in shape if n != 1)


def _hbm_side(t, api, operand):
    """nl.load reads HBM and nl.store writes it (nki-api.md 2.0: err_unsupported_memory, "Expected operand 'src'
    of 'load' to be in address space 'hbm', but got a tile in 'sbuf'"): an on-chip tile there is an error (copy
    between on-chip tiles with nl.copy or assignment)."""
    if isinstance(t, NkiTensor) and t.buffer in ("sbuf", "psum"):
        raise make_error("BadBuffer", "Expected operand '{}' of '{}' to be in address space 'hbm', but got a tile in "
                         "'{}' (err_unsupported_memory; copy between on-chip tiles with nl.copy or an "
                         "assignment)".format(operand, api, t.buffer))


def load(src, *, mask=None, dtype=None, **kwargs):
    """``nl.load(src, mask=, dtype=)``; a mask loads only the positions where it holds (the rest of the tile
    stays unwritten): one DMA per box of its true region (one for a rectangular mask)."""
    _hbm_side(src, "load", "src")
    if isinstance(src, Tensor) and src._t2d:
        # a transposed window (``k[j * 128 + i_f, i_p]``): a DMA transpose; under a mask (over the window's
        # index expressions: ``j * 128 + i_f < S`` on a ragged last tile) only the part where it holds
        box = mask_box(mask, src.shape) if _is_mask(mask) else [(0, int(n)) for n in src.shape]
        if box is None:
            return nothing(tuple(src.shape), dtype if dtype is not None else src.dtype)
        out = _tr.current("nl.load").tile("sbuf", src.dtype, tuple(src.shape))
        _nisa.dma_transpose(dst=_boxed(out, box), src=src._storage_order(box if _is_mask(mask) else None))
        if out._box is not None:
            return cast_box(out, dtype, box)
        return out if dtype is None or np.dtype(dtype) == out.dtype else _nl.copy_(out, dtype=dtype)
    shp = _numpy_index_shape(src)
    if not _is_mask(mask):
        if shp is None:
            return _nl.load(src, dtype=dtype)
        out = _nl._new_tile(shp, dtype if dtype is not None else src.dtype)
        _nisa.dma_copy(dst=out, src=src)
        return out
    if not isinstance(src, NkiTensor):
        raise make_error("BadOperandKind", "nl.load: src must be a tensor, got {!r}".format(_tr.shown(src)))
    out = _nl._new_tile(shp or src.shape, dtype if dtype is not None else src.dtype)
    boxes = mask_boxes(mask, shp or src.shape)
    if len(boxes) > 1:  # a non-rectangular mask (padding): one DMA per box of its true region (spec §3.8)
        for box in boxes:
            obox = list(box) + [(0, 1)] * (len(out.shape) - len(box))
            _nisa.dma_copy(dst=_restrict(out, obox), src=_restrict(src, box))
        out._parts = [list(b) + [(0, 1)] * (len(out.shape) - len(b)) for b in boxes]
        return out
    box = boxes[0] if boxes else None
    if box is not None:
        obox = list(box) + [(0, 1)] * (len(out.shape) - len(box))
        _nisa.dma_copy(dst=_boxed(out, obox), src=_restrict(src, box))
    else:
        out._box = ()  # masked off everywhere: nothing loaded
    return out


def store(dst, value, *, mask=None, **kwargs):
    """``nl.store(dst, value, mask=)``; a mask stores only the positions where it holds (one DMA per box)."""
    if isinstance(value, BlockTensor):
        raise make_error("TileInference", "err_failed_to_infer_tile_from_local_tensor")
    _hbm_side(dst, "store", "dst")
    if isinstance(dst, Tensor) and dst._t2d:
        if not isinstance(value, NkiTensor) or tuple(value.shape) != tuple(dst.shape):
            raise make_error("ShapeMismatch", "nl.store: a transposed window of shape {} needs a value "
                             "of that shape".format(tuple(dst.shape)))
        box = None
        if _is_mask(mask):  # only the part of the window where the mask holds (a ragged last tile)
            box = mask_box(mask, dst.shape)
            if box is None:
                return
            value = _restrict(value, box)
        d = dst._storage_order(box)
        if value.buffer == "psum" or value.dtype != d.dtype:
            value = _nl.copy_(value, dtype=d.dtype)
        _nisa.dma_transpose(dst=d, src=value)
        return
    if not _is_mask(mask):
        _nl.store(dst, value)
        return
    shp = _numpy_index_shape(dst)
    if shp is not None and isinstance(value, NkiTensor) and tuple(value.shape) == shp != tuple(dst.shape):
        # a 1-D ``out[i * 128 + i_p]`` (index space (128, 1), as nl.load reads it) stored from a (128, 1) tile: the
        # mask is over the index space, and cuts the value too (as for a view of the value's shape)
        for box in mask_boxes(mask, shp):
            _nl.store(_restrict(dst, box), _restrict(value, box))
        return
    boxes = mask_boxes(mask, dst.shape)  # one DMA per box (a non-rectangular mask gives several; spec §3.8)
    for box in boxes:
        part = value
        if isinstance(value, NkiTensor) and tuple(value.shape) == tuple(dst.shape):
            part = _restrict(value, box)
        _nl.store(_restrict(dst, box), part)


def load_transpose2d(src, *, mask=None, dtype=None, **kwargs):
    """``nl.load_transpose2d``: an SBUF tile ``src.T`` (a DMA transpose); under ``mask=`` (over src's index
    expressions or the result's) only the masked part is loaded (the rest stays unwritten)."""
    tr = _tr.current("nl.load_transpose2d")
    if not isinstance(src, NkiTensor):
        raise make_error("BadOperandKind", "nl.load_transpose2d: src must be a tensor, got {!r}".format(_tr.shown(src)))
    if src.ndim != 2:
        raise make_error("BadRank", "nl.load_transpose2d needs a 2-D source")
    shape = (src.shape[1], src.shape[0])
    if skipped(mask):
        return nothing(shape, dtype if dtype is not None else src.dtype)
    boxes = transpose_mask(mask, src, "nl.load_transpose2d") if _is_mask(mask) else [[(0, n) for n in src.shape],
                                                                                        [(0, n) for n in shape]]
    if boxes is None:
        return nothing(shape, dtype if dtype is not None else src.dtype)
    out = tr.tile("sbuf", src.dtype, shape)
    _nisa.dma_transpose(dst=_boxed(out, boxes[1]), src=_restrict(src, boxes[0]))
    if out._box is not None:
        return cast_box(out, dtype, boxes[1])
    if dtype is not None and np.dtype(dtype) != out.dtype:
        return _nl.copy_(out, dtype=dtype)
    return out


def broadcast_to(src, *, shape, **kwargs):
    """``nl.broadcast_to(src, shape=)`` / ``t.broadcast_to(shape)`` (§3.10): an HBM tensor gives a stride-0
    view (``nl.load`` of it is one DMA); a tile gives a fresh tile (a (1, F) partition dim is copied onto
    every partition by :func:`nsim.nki.language.partition_broadcast`)."""
    shape = tuple(int(s) for s in shape)
    if tuple(src.shape) == shape:
        return src
    v = _nl.broadcast_to(src, shape)
    if v.buffer == "hbm" or v.is_full():
        return v
    out = _nl._new_tile(shape, src.dtype)
    _nisa.tensor_copy(dst=out, src=v)
    return out


def softmax(x, axis=-1, *, dtype=None, compute_dtype=None, mask=None, **kwargs):
    """``nl.softmax`` over the last free dim: max (V), exp(x - max) with sum (S), reciprocal * (V). Under
    ``mask=`` the softmax of the masked rectangle (over its columns), written there only."""
    if _is_mask(mask):
        return masked_elementwise(lambda t: softmax(t, axis, dtype=dtype, compute_dtype=compute_dtype), (x,), mask,
                                  "nl.softmax", dtype)
    _nl._tensor_arg(x, "softmax")
    if x.ndim != 2 or int(axis) not in (1, -1):
        raise make_error("NotSupported", "nl.softmax supports 2-D tiles over axis 1 only")
    mx = _nl._new_tile((x.shape[0], 1), np.float32)
    _nisa.tensor_reduce(dst=mx, op=_nl.maximum, data=x, axis=1, negate=True)
    e = _nl._new_tile(x.shape, np.float32)
    s = _nl._new_tile((x.shape[0], 1), np.float32)
    _nisa.activation(dst=e, op=_nl.exp, data=x, bias=mx, reduce_res=s, reduce_cmd=_nisa.reduce_cmd.reset_reduce)
    r = _nl._new_tile((x.shape[0], 1), np.float32)
    _nisa.reciprocal(dst=r, data=s)
    out = _nl._new_tile(x.shape, dtype if dtype is not None else x.dtype)
    _nisa.tensor_scalar(dst=out, data=e, op0=_nl.multiply, operand0=r)
    return out


def static_cast(x, dtype):
    """``nl.static_cast(x, dtype)``: a converting copy of a tile; of an array (a host-side helper tests use, outside
    any kernel), a numpy cast with ml_dtypes' round-to-nearest-even (nki-api.md 3.2)."""
    if not isinstance(x, NkiTensor):
        return np.asarray(x).astype(dtype)
    return copy(x, dtype=dtype)


def device_print(prefix, x, *, mask=None, **kwargs):
    """``nl.device_print(prefix, x)``: prints ``prefix`` and the current values of ``x`` right away (eager
    mode: the instructions traced so far run in the simulator core)."""
    _tr.device_print(prefix, x)
    return None


def expand_dims(x, axis):
    """``nl.expand_dims(x, axis)``: a view with a size-1 dim inserted at ``axis``."""
    return x.expand_dim(axis)


def _elementwise(fn, what):
    def f(x, *, dtype=None, mask=None, **kwargs):
        if _is_mask(mask):
            return masked_elementwise(lambda t: fn(t, dtype=dtype), (x,), mask, what)
        return fn(x, dtype=dtype)
    return f


floor = _elementwise(_nl.floor, "nl.floor")
ceil = _elementwise(_nl.ceil, "nl.ceil")
trunc = _elementwise(_nl.trunc, "nl.trunc")
for _f, _n in ((floor, "floor"), (ceil, "ceil"), (trunc, "trunc")):
    _f.__name__ = _f.__qualname__ = _n
    _f.__module__ = __name__
    _f.__doc__ = "``nl.{}(x, dtype=None, mask=None)`` (see nsim.nki.language.{}).".format(_n, _n)


def all(x, axis, *, dtype=None, mask=None, **kwargs):  # noqa: A001 - NKI name
    """``nl.all(x, axis)`` (Beta 1 has no keepdims)."""
    if _is_mask(mask):
        return masked_reduce(lambda t: _nl._reduce_into("logical_and", _nl.not_equal(t, 0.0, dtype=np.float32),
                                                        _nl._axes(t, axis, "all"), dtype or x.dtype),
                             x, axis, False, mask, "nl.all")
    return _nl.all(x, axis, dtype=dtype)


def var(x, axis, *, dtype=None, mask=None, **kwargs):
    """``nl.var(x, axis)``: population variance over ``axis`` (reduced dims kept); under ``mask=`` of the masked
    elements (the count is the mask's)."""
    if _is_mask(mask):
        return masked_reduce(lambda t: _nl.var(t, axis, dtype=dtype), x, axis, True, mask, "nl.var")
    return _nl.var(x, axis, dtype=dtype)


def rms_norm(x, w, axis, n, epsilon=1e-06, *, dtype=None, compute_dtype=None, mask=None, **kwargs):
    """``nl.rms_norm``. Under ``mask=`` (spec 3.6: every value function takes one in Beta 1) the norm of the masked
    rectangle's rows (over its columns, n as given), written there only: a ragged row tile, as nl.softmax."""
    if _is_mask(mask):
        return masked_elementwise(lambda t, g: _nl.rms_norm(t, g, axis, n, epsilon=epsilon, dtype=dtype), (x, w),
                                  mask, "nl.rms_norm", dtype)
    _check_mask(mask, "nl.rms_norm")
    return _nl.rms_norm(x, w, axis, n, epsilon=epsilon, dtype=dtype)


def where(condition, x, y, *, dtype=None, mask=None, **kwargs):
    """``nl.where(condition, x, y)``: x where condition is nonzero, else y."""
    if _is_mask(mask):
        return masked_elementwise(lambda c, a, b: _nl.where(c, a, b, dtype=dtype), (condition, x, y), mask,
                                  "nl.where")
    return _nl.where(condition, x, y, dtype=dtype)


def _iota_value(e, dtype):
    from . import isa as _b1isa
    return _b1isa.iota(e, dtype)


# --------------------------------------------------------------------------------------------------
# Launch grid (§1.5)
# --------------------------------------------------------------------------------------------------


class _CoreDim(int):
    """A grid dim of some size whose ``lnc_cores`` factor places instances on physical cores."""

    def __new__(cls, n, cores=1):
        obj = int.__new__(cls, int(n))
        obj.lnc_cores = int(cores)
        return obj

    def __mul__(self, other):
        if isinstance(other, (int, np.integer)):
            return _CoreDim(int(self) * int(other), self.lnc_cores * getattr(other, "lnc_cores", 1))
        return NotImplemented

    __rmul__ = __mul__


class spmd_dim(_CoreDim):  # noqa: N801
    """``nl.spmd_dim(a, b, ...)``: a grid dim of size prod(args); its ``nl.nc(k)`` factors place the
    instances on k physical cores (docs/lnc.md)."""

    def __new__(cls, *args):
        n, cores = 1, 1
        for a in args:
            n *= int(a)
            cores *= getattr(a, "lnc_cores", 1)
        return _CoreDim.__new__(cls, n, cores)


class nc(_CoreDim):  # noqa: N801
    """``nl.nc(k)``: k physical cores (a grid dim of size k); ``nl.nc(k) * n`` is size k*n on k cores."""

    def __new__(cls, k):
        return _CoreDim.__new__(cls, int(k), int(k))


def program_id(axis):
    st = _grid_state()
    ids = st.get("ids", ())
    axis = int(axis)
    if not ids:
        if axis == 0:
            return 0
        raise make_error("BadLaunchGrid", "nl.program_id({}): the kernel has no launch grid".format(axis))
    if not 0 <= axis < len(ids):
        raise make_error("BadLaunchGrid", "nl.program_id({}): the grid has {} dims".format(axis, len(ids)))
    return ids[axis]


def num_programs(axes=None):
    st = _grid_state()
    grid = st.get("grid", ())
    if axes is None:
        n = 1
        for g in grid:
            n *= g
        return n
    if not grid:
        return 1
    axs = [axes] if isinstance(axes, (int, np.integer)) else list(axes)
    n = 1
    for a in axs:
        n *= grid[int(a)]
    return n


def program_ndim():
    return len(_grid_state().get("grid", ()))


# Keyword checking of the public functions (one place: nsim.nki._api)
def shared_constant(constant, dtype=None, **kwargs):
    """``nl.shared_constant(constant, dtype=None)``: an HBM tensor holding the array (or ``.npy`` file)."""
    return _nl.shared_constant(constant, dtype=dtype)


def shared_identity_matrix(n, dtype=np.uint8, **kwargs):
    """``nl.shared_identity_matrix(n, dtype=uint8)`` (Beta 1): an HBM n x n identity (like shared_constant)."""
    return _nl.shared_constant(np.eye(int(n), dtype=np.float32).astype(dtype))


def rand(shape, dtype=np.float32, **kwargs):
    """``nl.rand(shape, dtype=np.float32)`` (Beta 1): uniform [0, 1) values in a fresh SBUF tile."""
    return _nl.rand(shape, dtype, buffer=kwargs.pop("buffer", None))


def random_seed(seed, *, mask=None):
    """``nl.random_seed(seed)`` (Beta 1): seed the PRNG (a [1, 1] integer tile, or an int)."""
    _check_mask(mask, "nl.random_seed")
    _nl.random_seed(seed)


def gather_flattened(data, indices, axis=0, *, dtype=None, mask=None):
    """``nl.gather_flattened(data, indices)`` (Beta 1): ``out[p, ...] = data_flat[p, indices[p, ...]]``."""
    _check_mask(mask, "nl.gather_flattened")
    return _nl.gather_flattened(data, indices, axis=axis, dtype=dtype)


def dropout(x, rate, *, dtype=None, mask=None, **kwargs):
    """``nl.dropout(x, rate)`` (Beta 1): a fresh tile, each element zeroed with probability ``rate``."""
    if skipped(mask):
        return nothing(x.shape, dtype if dtype is not None else x.dtype)
    if _is_mask(mask):
        return masked_elementwise(lambda t: _nl.dropout(t, rate, dtype=dtype), (x,), mask, "nl.dropout", dtype)
    return _nl.dropout(x, rate, dtype=dtype)


def atomic_rmw(dst, value, op, *, mask=None):
    """``nl.atomic_rmw(dst, value, op)`` (Beta 1): ``dst = op(dst, value)`` on an HBM view, usually with
    indirect (tile) indices ``dst[idx_tile[i_p, 0], i_f]``; ``op`` only ``np.add``. A mask (rectangular, as
    on ``nl.store``) updates only the positions where it holds."""
    if _is_mask(mask) and not isinstance(mask, (bool, np.bool_)):
        box = mask_box(mask, dst.shape)
        if box is None:
            return
        if isinstance(value, NkiTensor) and tuple(value.shape) == tuple(dst.shape):
            value = _restrict(value, box)
        dst = _restrict(dst, box)
        mask = None
    _check_mask(mask, "nl.atomic_rmw")
    _nl.atomic_rmw(dst, value, op)


from .._unsupported import install as _install_unsupported  # noqa: E402

_install_unsupported(globals(), _PREFIX, {
    'all_reduce': 'x, op, program_axes, *, dtype=None, mask=None, parallel_reduce=True, asynchronous=False',
})

from .._api import publish as _publish  # noqa: E402

_publish(globals(), _PREFIX)

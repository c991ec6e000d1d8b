"""``nki.compiler`` (and Beta-1 ``neuronxcc.nki.compiler``): compiler directives, accepted as no-ops.

- decorators ``skip_middle_end_transformations``, ``enable_stack_allocator``, ``force_auto_alloc``:
  usable bare (``@d``) or called (``@d(...)``); return the kernel unchanged;
- context managers ``no_reorder()`` (nsim's ``nl.no_reorder`` when it exists), ``allocation_scope()``,
  ``multi_buffer(factor)``;
- ``sbuf`` / ``psum`` with ``.alloc(func)``, ``.mod_alloc(...)``, ``.auto_alloc()``: allocation objects
  given as ``buffer=`` of ``nl.ndarray``; they compare equal to "sbuf"/"psum". The placement is honoured
  (compiler.md 4; docs/timing-model.md "Manual placement"): the tensor's storage starts at the given byte
  offset of each partition, and the blocks of a tensor with block dims share the physical tiles the
  allocator gives them (``mod_alloc(num_free_tiles=(2,))`` on 4 blocks: blocks 0 and 2 share one tile),
  so capacity and the overwrites a reused tile implies are those of the hardware. Partition offsets
  (``base_partition``, ``num_par_tiles``, a function's start partition) do not move tiles (tiles span
  all partitions in nsim).
"""
from __future__ import annotations

import functools as _functools


def _noop_decorator(name):
    def deco(fn=None, *args, **kwargs):
        if callable(fn) and not args and not kwargs:
            return fn
        return lambda f: f

    deco.__name__ = deco.__qualname__ = name
    deco.__doc__ = "``@nki.compiler.{}``: accepted, no effect in nsim.".format(name)
    return deco


skip_middle_end_transformations = _noop_decorator("skip_middle_end_transformations")
enable_stack_allocator = _noop_decorator("enable_stack_allocator")
force_auto_alloc = _noop_decorator("force_auto_alloc")


class _NullContext:
    """A no-op context manager, also usable as a decorator and as a ``directives=`` value."""

    def __init__(self, name, *args, **kwargs):
        self._name = name
        self.args, self.kwargs = args, kwargs
        self._inner = None

    def __enter__(self):
        if self._name == "no_reorder":
            import nsim.nki.language as _nl

            nr = getattr(_nl, "no_reorder", None)
            if nr is not None:
                self._inner = nr()
                self._inner.__enter__()
        return self

    def __exit__(self, *exc):
        if self._inner is not None:
            inner, self._inner = self._inner, None
            return inner.__exit__(*exc)
        return False

    def __call__(self, fn):
        @_functools.wraps(fn)
        def wrapped(*a, **k):
            with self.__class__(self._name, *self.args, **self.kwargs):
                return fn(*a, **k)

        return wrapped

    def __repr__(self):
        return "nki.compiler.{}()".format(self._name)


def no_reorder(*args, **kwargs):
    return _NullContext("no_reorder", *args, **kwargs)


def allocation_scope(*args, **kwargs):
    return _NullContext("allocation_scope", *args, **kwargs)


def multi_buffer(factor=None, *args, **kwargs):
    return _NullContext("multi_buffer", factor, *args, **kwargs)


class Placement(str):
    """A manual allocation (``ncc.sbuf.mod_alloc(...)`` etc.) given as ``buffer=``: compares equal to its
    buffer's name; ``layout()`` says where a tensor's blocks go."""

    def __new__(cls, buffer, kind, what, **params):
        s = str.__new__(cls, buffer)
        s.kind, s.what, s.params = kind, what, params
        return s

    def __repr__(self):
        return "ncc.{}.{}({})".format(str(self), self.what,
                                      ", ".join("{}={!r}".format(k, v) for k, v in self.params.items()))

    def layout(self, blocks, tile_bytes, bank_bytes):
        """Where a tensor with block dims ``blocks`` (a tuple, () for none) whose tiles hold ``tile_bytes``
        per partition lives. Returns ``(address, slots, slot_stride, slot_of)``: the byte offset of slot 0
        in each partition, the number of physical tiles, the bytes between consecutive slots, and
        ``slot_of(block_index_tuple) -> slot``. ``None`` for ``auto_alloc()`` (the compiler places it)."""
        import itertools
        import math

        blocks = tuple(int(b) for b in blocks)
        psum = str(self) == "psum"
        if self.kind == "auto":
            return None
        if self.kind == "mod":
            base = int(self.params.get("base_addr", 0) or 0)
            key = "num_bank_tiles" if psum else "num_free_tiles"
            mods = tuple(int(m) for m in (self.params.get(key) or ()))
            if psum and not mods:
                mods = tuple(int(m) for m in (self.params.get("num_free_tiles") or ()))
            # Entries past the block dims that are 1 name one tile, which a tensor without those dims is: the
            # nki-samples rmsnorm_qkv gives its 2-D PSUM accumulator num_bank_tiles=(1,).
            while len(mods) > len(blocks) and mods[-1] == 1:
                mods = mods[:-1]
            if len(mods) > len(blocks) or any(m < 1 for m in mods):
                raise ValueError("{!r}: {} must have one positive entry per block dim of a tensor with block "
                                 "dims {}".format(self, key, blocks))
            n = tuple(min(b, m) for b, m in zip(blocks, mods + blocks[len(mods):]))
            if psum:
                base += int(self.params.get("base_bank", 0) or 0) * bank_bytes
                stride = max(bank_bytes, -(-tile_bytes // bank_bytes) * bank_bytes)  # a tile per bank
            else:
                stride = tile_bytes

            def slot_of(idx, n=n):
                s = 0
                for i, m in zip(idx, n):
                    s = s * m + int(i) % m
                return s

            return base, max(1, math.prod(n)), stride, slot_of
        # kind "func": the kernel's function gives each block's address
        func = self.params["func"]
        addr = {}
        count = math.prod(blocks) if blocks else 1
        if count > 65536:
            raise ValueError("{!r}: {} blocks is more than nsim evaluates an allocation function for".format(
                self, count))
        for idx in (itertools.product(*(range(b) for b in blocks)) if blocks else [()]):
            r = func(tuple(idx), None, tile_bytes)
            r = tuple(r) if isinstance(r, (tuple, list)) else (r,)
            if psum:
                if len(r) < 3:
                    raise ValueError("{!r}: a PSUM allocation function returns (bank, start_partition, byte_addr), "
                                     "got {!r}".format(self, r))
                a = int(r[0]) * bank_bytes + int(r[2])
            else:
                if len(r) < 2:
                    raise ValueError("{!r}: an SBUF allocation function returns (start_partition, byte_addr), "
                                     "got {!r}".format(self, r))
                a = int(r[1])
            if a < 0:
                raise ValueError("{!r}: negative address {} for block {}".format(self, a, tuple(idx)))
            addr[tuple(idx)] = a
        distinct = sorted(set(addr.values()))
        base = distinct[0]
        stride = distinct[1] - distinct[0] if len(distinct) > 1 else tile_bytes
        if any(b - a != stride for a, b in zip(distinct, distinct[1:])) or stride < tile_bytes:
            raise ValueError("{!r}: the blocks' addresses {} are not evenly spaced by at least a tile ({} bytes); "
                             "nsim needs the physical tiles of one tensor evenly spaced".format(
                                 self, distinct[:8], tile_bytes))
        pos = {a: k for k, a in enumerate(distinct)}
        return base, len(distinct), stride, (lambda idx, addr=addr, pos=pos: pos[addr[tuple(int(i) for i in idx)]])


class _AllocBuffer(str):
    """``ncc.sbuf`` / ``ncc.psum``: compares equal to the buffer name; ``.alloc(func)``, ``.mod_alloc(...)``
    and ``.auto_alloc()`` give ``Placement`` objects for ``buffer=``."""

    def alloc(self, func=None, *args, **kwargs):
        if func is None:
            func = kwargs.pop("func", None)
        if not callable(func):
            raise TypeError("ncc.{}.alloc(func): func(idx, pdim_size, fdim_size) must be callable, got {!r}".format(
                str(self), func))
        return Placement(str(self), "func", "alloc", func=func)

    def mod_alloc(self, *args, **kwargs):
        names = ("base_bank", "base_addr") if str(self) == "psum" else ("base_addr",)
        params = dict(zip(names, args))
        params.update(kwargs)
        return Placement(str(self), "mod", "mod_alloc", **params)

    def auto_alloc(self, *args, **kwargs):
        return Placement(str(self), "auto", "auto_alloc")


sbuf = _AllocBuffer("sbuf")
psum = _AllocBuffer("psum")

try:  # if nsim grows its own nki.compiler module, forward everything else to it
    import nsim.nki.compiler as _target  # type: ignore
except ImportError:
    _target = None

if _target is not None:
    from nki_cpu_simulator._delegate import delegate as _delegate

    _delegate(globals(), _target)

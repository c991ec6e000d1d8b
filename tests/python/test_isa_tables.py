"""The Python frontends read the ISA and configuration facts from the C++ tables through `_nsim` (never a
retyped list): every Python-visible set must equal the `_nsim` one, and a new ALU op or opcode row reaches
nl / nisa without Python edits. docs/config.md is generated from engines/params.def."""
import numpy as np
import pytest

from conftest import require_core  # noqa: E402

require_core()

import nsim  # noqa: E402
from nsim import _config_doc, _isa, nki, tracer  # noqa: E402
from nsim._core import _nsim  # noqa: E402
import nsim.nki.isa as nisa  # noqa: E402
import nsim.nki.language as nl  # noqa: E402


def _names(rows):
    return [r["name"] for r in rows]


def test_alu_act_dtype_lists_are_the_cpp_tables():
    assert list(nl.ALU_OPS) == _names(_nsim.alu_table()) == list(_nsim.alu_ops())
    assert list(nl.ACT_FUNCS) == list(_nsim.act_funcs())
    assert list(_isa.DTYPE_NAMES) == _names(_nsim.dtype_table()) == list(_nsim.dtypes())
    for name in _isa.DTYPE_NAMES:  # every table dtype is accepted by the tracer by name
        assert tracer.dtype_name(name) == name
    assert list(_isa.FLAGS) == list(_nsim.instr_flags())
    assert list(_isa.ENGINES) == list(_nsim.engines())
    from nsim import plot
    assert list(plot.ENGINES) == list(_nsim.engines())


def test_slot_keys_and_roles_are_the_cpp_tables():
    rows = list(_nsim.op_table()) + list(_nsim.macro_table())
    assert "nc_matmul" in _names(_nsim.macro_table())
    cpp_slots = {s["name"] for r in rows for s in r["slots"]}
    assert set(tracer._slot_keys()) == cpp_slots
    written = {s["name"] for r in rows for s in r["slots"] if s["written"]}
    read = {s["name"] for r in rows for s in r["slots"] if not s["written"]}
    assert set(_isa.WRITTEN_SLOTS) == written and set(_isa.READ_SLOTS) == read
    assert not written & read  # a slot name means the same role in every op (the tracer relies on it)
    assert set(_isa.OUT_SLOTS) == {s["name"] for r in rows for s in r["slots"] if s["role"] == "out"}
    for r in rows:
        for s in r["slots"]:
            assert s["written"] == (s["role"] in ("out", "vec_out"))
            assert s["vector"] == (s["role"] in ("vec_in", "vec_out"))


@pytest.mark.parametrize("op", ["dma_copy", "tensor_copy", "tensor_tensor", "memset", "tensor_scalar", "core_barrier",
                                "nc_transpose", "rng", "rand_set_state", "rand_get_state"])
def test_nisa_engine_choice_follows_the_opcode_row(op):
    allowed = {r["name"]: r["engines"] for r in _nsim.op_table()}[op]
    assert set(nisa._ENGINE_NAMES.values()) == set(_nsim.engines())
    for e, name in nisa._ENGINE_NAMES.items():
        if name in allowed:
            assert nisa._engine(e, op) == name
        else:
            with pytest.raises(nsim.NsimError, match="not allowed"):
                nisa._engine(e, op)


def test_value_forms_partition_the_alu_table():
    """Each ALU op of the table has exactly one kind of value-returning form, decided by its class/arity."""
    for row in _nsim.alu_table():
        n = row["name"]
        kinds = [n in nl._BINARY, n in nl._ALU_UNARY, n in nl._NO_VALUE]
        assert sum(kinds) == 1, n
        assert (n in nl._BINARY) == (row["arity"] == 2 and row["class"] != "special")
    assert set(nisa._UNARY) == {r["name"] for r in _nsim.alu_table() if r["arity"] == 1}
    assert set(nisa._CMP) == {r["name"] for r in _nsim.alu_table() if r["class"] == "compare"}


def test_every_alu_op_is_accepted_by_name_by_nl_and_nisa():
    """Acceptance of issue 15: an ALU row added to isa/alu_ops.def reaches the Python surface with no Python
    edit. Every op of `_nsim` is an nl attribute, resolves by name, and an nisa instruction traced with it
    carries it into kernel.json."""
    names = _names(_nsim.alu_table())

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        r = nl.ndarray((128, 4), nl.float32, buffer=nl.sbuf)
        for n in names:
            nisa.tensor_tensor(dst=r, data1=t, data2=t, op=getattr(nl, n))
            nisa.tensor_scalar(dst=r, data=t, op0=n, operand0=0.0 if n in nisa._UNARY_OPS else 1.0)  # (unary: 0)
        nisa.dma_copy(dst=out, src=r)
        return out

    for n in names:
        assert nl.alu_name(getattr(nl, n)) == n
        assert nl.alu_name(n) == n
    kern = nsim.trace_kernel(k, np.zeros((128, 4), np.float32))
    ops = [s for s in kern["body"] if s.get("op") in ("tensor_tensor", "tensor_scalar")]
    got_tt = [s.get("alu0", "bypass") for s in ops if s["op"] == "tensor_tensor"]
    got_ts = [s.get("alu0", "bypass") for s in ops if s["op"] == "tensor_scalar"]
    assert got_tt == names and got_ts == names


def test_tile_size_follows_the_configured_preset():
    for preset in ("trn1", "trn2", "trn3"):
        c = _nsim.config_values(preset)
        with nsim.options(config=preset):
            assert nl.tile_size.pmax == c["sbuf.partitions"]
            assert nl.tile_size.gemm_moving_fmax == c["tensor.moving_fmax"]
            assert nl.tile_size.gemm_stationary_fmax == c["tensor.pe_cols"]
            assert nl.tile_size.psum_bank_fmax_bytes == c["psum.bank_bytes"]
            # NKI reserves 16 KiB per partition of SBUF for the compiler
            assert nl.tile_size.sbuf_fmax_bytes == c["sbuf.bytes_per_partition"] - 16 * 1024
    with nsim.options(config="trn3"):
        assert nl.tile_size.gemm_moving_fmax == 4096  # trn3.yaml: tensor.moving_fmax 4096 (trn2: 512)
    with nsim.options(config="trn2"):
        assert nl.tile_size.gemm_moving_fmax == 512
        assert nl.tile_size.sbuf_fmax_bytes == 224 * 1024 - 16 * 1024  # trn2.yaml: 224KiB per partition
    with nsim.options(config="trn2", overrides={"sbuf.partitions": 64}):
        assert nl.tile_size.pmax == 64


def test_tile_size_inside_a_kernel_uses_the_kernels_config():
    seen = []

    @nki.jit
    def k(a):
        seen.append(nl.tile_size.gemm_moving_fmax)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        return out

    x = np.zeros((128, 4), np.float32)
    k.options(config="trn3", timing_only=True).simulate(x)
    k.options(config="trn1", timing_only=True).simulate(x)
    assert seen == [4096, 512]


def test_config_values_are_the_resolved_preset():
    c = _nsim.config_values("trn2", ["tensor.pe_rows=64"])
    assert set(c) == {p["key"] for p in _nsim.param_schema()}
    assert c["tensor.pe_rows"] == 64
    assert c["sbuf.bytes_per_partition"] == 224 * 1024
    assert c["dma.engine_bw"] == pytest.approx(23.0)  # B/ns
    with pytest.raises(nsim.ConfigError):
        _isa.config_values("trn2", {"tensor.pe_rows": 0})  # outside [1, 1024]
    from nsim import sweep
    assert sweep._config_keys("trn2") == set(c)


def test_memory_roof_reads_the_config_through_nsim():
    from nsim import plot
    # trn2: min(hbm.bw, dma.engine_bw * dma.engines) in bytes/s
    c = _nsim.config_values("trn2")
    assert plot.memory_roof("trn2") == pytest.approx(min(c["hbm.bw"], c["dma.engine_bw"] * c["dma.engines"]) * 1e9)
    assert plot.memory_roof("trn2", {"hbm.bw": "10GB/s"}) == pytest.approx(10e9)


def test_config_doc_is_up_to_date():
    with open(_config_doc.DOC, encoding="utf-8") as f:
        current = f.read()
    assert _config_doc.MARKER in current
    assert _config_doc.render(current) == current, "docs/config.md is stale: run python -m nsim._config_doc"
    for p in _nsim.param_schema():
        assert "`{}`".format(p["key"]) in current


def test_per_instruction_alu_sets_are_the_cpp_rows():
    """The ALU operators an nisa argument accepts are the rows of isa/alu_sets.def, which isa::verify checks
    too: nisa rejects exactly the operators outside the row."""
    sets = _nsim.alu_sets()
    assert _isa.ALU_SETS == {k: tuple(v) for k, v in sets.items()}
    assert nisa._PART_REDUCE == tuple(sets["tensor_partition_reduce.op"])
    assert nisa._CUMUL_OPS == tuple(sets["tensor_scalar_cumulative.op1"])
    assert nisa._REDUCE_OPS == tuple(sets["tensor_scalar_reduce.reduce_op"])
    assert nisa._ACT2_REDUCE == tuple(sets["activate2.reduce_op"])
    assert set(sets["tensor_partition_reduce.op"]) == {"add", "average", "maximum", "minimum", "bitwise_or",
                                                       "bitwise_and"}

    @nki.jit
    def k(a):
        out = nl.ndarray((1, 4), a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 4), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        r = nl.ndarray((1, 4), a.dtype, buffer=nl.sbuf)
        for n in _isa.ALU_OPS:
            if n in sets["tensor_partition_reduce.op"]:
                nisa.tensor_partition_reduce(dst=r, op=getattr(nl, n), data=t)
            else:
                with pytest.raises(nsim.NsimError, match="op must be one of"):
                    nisa.tensor_partition_reduce(dst=r, op=getattr(nl, n), data=t)
        nisa.dma_copy(dst=out, src=r)
        return out

    nsim.trace_kernel(k, np.zeros((128, 4), np.int32))


def test_nc_version_is_the_configured_generation(monkeypatch):
    monkeypatch.delenv("NKI_NC_VERSION", raising=False)
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    for preset in ("trn1", "trn2", "trn3"):
        with nsim.options(config=preset):
            assert int(nisa.get_nc_version()) == _nsim.config_values(preset)["generation"]
    monkeypatch.setenv("NKI_NC_VERSION", "trn3")
    assert nisa.get_nc_version() == nisa.nc_version.gen4

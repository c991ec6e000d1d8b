"""Queryable tables of a simulation: instructions and DMA packets as CSV or Parquet.

    from nsim.export import write_tables
    paths = write_tables("examples/softmax_2x128x512.json", "tables/")               # CSV
    paths = write_tables("examples/swiglu.json", "tables/", format="parquet")        # needs pyarrow

The files are `instructions.{csv,parquet}` (one row per instruction) and `dma.{csv,parquet}` (one row
per DMA packet: a transfer's piece on one DMA engine), with the columns of `nsim run --instructions
FILE --dma FILE` (docs/profiling.md, "Instruction and DMA tables"). Query them with any SQL engine
that reads CSV or Parquet, e.g. DuckDB: ``SELECT engine_idx, sum(bytes) FROM 'tables/dma.parquet'
GROUP BY 1``. Parquet needs pyarrow (``pip install pyarrow``), which is not a dependency of nsim.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Dict, Mapping, Optional, Sequence, Union

__all__ = ["write_tables", "csv_to_parquet", "INSTRUCTION_COLUMNS", "DMA_COLUMNS"]

# Column name -> type (pyarrow type name) of the two tables, in file order. Empty CSV fields are NULL.
INSTRUCTION_COLUMNS = {
    "index": "int64",           # program order, 0, 1, 2, ...
    "opcode": "string",
    "engine": "string",         # executing engine (trigger engine of a DMA)
    "start_ns": "float64",      # DMA: the trigger's start
    "end_ns": "float64",        # DMA: the transfer's completion
    "duration_ns": "float64",
    "dma_queue": "int64",       # DMA only
    "bytes": "int64",           # DMA only: bytes moved by the DMA engines (0 otherwise)
    "src_file": "string",
    "src_line": "int64",
    "wait_ns": "float64",       # semaphore wait: engine free, operands not yet ready
    "waited_for": "int64",      # index of the producer waited on (NULL: no wait)
    "ready_ns": "float64",      # operands ready (producers' end + semaphore hand-off)
    "waited_on": "string",      # the producer's engine, or "dma" (empty: no wait)
    "src_stack": "string",      # callers of the line: "kernel (k.py:12) > helper (k.py:30)" (empty: in the kernel)
    "act_table_load_ns": "float64",  # ScalarE: the activation table load the instruction began with (0: none)
}
DMA_COLUMNS = {
    "transfer": "int64",        # index of the DMA instruction (instructions.index)
    "engine_idx": "int64",      # DMA engine 0..dma.engines-1 (stats dma.engine<k>)
    "queue": "int64",
    "trigger_engine": "string",
    "start_ns": "float64",
    "end_ns": "float64",
    "duration_ns": "float64",
    "bytes": "int64",
    "descriptors": "int64",
    "throughput_gbps": "float64",  # bytes / duration_ns = GB/s
    "src_space": "string",
    "dst_space": "string",
    "src_file": "string",
    "src_line": "int64",
}
_TABLES = (("instructions", INSTRUCTION_COLUMNS), ("dma", DMA_COLUMNS))


def _pyarrow():
    try:
        import pyarrow  # noqa: F401
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("nsim.export: Parquet output needs pyarrow, which is not installed "
                          "(pip install pyarrow), or use format='csv'") from e
    return pyarrow, pacsv, pq


def csv_to_parquet(csv_path: Union[str, "os.PathLike[str]"], parquet_path: Union[str, "os.PathLike[str]"],
                   columns: Optional[Mapping[str, str]] = None) -> None:
    """Convert one table CSV to Parquet (pyarrow). `columns` ({name: type}) fixes the column types,
    e.g. INSTRUCTION_COLUMNS or DMA_COLUMNS; otherwise pyarrow infers them."""
    pa, pacsv, pq = _pyarrow()
    convert = pacsv.ConvertOptions()
    if columns:
        convert = pacsv.ConvertOptions(column_types={k: pa.type_for_alias(v) for k, v in columns.items()},
                                       strings_can_be_null=False)
    table = pacsv.read_csv(os.fspath(csv_path), convert_options=convert)
    pq.write_table(table, os.fspath(parquet_path))


def write_tables(kernel: Any, out_dir: Union[str, "os.PathLike[str]"], config: str = "trn2",
                 overrides: Union[None, Mapping[str, Any], Sequence[str]] = None,
                 format: str = "csv") -> Dict[str, Any]:
    """Simulate `kernel` (kernel.json dict, text or path) timing-only on `config` and write
    `out_dir/instructions.<ext>` and `out_dir/dma.<ext>` (ext = csv or parquet; out_dir is created).

    Returns {"instructions": path, "dma": path, "instruction_rows": n, "dma_rows": m}. The CSVs are
    byte for byte those of `nsim run kernel.json --instructions ... --dma ...`. format="parquet"
    converts them with pyarrow (ImportError naming `pip install pyarrow` when it is missing).
    Simulator errors raise nsim.NsimError subclasses, as nsim.simulate_json does.
    """
    from nsim._core import _call, _kernel_text, _nsim, _overrides

    fmt_ = str(format).lower()
    if fmt_ not in ("csv", "parquet"):
        raise ValueError("format must be 'csv' or 'parquet', not {!r}".format(format))
    if fmt_ == "parquet":
        _pyarrow()  # fail before simulating
    text, fname = _kernel_text(kernel)
    out = os.fspath(out_dir)
    os.makedirs(out, exist_ok=True)
    paths = {name: os.path.join(out, name + "." + fmt_) for name, _ in _TABLES}
    if fmt_ == "csv":
        n_instr, n_dma = _call(_nsim.write_tables, text, config=config, overrides=_overrides(overrides),
                               instructions_path=paths["instructions"], dma_path=paths["dma"], filename=fname)
    else:
        tmp = tempfile.mkdtemp(prefix="nsim_tables_")
        try:
            csvs = {name: os.path.join(tmp, name + ".csv") for name, _ in _TABLES}
            n_instr, n_dma = _call(_nsim.write_tables, text, config=config, overrides=_overrides(overrides),
                                   instructions_path=csvs["instructions"], dma_path=csvs["dma"], filename=fname)
            for name, columns in _TABLES:
                csv_to_parquet(csvs[name], paths[name], columns)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"instructions": paths["instructions"], "dma": paths["dma"], "instruction_rows": int(n_instr),
            "dma_rows": int(n_dma)}

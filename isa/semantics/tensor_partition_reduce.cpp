// tensor_partition_reduce: dst[0, f] = reduce over the partitions p of data[p, f] with op alu0
// (add, average = sum / P, maximum, minimum: sequential fp32 fold from partition 0; bitwise_or /
// bitwise_and: raw integers). dst has one partition and data's elements per partition.
#include "isa/semantics/internal.h"

namespace nsim::isa {

void exec_kTensorPartitionReduce(const Instr& in, const Views& v, ArchState&) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& data = v[1];
  require(in, dst, "dst");
  require(in, data, "data");
  require_same_elems(in, dst, "dst", data, "data");
  if (dst.partitions != 1) fail(ErrorCode::kPartitionMismatch, in, "dst must have 1 partition");
  const int64_t n = data.elems();
  const AluOp op = in.alu0;
  if (is_bitvec(op)) {
    int64_t* acc = iscratch(0, n);
    int64_t* x = iscratch(1, n);
    read_row_int(data, 0, acc);
    for (uint32_t p = 1; p < data.partitions; ++p) {
      read_row_int(data, p, x);
      for (int64_t j = 0; j < n; ++j) acc[j] = alu_apply_int(op, acc[j], x[j]);
    }
    write_row_int(dst, 0, acc);
    return;
  }
  const AluOp fold = op == AluOp::kAverage ? AluOp::kAdd : op;
  float* acc = fscratch(0, n);
  float* x = fscratch(1, n);
  read_row(data, 0, acc);
  for (uint32_t p = 1; p < data.partitions; ++p) {
    read_row(data, p, x);
    for (int64_t j = 0; j < n; ++j) acc[j] = alu_apply(fold, acc[j], x[j]);
  }
  if (op == AluOp::kAverage)
    for (int64_t j = 0; j < n; ++j) acc[j] /= static_cast<float>(data.partitions);
  write_row(dst, 0, acc);
}

}  // namespace nsim::isa

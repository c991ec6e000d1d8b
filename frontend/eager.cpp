// EagerSession: see eager.h.
#include "frontend/eager.h"

#include <fmt/format.h>

#include <cstring>

#include "frontend/ir.h"
#include "frontend/lower.h"

namespace nsim::frontend {

using isa::Space;

EagerSession::EagerSession(const sim::Config& cfg)
    : p_(engines::CoreParams::from_config(cfg)),
      limits_(p_.limits()),
      mem_(p_.mem, true, std::max<int64_t>(4, p_.dep_chunk_bytes)) {
  st_.generation = p_.generation;
}

bool EagerSession::has_tensor(const std::string& name) const {
  return tiles_.count(name) != 0 || mem_.has_hbm_tensor(name);
}

void EagerSession::add_hbm(const std::string& name, const std::vector<int64_t>& shape, DType dt, const uint8_t* data,
                           size_t size) {
  const memory::HbmTensor& t = mem_.alloc_hbm(name, shape, dt);
  if (size == 0) return;
  if (static_cast<int64_t>(size) != t.bytes)
    throw Error(ErrorCode::kBadInput,
                fmt::format("eager: HBM tensor '{}' holds {} bytes, {} were given", name, t.bytes, size));
  std::memcpy(mem_.hbm_data_to_overwrite(name), data, size);
}

int64_t EagerSession::place(const Tensor& t, int64_t bytes) {
  // Never freed (the tracer reuses tile names, so the names stay few). A tile placed by the kernel
  // (address=, ncc allocators) sits at its address, so tiles the kernel makes share bytes share them here
  // too; the others are stacked from the top of the memory down. PSUM: a tile of at most one bank never
  // straddles two (the PSUM bank rule), a larger one starts on a bank.
  const bool psum = t.space == Space::kPsum;
  const int64_t align = std::max<int64_t>(4, p_.dep_chunk_bytes);
  const int64_t bank = p_.mem.psum_bank_bytes;
  const int64_t cap = psum ? p_.mem.psum_bytes_per_partition() : p_.mem.sbuf_bytes_per_partition;
  int64_t& manual_hi = psum ? psum_manual_hi_ : sbuf_manual_hi_;
  int64_t& low = psum ? psum_low_ : sbuf_low_;
  if (low < 0) low = cap;
  int64_t off = 0;
  if (t.address >= 0) {
    off = t.address;
    manual_hi = std::max(manual_hi, off + bytes);
  } else {
    int64_t end = low;
    if (psum && bytes <= bank && end - bytes >= 0 && (end - bytes) / bank != (end - 1) / bank) end = (end - 1) / bank * bank;
    off = (end - bytes) / align * align;
    if (psum && bytes > bank) off = off / bank * bank;
    low = off;
  }
  if (off < 0 || off + bytes > cap || (t.address < 0 && off < manual_hi) || (t.address >= 0 && off + bytes > low))
    throw Error(psum ? ErrorCode::kPsumOverflow : ErrorCode::kSbufOverflow,
                fmt::format("eager values: tile '{}' ({} bytes per partition) does not fit in {}: the eager session "
                            "keeps every tile name of the kernel in its own storage ({} bytes per partition)",
                            t.name, bytes, isa::space_name(t.space), cap),
                t.loc);
  return off;
}

uint64_t EagerSession::run(const std::string& fragment) {
  const Kernel k = parse_kernel_json(fragment, "eager");
  std::vector<int64_t> base(k.tensors.size(), 0);
  for (size_t i = 0; i < k.tensors.size(); ++i) {
    const Tensor& t = k.tensors[i];
    if (t.space == Space::kHbm) {
      if (!mem_.has_hbm_tensor(t.name)) mem_.alloc_hbm(t.name, t.shape, t.dtype);
      base[i] = mem_.hbm_tensor(t.name).addr;
      continue;
    }
    auto it = tiles_.find(t.name);
    if (it == tiles_.end()) {  // a new tile: its own storage for the rest of the session
      int64_t bytes = dtype_bytes(t.dtype);
      for (size_t d = 1; d < t.shape.size(); ++d) bytes *= t.shape[d];
      Tile tl{t.space, t.dtype, t.shape, place(t, bytes)};
      it = tiles_.emplace(t.name, std::move(tl)).first;
    }
    base[i] = it->second.offset;
  }
  // Loops run every iteration with their variables' values (tiles allocated in a loop body keep one
  // storage: values only, no rotating buffers).
  std::vector<int64_t> vars(k.loops.size(), 0);
  uint64_t n = 0;
  const auto run_op = [&](const Op& op) {
    const int opc = Lowering::opcode_of(op.name);
    if (opc == Lowering::kUnknownOp) throw Error(ErrorCode::kUnknownOp, fmt::format("unknown op '{}'", op.name), op.loc);
    std::array<isa::Operand, isa::kMaxSlots> opnd{};
    const bool keep = opc == static_cast<int>(isa::Opcode::kTensorReduce) && op.axis_count != 0;
    for (size_t i = 0; i < isa::kMaxSlots; ++i) {
      if (!op.operands[i]) continue;
      const Access& a = *op.operands[i];
      const auto t = static_cast<size_t>(a.tensor);
      opnd[i] = Lowering::access_operand(k.tensors[t], a, vars, base[t], keep && i == 1 && opc >= 0);
    }
    isa::Instr ins[2];
    const int m = Lowering::assemble(op, opc, opnd, 0, ins);
    for (int j = 0; j < m; ++j) Lowering::apply_iimm(op, vars, ins[j]);
    for (int j = 0; j < m; ++j) {
      const isa::Instr& in = ins[j];
      isa::verify(in, limits_, op.loc);
      const isa::OpInfo& info = isa::op_info(in.op);
      isa::Views v{};
      try {
        for (int i = 0; i < info.num_slots; ++i) v[static_cast<size_t>(i)] = mem_.resolve_slot(in, i);
        isa::execute(in, v, st_);
      } catch (const Error& e) {
        throw Error(e.code(), fmt::format("{}: {}", info.mnemonic, e.message()), op.loc);
      }
      ++n;
    }
  };
  const auto run_body = [&](const auto& self, const std::vector<Stmt>& body) -> void {
    for (const Stmt& s : body) {
      if (s.kind == Stmt::Kind::kOp) {
        run_op(k.ops[static_cast<size_t>(s.index)]);
      } else if (s.kind == Stmt::Kind::kLoop) {
        const Loop& l = k.loops[static_cast<size_t>(s.index)];
        if (!body_runs_ops(k, l.body)) continue;  // (its allocations are declared up front: nothing to do)
        const int64_t trips = l.trip_count();
        for (int64_t it = 0; it < trips; ++it) {
          vars[static_cast<size_t>(s.index)] = l.start + it * l.step;
          self(self, l.body);
        }
      }
    }
  };
  run_body(run_body, k.body);
  executed_ += n;
  return n;
}

std::vector<uint8_t> EagerSession::read(const std::string& name) const {
  if (mem_.has_hbm_tensor(name)) {
    const memory::HbmTensor& t = mem_.hbm_tensor(name);
    const uint8_t* d = mem_.hbm_data(name);
    return std::vector<uint8_t>(d, d + t.bytes);
  }
  const auto it = tiles_.find(name);
  if (it == tiles_.end()) throw Error(ErrorCode::kUnknownTensor, fmt::format("eager: no tensor '{}'", name));
  const Tile& t = it->second;
  std::vector<int64_t> free(t.shape.begin() + 1, t.shape.end());
  int64_t per = dtype_bytes(t.dtype);
  for (int64_t d : free) per *= d;
  isa::Operand o;
  o.space = t.space;
  o.dtype = DType::kUInt8;
  o.offset = t.offset;
  o.num_partitions = static_cast<uint32_t>(t.shape[0]);
  o.nfree = 1;
  o.size[0] = per;
  o.stride[0] = 1;
  const isa::TileView v = mem_.resolve(o);
  std::vector<uint8_t> out(static_cast<size_t>(per * t.shape[0]));
  for (int64_t p = 0; p < t.shape[0]; ++p)
    std::memcpy(out.data() + p * per, v.base + p * v.partition_stride_bytes, static_cast<size_t>(per));
  return out;
}

}  // namespace nsim::frontend

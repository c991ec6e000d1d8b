// The sanitizer: see checker.h.
#include "engines/check/checker.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

namespace nsim::engines {

using isa::Instr;
using isa::Operand;
using isa::Space;

namespace {

bool on_chip(Space s) { return s == Space::kSbuf || s == Space::kPsum; }

/// Calls fn(partition, first element (row-major over the free dims), byte offset within the partition,
/// elements, element step in bytes) for every run of the operand along its innermost free dim.
template <class F>
void for_each_run(const Operand& o, F&& fn) {
  const int64_t eb = dtype_bytes(o.dtype);
  const int nf = std::max<int>(1, o.nfree);
  std::array<int64_t, isa::kMaxFreeDims> sz{}, st{};
  for (int d = 0; d < nf; ++d) {
    sz[static_cast<size_t>(d)] = o.nfree ? o.size[static_cast<size_t>(d)] : 1;
    st[static_cast<size_t>(d)] = o.nfree ? o.stride[static_cast<size_t>(d)] : 1;
  }
  const int64_t inner = sz[static_cast<size_t>(nf - 1)];
  const int64_t inner_step = st[static_cast<size_t>(nf - 1)] * eb;
  int64_t outer = 1;
  for (int d = 0; d + 1 < nf; ++d) outer *= sz[static_cast<size_t>(d)];
  for (uint32_t p = 0; p < o.num_partitions; ++p) {
    const uint32_t part = o.start_partition + p;
    for (int64_t r = 0; r < outer; ++r) {
      int64_t rem = r, off = 0;
      for (int d = nf - 2; d >= 0; --d) {
        const int64_t i = rem % sz[static_cast<size_t>(d)];
        rem /= sz[static_cast<size_t>(d)];
        off += i * st[static_cast<size_t>(d)];
      }
      if (!fn(part, r * inner, o.offset + off * eb, inner, inner_step)) return;
    }
  }
}

const char* slot_name(const Instr& in, int slot) {
  const isa::OpInfo& info = isa::op_info(in.op);
  return slot >= 0 && slot < info.num_slots ? info.slots[static_cast<size_t>(slot)].name : "?";
}

/// Elements per partition when v's free dims are one contiguous run (0 otherwise).
int64_t contiguous_elems(const isa::TileView& v) { return v.contiguous() ? v.elems() : 0; }

// The byte scans of the sanitizer run over every operand of every instruction: built for AVX2 as well
// as the baseline, the CPU picking one when the program loads (NSIM_SCAN_CLONES).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NSIM_SCAN_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define NSIM_SCAN_CLONES
#endif

/// True when every one of the n bytes at p is `key` or kTagAny.
NSIM_SCAN_CLONES bool all_tagged(const uint8_t* p, int64_t n, uint8_t key) {
  // branch-free over bytes so the compiler vectorises it (the bool `&=` loop did not: 10% of a
  // flash-attention simulation with the sanitizer on)
  uint8_t miss = 0;
  for (int64_t i = 0; i < n; ++i) miss |= static_cast<uint8_t>((p[i] != key) & (p[i] != kTagAny));
  return miss == 0;
}

/// True when none of the n bytes at p is 0 or tainted (the read of an operand of unknown tag, once a
/// tainted byte exists; before, memchr for 0 does).
NSIM_SCAN_CLONES bool all_written(const uint8_t* p, int64_t n) {
  uint8_t miss = 0;
  for (int64_t i = 0; i < n; ++i) miss |= static_cast<uint8_t>((p[i] == 0) | (p[i] >> 7));
  return miss == 0;
}

/// Whether the instruction's output partition d0 + i depends only on its input partitions s0 + i (every
/// read operand, (P, 1) vectors included): element-wise and free-axis ops. Such an instruction that reads
/// never-written (or tainted) bytes reports nothing; the bytes it writes in those partitions become tainted
/// (computed from never-written data), and what reads them later decides. The matmul and the transposes
/// propagate too, by their own maps (Checker::before). Not here (they report the read): DMAs (a store of
/// garbage is the bug), nc_stream_shuffle, tensor_partition_reduce, topk (groups of 16 partitions),
/// local_gather, quantize_mx, sendrecv, the RNG-state writers (set_rng_seed, rand_set_state: the state is
/// not shadowed), and a tensor_copy with runtime offsets. Register state (VectorE/ScalarE accumulators
/// carried to a later instruction) is not shadowed: taint does not follow it.
bool propagates_taint(const Instr& in) {
  switch (in.op) {
    case isa::Opcode::kTensorCopy: return !in.slot(2).present();
    case isa::Opcode::kTensorTensor:
    case isa::Opcode::kTensorScalar:
    case isa::Opcode::kActivation:
    case isa::Opcode::kActivationReduce:
    case isa::Opcode::kTensorReduce:
    case isa::Opcode::kScalarTensorTensor:
    case isa::Opcode::kReciprocal:
    case isa::Opcode::kAffineSelect:
    case isa::Opcode::kTensorTensorScan:
    case isa::Opcode::kTensorScalarReduce:
    case isa::Opcode::kBnStats:
    case isa::Opcode::kBnAggr:
    case isa::Opcode::kTensorCopyPredicated:
    case isa::Opcode::kRangeSelect:
    case isa::Opcode::kMax8:
    case isa::Opcode::kNcFindIndex8:
    case isa::Opcode::kNcMatchReplace8:
    case isa::Opcode::kSelectReduce:
    case isa::Opcode::kTensorScalarCumulative:
    case isa::Opcode::kSequenceBounds:
    case isa::Opcode::kNcNGather:
    case isa::Opcode::kNonzeroWithCount:
    case isa::Opcode::kDropout:
    case isa::Opcode::kExponential:
    case isa::Opcode::kActivate2: return true;
    default: return false;
  }
}

/// Of those, the ones whose output element (p, el) (el row-major over the free dims) depends only on the
/// input elements (p, el) of the inputs with its element count, and on (P, 1) vectors: a bad input element
/// taints that one output element (and the whole partition of an output of another element count: a
/// reduce_res). The others (scans, cumulative ops, reductions, bn_stats, max8, gathers ...) taint the whole
/// output partition p when any element of input partition p is bad.
bool elementwise_taint(const Instr& in) {
  switch (in.op) {
    case isa::Opcode::kTensorCopy:
    case isa::Opcode::kTensorTensor:
    case isa::Opcode::kTensorScalar:
    case isa::Opcode::kActivation:
    case isa::Opcode::kActivationReduce:
    case isa::Opcode::kScalarTensorTensor:
    case isa::Opcode::kReciprocal:
    case isa::Opcode::kAffineSelect:
    case isa::Opcode::kTensorScalarReduce:
    case isa::Opcode::kTensorCopyPredicated:
    case isa::Opcode::kRangeSelect:
    case isa::Opcode::kSelectReduce:
    case isa::Opcode::kDropout:
    case isa::Opcode::kExponential:
    case isa::Opcode::kActivate2: return true;
    default: return false;
  }
}

/// Read slots that address memory rather than feed values: garbage there is reported even by an
/// instruction that propagates taint (nc_n_gather's indices).
bool address_slot(const Instr& in, int slot) { return in.op == isa::Opcode::kNcNGather && slot == 2; }

/// True when none of the n elements at b (read as the unsigned integers U) has all the exponent bits
/// `exp` set (inf or NaN).
template <class U>
inline __attribute__((always_inline)) bool exponents_finite_run(const uint8_t* b, int64_t n, U exp) {
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) {
    U x;
    std::memcpy(&x, b + static_cast<int64_t>(sizeof(U)) * i, sizeof(U));
    any |= static_cast<uint32_t>((x & exp) == exp);
  }
  return any == 0;
}
NSIM_SCAN_CLONES bool finite_run32(const uint8_t* b, int64_t n) { return exponents_finite_run<uint32_t>(b, n, 0x7f800000u); }
NSIM_SCAN_CLONES bool finite_run16(const uint8_t* b, int64_t n) { return exponents_finite_run<uint16_t>(b, n, 0x7f80u); }

/// True when no element of the contiguous rows of v (n per partition) is inf or NaN (fp32 or bf16).
bool exponents_finite(const isa::TileView& v, int64_t n) {
  for (uint32_t p = 0; p < v.partitions; ++p) {
    const uint8_t* b = v.base + static_cast<int64_t>(p) * v.partition_stride_bytes;
    if (!(v.dtype == DType::kFloat32 ? finite_run32(b, n) : finite_run16(b, n))) return false;
  }
  return true;
}

/// True when no element of v is NaN/Inf, from the bits (fp32 and bf16, contiguous rows: the common
/// case, without widening every element); nullopt when v needs the general path.
std::optional<bool> finite_bits(const isa::TileView& v) {
  const int64_t n = contiguous_elems(v);
  if (n == 0) return std::nullopt;
  if (v.dtype == DType::kFloat32 || v.dtype == DType::kBFloat16) return exponents_finite(v, n);
  return std::nullopt;
}

bool finite_row(const isa::TileView& v, std::vector<float>& row, uint32_t* bad_p, int64_t* bad_i, float* bad_v) {
  if (const std::optional<bool> f = finite_bits(v); f && *f) return true;  // (the slow path locates a bad one)
  const int64_t n = v.elems();
  row.resize(static_cast<size_t>(n));
  for (uint32_t p = 0; p < v.partitions; ++p) {
    isa::read_row(v, p, row.data());
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(row[static_cast<size_t>(i)])) {
        if (bad_p) *bad_p = p, *bad_i = i, *bad_v = row[static_cast<size_t>(i)];
        return false;
      }
  }
  return true;
}

}  // namespace

std::string CheckReport::str() const {
  const CheckInfo& ci = info();
  std::string what = fmt::format("{} {}: {}", ci.code, ci.name, op);
  if (slot >= 0) what += tensor.empty() ? fmt::format(" ({})", detail) : fmt::format(" on '{}' ({})", tensor, detail);
  else what += fmt::format(" ({})", detail);
  if (!loc.str().empty()) what += fmt::format(" [at {}]", loc.str());
  if (count > 1) what += fmt::format(" ({} more like it)", count - 1);
  return what + fmt::format(". Fix: {}", ci.fix);
}

Checker::Checker(const memory::MemoryConfig& m, int generation)
    : sbuf_pitch_(m.host_pitch(false)), psum_pitch_(m.host_pitch(true)), generation_(generation) {
  sbuf_ = memory::Buffer(static_cast<size_t>(m.partitions) * static_cast<size_t>(sbuf_pitch_), memory::Buffer::Zeroed{});
  psum_ = memory::Buffer(static_cast<size_t>(m.psum_partitions) * static_cast<size_t>(psum_pitch_),
                         memory::Buffer::Zeroed{});
}

Checker::~Checker() {
  // after() is the only writer of the shadows: zero what it may have written, then they are all zero.
  const auto clear = [](memory::Buffer& b, int64_t pitch, int64_t lo, int64_t hi) {
    if (b.empty() || pitch <= 0) return;
    lo = std::max<int64_t>(lo, 0), hi = std::min(hi, pitch);
    if (lo < hi)
      for (int64_t row = 0; row * pitch < static_cast<int64_t>(b.size()); ++row)
        std::memset(b.data() + row * pitch + lo, 0, static_cast<size_t>(hi - lo));
    b.set_zero();
  };
  clear(sbuf_, sbuf_pitch_, sbuf_lo_, sbuf_hi_);
  clear(psum_, psum_pitch_, psum_lo_, psum_hi_);
}

void Checker::report(CheckKind k, const Instr& in, int slot, uint64_t index, const SourceLoc& where,
                     std::string detail) {
  int64_t& first = first_[static_cast<size_t>(k)];
  if (first > 0) {
    ++reports_[static_cast<size_t>(first - 1)].count;
    return;
  }
  CheckReport r;
  r.kind = k;
  r.instruction = index;
  r.slot = slot;
  r.op = isa::op_info(in.op).mnemonic;
  r.detail = std::move(detail);
  r.loc = where;
  r.loc_id = in.loc;
  reports_.push_back(std::move(r));
  first = static_cast<int64_t>(reports_.size());
}

namespace {
/// The operand's elements cover every byte of its extent in each partition (row-major, no gaps, no
/// repeats): then the bytes a scan checked are exactly [byte_extent()).
bool covers_extent(const Operand& o) {
  int64_t want = 1;
  for (int d = o.nfree - 1; d >= 0; --d) {
    const auto i = static_cast<size_t>(d);
    if (o.size[i] == 1) continue;
    if (o.stride[i] != want) return false;
    want *= o.size[i];
  }
  return true;
}
}  // namespace

bool Checker::verified_hit(const Operand& o, uint8_t key) const {
  const auto [lo, hi] = o.byte_extent();
  const int64_t p0 = o.start_partition, p1 = p0 + o.num_partitions;
  for (const Verified& v : verified_)
    if (v.space == o.space && (v.key == key || key == 0 || v.key == kTagAny) && v.p0 <= p0 && p1 <= v.p1 &&
        v.lo <= lo && hi <= v.hi)
      return true;
  return false;
}

bool Checker::verified_exact(const Operand& o, uint8_t key) const {
  const auto [lo, hi] = o.byte_extent();
  const int64_t p0 = o.start_partition, p1 = p0 + o.num_partitions;
  for (const Verified& v : verified_)
    if (v.exact && v.space == o.space && v.key == key && v.p0 <= p0 && p1 <= v.p1 && v.lo <= lo && hi <= v.hi)
      return true;
  return false;
}

void Checker::verified_add(const Operand& o, uint8_t key, bool exact) {
  if (!covers_extent(o)) return;
  const auto [lo, hi] = o.byte_extent();
  verified_[verified_next_] = {o.space, key, exact, o.start_partition, int64_t{o.start_partition} + o.num_partitions, lo, hi};
  verified_next_ = (verified_next_ + 1) % kVerified;
}

void Checker::verified_drop(const Operand& o, uint8_t key) {
  // Bytes written with tag `key` stay good for regions of that key and of key 0 (kTagAny is good for all),
  // but a region they overlap holds `key` bytes now: exact only if that is its key.
  const auto [lo, hi] = o.byte_extent();
  const int64_t p0 = o.start_partition, p1 = p0 + o.num_partitions;
  for (Verified& v : verified_) {
    if (v.space != o.space || !(v.p0 < p1 && p0 < v.p1 && v.lo < hi && lo < v.hi)) continue;
    if (key != kTagAny && v.key != 0 && v.key != key) v.space = isa::Space::kNone;
    else if (v.key != key) v.exact = false;
  }
}

void Checker::verified_drop_all(const Operand& o) {
  const auto [lo, hi] = o.byte_extent();
  const int64_t p0 = o.start_partition, p1 = p0 + o.num_partitions;
  for (Verified& v : verified_)
    if (v.space == o.space && v.p0 < p1 && p0 < v.p1 && v.lo < hi && lo < v.hi) v.space = isa::Space::kNone;
}

void Checker::begin_taint(const Instr& in) {
  if (taint_pending_) return;
  const Operand& d = in.slot(0);
  taint_parts_ = d.num_partitions;
  taint_elems_ = d.elems_per_partition();
  taint_mask_.assign(static_cast<size_t>(taint_parts_) * static_cast<size_t>(taint_elems_), 0);
  taint_pending_ = true;
}

void Checker::taint_from_stationary(const Instr& in, const isa::Views& views) {
  begin_taint(in);
  const auto P = static_cast<int64_t>(taint_parts_), E = taint_elems_;
  if (st_all_ || P == 0 || E == 0) {
    taint_all_ = true;
    return;
  }
  uint8_t* out = taint_mask_.data();
  const uint8_t* st = st_mask_.data();
  const auto K = static_cast<int64_t>(st_parts_), F = st_elems_;
  // A transpose (is_transpose, the moving a 0/1 selection matrix, as the semantics checks): dst[m, n] =
  // stationary[sel[n], m], so a bad stationary element (k, m) taints the output elements (m, n), sel[n] = k.
  const isa::TileView& mv = views[1];
  if ((in.flags & isa::kIsTranspose) && !(in.flags & isa::kDoubleRow) && mv.valid() && F == P &&
      static_cast<int64_t>(mv.partitions) == K && mv.elems() == E) {
    sel_.assign(static_cast<size_t>(E), -1);
    row_.resize(static_cast<size_t>(E));
    bool selection = true;
    for (int64_t k = 0; k < K && selection; ++k) {
      isa::read_row(mv, static_cast<uint32_t>(k), row_.data());
      for (int64_t n = 0; n < E && selection; ++n) {
        const float x = row_[static_cast<size_t>(n)];
        if (x == 0.0f) continue;
        if (x != 1.0f || sel_[static_cast<size_t>(n)] >= 0) selection = false;
        sel_[static_cast<size_t>(n)] = k;
      }
    }
    if (selection) {
      for (int64_t n = 0; n < E; ++n) {
        const int64_t k = sel_[static_cast<size_t>(n)];
        if (k < 0) continue;
        for (int64_t m = 0; m < P; ++m)
          if (st[k * F + m]) out[m * E + n] = 1;
      }
      return;
    }
  }
  // A matmul: dst[m, n] = sum_k stationary[k, m] moving[k, n], so a bad stationary element (k, m) taints the
  // output row m (every n). (double_row: stationary [K, 2, M], element r * M + m; MX: [K, M].)
  cols_.assign(static_cast<size_t>(P), 0);  // (the output rows)
  for (int64_t i = 0; i < K * F; ++i)
    if (st[i]) cols_[static_cast<size_t>((i % F) % P)] = 1;
  for (int64_t m = 0; m < P; ++m)
    if (cols_[static_cast<size_t>(m)]) std::memset(out + m * E, 1, static_cast<size_t>(E));
}

void Checker::check_registers(const Instr& in, const SourceLoc& where) {
  using isa::Opcode;
  using isa::ReduceCmd;
  reg_taint_slot_ = -1;
  // Which registers (isa/semantics: ScalarE's for activation / activate2, VectorE's for the reduce ops) and whether
  // load_reduce loads them (tensor_scalar_cumulative, exponential, tensor_scalar_reduce: an init operand or imm) or
  // reduces onto them (the rest).
  bool scalar = false, loads = false;
  switch (in.op) {
    case Opcode::kActivation:
    case Opcode::kActivate2:
    case Opcode::kActivationReduce: scalar = true; break;  // (activation_reduce: always reset_reduce)
    case Opcode::kTensorScalarCumulative:
    case Opcode::kExponential:
    case Opcode::kTensorScalarReduce: loads = true; break;
    case Opcode::kRangeSelect:
    case Opcode::kSelectReduce: break;
    default: return;
  }
  const ReduceCmd cmd = in.op == Opcode::kActivationReduce ? ReduceCmd::kResetReduce : in.reduce_cmd;
  const bool sets = cmd == ReduceCmd::kReset || cmd == ReduceCmd::kResetReduce || (loads && cmd == ReduceCmd::kLoadReduce);
  auto& set = regs_set_[scalar ? 0 : 1];
  const uint32_t parts = std::min<uint32_t>(in.slot(0).num_partitions, static_cast<uint32_t>(set.size()));
  Origin& first = reg_first_[scalar ? 0 : 1];
  if (sets) {
    std::fill_n(set.begin(), parts, true);
    first.set = false;
    return;
  }
  if (std::find(set.begin(), set.begin() + parts, false) == set.begin() + parts) return;
  // Never-set registers: what this instruction writes from them, reduce_res (reduce / idle) or a scan's dst.
  const isa::OpInfo& info = isa::op_info(in.op);
  for (int s = 0; s < info.num_slots; ++s)
    if (in.slot(s).present() && std::string_view(info.slots[static_cast<size_t>(s)].name) == "reduce_res") reg_taint_slot_ = s;
  if (in.op == Opcode::kTensorScalarCumulative) reg_taint_slot_ = 0;
  if (!first.set)  // (a later read of the same garbage names the first)
    first = {true, std::string(info.mnemonic),
             fmt::format("{} registers, reduce_cmd={}", scalar ? "ScalarE" : "VectorE",
                         cmd == ReduceCmd::kIdle ? "idle" : cmd == ReduceCmd::kReduce ? "reduce" : "load_reduce"),
             where};
  reg_origin_ = first;
}

void Checker::check_activation_range(const Instr& in, const isa::Views& views, uint64_t index,
                                     const SourceLoc& where) {
  // The function's input, data * scale + bias (activation's semantics), against the function's valid range on the
  // hardware (spec 3.5): the first element outside it is reported. 0 is not checked (log / rsqrt / reciprocal of 0
  // give an infinity, NSIM-W503's; sqrt(0) is 0), nor are NaN / inf inputs (reported where they were produced).
  // activate2 (gen4): the input is v = op1(op0(data, imm0), imm1), its ALU stages as the semantics apply them.
  const bool act2 = in.op == isa::Opcode::kActivate2;
  if (in.op != isa::Opcode::kActivation && in.op != isa::Opcode::kActivationReduce && !act2) return;
  const isa::ActRange r = isa::act_valid_range(in.act);
  if (std::isinf(r.lo) && std::isinf(r.hi)) return;
  const isa::TileView& data = views[1];
  if (!data.valid()) return;
  // the bounds as fp32 rounds them (an input of float(pi) is in range)
  const auto lo = static_cast<float>(r.lo), hi = static_cast<float>(r.hi);
  const int64_t n = data.elems();
  pred_row_.resize(static_cast<size_t>(n));
  float s1 = 0.0f;
  const auto scalar = [&](int slot, uint32_t p, float dflt) {
    if (!views[static_cast<size_t>(slot)].valid()) return dflt;
    isa::read_row(views[static_cast<size_t>(slot)], p, &s1);
    return s1;
  };
  for (uint32_t p = 0; p < data.partitions; ++p) {
    isa::read_row(data, p, pred_row_.data());
    float* row = pred_row_.data();
    if (act2) {
      const float a = (in.flags & isa::kHasImm0) ? in.imm[0] : scalar(2, p, 0.0f);
      const float b = (in.flags & isa::kHasImm1) ? in.imm[1] : scalar(3, p, 0.0f);
      isa::alu_apply_row(in.alu0, row, nullptr, a, n, (in.flags & isa::kReverse0) != 0);
      isa::alu_apply_row(in.alu1, row, nullptr, b, n, (in.flags & isa::kReverse1) != 0);
    } else {
      const float sc = scalar(3, p, in.imm[2]), bi = scalar(2, p, in.imm[3]);
      for (int64_t j = 0; j < n; ++j) row[j] = row[j] * sc + bi;
    }
    for (int64_t j = 0; j < n; ++j) {
      const float x = row[j];
      const float v = r.magnitude ? std::fabs(x) : x;
      if (x == 0.0f || !std::isfinite(x) || (v >= lo && v <= hi)) continue;
      report(CheckKind::kActivationOutOfRange, in, 1, index, where,
             fmt::format("{}'s input {} is {} at partition {} element {}, outside the valid range {}[{}, {}] of the "
                         "hardware's function (spec 3.5: nsim computes the true value; the hardware's is invalid there)",
                         isa::act_name(in.act), act2 ? "op1(op0(data, imm0), imm1)" : "data * scale + bias", x, p, j,
                         r.magnitude ? "+-" : "", r.lo, r.hi));
      return;
    }
  }
}

void Checker::check_unique_indices(const Instr& in, const isa::Views& views, uint64_t index, const SourceLoc& where) {
  // dma_compute's scatter-add (dst[idx] += src) with unique_indices=True (its default; spec 2.3: the RMW forms
  // need it): the kernel promises each row once, and the hardware's read-modify-writes of a repeated row may
  // overlap and lose an update. nsim applies every one (as atomic_rmw does): report the first repeat. Indices
  // outside the bound are skipped rows (oob_mode=skip) or the DMA's own error.
  if (in.op != isa::Opcode::kDmaCopy || !(in.flags & isa::kUniqueIdx) || isa::indirect_slot(in) != 0 ||
      (in.flags & isa::kIndirectScalar))
    return;
  const isa::TileView& off = views[2];
  if (!off.valid() || off.elems() != 1) return;
  std::vector<std::pair<int64_t, uint32_t>> rows;  // (index, partition of the index tile)
  rows.reserve(off.partitions);
  for (uint32_t p = 0; p < off.partitions; ++p) {
    int64_t i = 0;
    isa::read_row_int(off, p, &i);
    if (i >= 0 && i < in.iimm[0]) rows.emplace_back(i, p);
  }
  std::sort(rows.begin(), rows.end());
  for (size_t k = 1; k < rows.size(); ++k)
    if (rows[k].first == rows[k - 1].first) {
      report(CheckKind::kDuplicateIndices, in, 2, index, where,
             fmt::format("the scatter-add promised unique indices (dma_compute unique_indices=True) but partitions {} "
                         "and {} of its index tile both name row {}: the hardware's read-modify-writes of one row may "
                         "overlap and lose an update (nsim adds both)",
                         rows[k - 1].second, rows[k].second, rows[k].first));
      return;
    }
}

void Checker::check_start_partition(const Instr& in, uint64_t index, const SourceLoc& where) {
  if (isa::is_dma(in.op)) return;  // a DMA moves any partitions
  const isa::OpInfo& info = isa::op_info(in.op);
  for (int s = 0; s < info.num_slots; ++s) {
    const Operand& o = in.slot(s);
    if (!o.present() || !on_chip(o.space)) continue;
    // MX scales: the ISA places them at rows of a quadrant by group (quantize_mx's dst_scale may start at a
    // quadrant start plus 0, 4, 8 or 12; docs/isa.md "MX"), not by this rule
    const bool mx_scale = (in.op == isa::Opcode::kQuantizeMx && s == 2) ||
                          (in.op == isa::Opcode::kLoadStationary && s == 1) ||
                          (in.op == isa::Opcode::kMultiplyMoving && s == 2);
    if (mx_scale) continue;
    const uint32_t n = std::max<uint32_t>(o.num_partitions, 1), p0 = o.start_partition;
    const uint32_t align = n > 64 ? 128 : n > 32 ? 64 : 32;
    if (p0 % align == 0) continue;
    report(CheckKind::kStartPartition, in, s, index, where,
           fmt::format("operand '{}' covers {} partitions starting at partition {} (a view of {} partitions must start "
                       "at {})",
                       info.slots[static_cast<size_t>(s)].name, n, p0, n,
                       n > 64 ? "0" : n > 32 ? "0 or 64" : "0, 32, 64 or 96"));
    return;
  }
}

void Checker::before(const Instr& in, const isa::Views& views, uint64_t index, const SourceLoc& where,
                     const SlotTags* tags) {
  check_registers(in, where);
  check_activation_range(in, views, index, where);
  check_unique_indices(in, views, index, where);
  check_start_partition(in, index, where);
  casts_before_ = cast_overflows();
  taint_pending_ = false;
  taint_all_ = false;
  pending_origin_.set = false;
  const bool load_st = in.op == isa::Opcode::kLoadStationary;
  if (load_st) st_bad_ = st_all_ = false, st_origin_.set = false;  // the new stationary replaces the last one
  const isa::OpInfo& info = isa::op_info(in.op);
  const bool acc = (in.flags & isa::kAccumulate) != 0;
  for (int s = 0; s < info.num_slots; ++s) {
    const Operand& o = in.slot(s);
    if (!o.present() || !on_chip(o.space)) continue;
    const bool written = info.slots[static_cast<size_t>(s)].written;
    if (written && !(acc && s == 0)) continue;
    const memory::Buffer& sh = shadow(o.space);
    const int64_t pp = pitch(o.space), eb = dtype_bytes(o.dtype);
    const uint8_t key = tags ? (*tags)[static_cast<size_t>(s)] : 0;
    // The MX scales of nc_matmul_mx (load_stationary's stationary_scale, multiply_moving's moving_scale): the PE
    // reads one partition per 8 rows of x4 data, (g / 4) * 32 + g % 4 for group g (nki-api.md 2.3, as
    // isa::sem::mx_decode does), not the whole view: the others are not read (nor counted as read whole).
    const bool mx_scale = (load_st && s == 1) || (in.op == isa::Opcode::kMultiplyMoving && s == 2);
    const int64_t mx_groups = mx_scale ? (in.slot(s - 1).num_partitions + 7) / 8 : 0;
    const auto scale_row_read = [&](uint32_t rel) {
      return rel % 32 < 4 && static_cast<int64_t>((rel / 32) * 4 + rel % 32) < mx_groups;
    };
    if (!mx_scale && verified_hit(o, key)) continue;  // read whole before, and no write of another tag since
    // A byte is good when written, untainted: by this allocation (or through an operand of unknown tag)
    // when the operand's tag is known, by anything when it is not. A byte that is neither good nor good but
    // for kTainted (tainted) is never written (for this allocation).
    auto good = [key](uint8_t b) { return key == 0 ? b != 0 && !(b & kTainted) : (b == key || b == kTagAny); };
    auto never = [key](uint8_t b) {
      const uint8_t t = static_cast<uint8_t>(b & ~kTainted);
      return key == 0 ? b == 0 : t != key && t != kTagAny;
    };
    // An accumulation's destination (W502) counts its never-written elements; its tainted ones only
    // mark their elements. Any other read counts (and marks) every bad element.
    const bool acc_dst = written;
    const int64_t elems = o.elems_per_partition();
    // A predicated copy reads only the src elements its predicate selects: the others' garbage goes nowhere.
    const std::vector<uint8_t>* sel = nullptr;
    if (in.op == isa::Opcode::kTensorCopyPredicated && s == 1 && views[2].valid() && views[2].elems() == elems &&
        views[2].partitions == o.num_partitions) {
      const bool rev = (in.flags & isa::kReversePred) != 0;
      pred_sel_.assign(static_cast<size_t>(o.num_partitions) * static_cast<size_t>(elems), 0);
      pred_row_.resize(static_cast<size_t>(elems));
      for (uint32_t p = 0; p < o.num_partitions; ++p) {
        isa::read_row(views[2], p, pred_row_.data());
        for (int64_t e = 0; e < elems; ++e)
          pred_sel_[static_cast<size_t>(p) * static_cast<size_t>(elems) + static_cast<size_t>(e)] =
              (pred_row_[static_cast<size_t>(e)] != 0.0f) != rev;
      }
      sel = &pred_sel_;
    }
    int64_t bad = 0, unwritten = 0, first_el = -1, last_el = -1;
    uint32_t first_p = 0, last_p = 0;
    bool marked = false;  // bad_mask_ holds this operand's bad elements (those propagated)
    uint8_t first_taint = 0;  // the tag of the first tainted byte found (its origin_ entry names where it began)
    for_each_run(o, [&](uint32_t p, int64_t el0, int64_t off, int64_t n, int64_t step) {
      if (mx_scale && !scale_row_read(p - o.start_partition)) return true;
      const uint8_t* base = sh.data() + static_cast<int64_t>(p) * pp + off;
      if (step == eb) {  // a contiguous run with every byte good (the common case): one pass
        if (key == 0 && (taint_seen_ ? all_written(base, n * eb)
                                     : std::memchr(base, 0, static_cast<size_t>(n * eb)) == nullptr))
          return true;
        if (key != 0 && all_tagged(base, n * eb, key)) return true;
      }
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* b = base + i * step;
        bool ok = true, nw = false;
        for (int64_t j = 0; j < eb; ++j) ok &= good(b[j]), nw |= never(b[j]);
        if (ok) continue;
        if (sel && !(*sel)[static_cast<size_t>(p - o.start_partition) * static_cast<size_t>(elems) +
                           static_cast<size_t>(el0 + i)])
          continue;  // not selected: not read
        ++bad;
        unwritten += nw;
        for (int64_t j = 0; j < eb && !first_taint; ++j)
          if (b[j] & kTainted) first_taint = static_cast<uint8_t>(b[j] & ~kTainted);
        if (!acc_dst || !nw) {
          if (!marked) bad_mask_.assign(static_cast<size_t>(o.num_partitions) * static_cast<size_t>(elems), 0), marked = true;
          bad_mask_[static_cast<size_t>(p - o.start_partition) * static_cast<size_t>(elems) + static_cast<size_t>(el0 + i)] = 1;
        }
        if (acc_dst && !nw) continue;
        if (first_el < 0) first_p = p, first_el = el0 + i;
        last_p = p, last_el = el0 + i;
      }
      return true;
    });
    if (bad == 0) {
      if (!mx_scale) verified_add(o, key);
      continue;
    }
    // Propagate instead of reporting, by the map from this operand's elements to the output's:
    //  * same: an accumulation's own tainted destination elements, or any bad input of a per-partition
    //    instruction whose written operands have its partition count (input partition s0 + i -> output
    //    partition d0 + i; element by element for an element-wise instruction and equal element counts,
    //    else the whole partition);
    //  * transpose: nc_transpose's data, element (p, f) -> (f, p); on a gen2 TensorE (an fp32 matmul with the
    //    identity, isa/semantics/nc_transpose.cpp: NaN / Inf spread along their output row) -> all of row f;
    //  * stationary: load_stationary remembers its bad elements for the matmul after it;
    //  * moving: multiply_moving's moving element (k, n) taints the output column n (every m);
    //  * all: the MX scales (every output element).
    enum class Map { kReport, kSame, kTranspose, kStationary, kMoving, kAll } map = Map::kReport;
    if (acc_dst) {
      map = Map::kSame;
    } else if (load_st) {
      map = s == 0 ? Map::kStationary : Map::kAll;
    } else if (in.op == isa::Opcode::kMultiplyMoving) {
      map = s == 1 ? Map::kMoving : Map::kAll;
    } else if (in.op == isa::Opcode::kNcTranspose) {
      map = Map::kTranspose;
    } else if (propagates_taint(in) && !address_slot(in, s)) {
      map = Map::kSame;
      for (int w = 0; w < info.num_slots; ++w) {
        const Operand& d = in.slot(w);
        if (d.present() && info.slots[static_cast<size_t>(w)].written && (!on_chip(d.space) || d.num_partitions != o.num_partitions))
          map = Map::kReport;
      }
    }
    if (map != Map::kReport && marked) {
      // Where the garbage began: this instruction when it reads never-written bytes, else where the
      // tainted bytes it reads began (carried to what after() writes).
      Origin from;
      if (unwritten > 0) from = {true, isa::op_info(in.op).mnemonic, slot_name(in, s), where};
      else if (first_taint && origin_[first_taint].set) from = origin_[first_taint];
      const uint8_t* bm = bad_mask_.data();
      const auto P = static_cast<int64_t>(o.num_partitions);
      if (load_st) {
        if (map == Map::kAll) st_all_ = true;
        else st_mask_.swap(bad_mask_), st_parts_ = o.num_partitions, st_elems_ = elems, st_bad_ = true;
        if (!st_origin_.set) st_origin_ = from;
        continue;  // (load_stationary writes nothing on chip)
      }
      begin_taint(in);
      if (!pending_origin_.set) pending_origin_ = from;
      uint8_t* out = taint_mask_.data();
      const auto OP = static_cast<int64_t>(taint_parts_), OE = taint_elems_;
      switch (map) {
        case Map::kSame:
          if (P != OP) {
            taint_all_ = true;
          } else if (elems == OE && (acc_dst || elementwise_taint(in))) {
            for (size_t i = 0; i < taint_mask_.size(); ++i) out[i] |= bm[i];
          } else {
            for (int64_t p = 0; p < P; ++p)
              if (std::find(bm + p * elems, bm + (p + 1) * elems, 1) != bm + (p + 1) * elems)
                std::memset(out + p * OE, 1, static_cast<size_t>(OE));
          }
          break;
        case Map::kTranspose:
          if (OP != elems || OE != P) {
            taint_all_ = true;
            break;
          }
          for (int64_t p = 0; p < P; ++p)
            for (int64_t f = 0; f < elems; ++f)
              if (bm[p * elems + f]) {
                if (generation_ <= 2 && in.engine == isa::Engine::kTensor) std::memset(out + f * OE, 1, static_cast<size_t>(OE));
                else out[f * OE + p] = 1;
              }
          break;
        case Map::kMoving:  // (double_row: moving [K, 2, N], element r * N + n; MX: [K, N])
          if (OE == 0) break;
          cols_.assign(static_cast<size_t>(OE), 0);
          for (int64_t i = 0; i < P * elems; ++i)
            if (bm[i]) cols_[static_cast<size_t>((i % elems) % OE)] = 1;
          for (int64_t m = 0; m < OP; ++m)
            for (int64_t n = 0; n < OE; ++n) out[m * OE + n] |= cols_[static_cast<size_t>(n)];
          break;
        default: taint_all_ = true; break;
      }
      if (!acc_dst) continue;
    }
    // Report: the never-written bytes an accumulation adds into (W502: its tainted ones propagate above),
    // or the bad bytes any other instruction reads (W501).
    if (acc_dst && unwritten == 0) continue;
    const int64_t n = acc_dst ? unwritten : bad;
    const bool tainted = !acc_dst && unwritten < bad;
    const CheckKind k = acc_dst ? CheckKind::kPsumAccumulateUninitialized : CheckKind::kUninitializedRead;
    const bool store = isa::is_dma(in.op) && in.slot(0).present() && in.slot(0).space == Space::kHbm;
    const char* verb = acc_dst ? "accumulates into" : store ? "stores" : "reads";
    const std::string what =
        tainted ? fmt::format("{} {} {} element{} of {} that were never written or computed from never-written data",
                              verb, n, isa::space_name(o.space), n == 1 ? "" : "s", slot_name(in, s))
                : fmt::format("{} {} {} never-written element{} of {}", verb, n, isa::space_name(o.space),
                              n == 1 ? "" : "s", slot_name(in, s));
    const Origin* from = tainted && first_taint && origin_[first_taint].set ? &origin_[first_taint] : nullptr;
    report(k, in, s, index, where,
           fmt::format("{} (of {}), first at partition {} element {}, last at partition {} element {}{}", what,
                       o.total_elems(), first_p, first_el, last_p, last_el,
                       from ? fmt::format("; the never-written data was first read by {} ({}) at {}", from->op,
                                          from->slot, from->loc.str().empty() ? "an unknown line" : from->loc.str())
                            : ""));
  }
  // The matmul's stationary operand was read by the load_stationary before it.
  if (in.op == isa::Opcode::kMultiplyMoving && (st_bad_ || st_all_)) {
    taint_from_stationary(in, views);
    if (!pending_origin_.set) pending_origin_ = st_origin_;
  }
}

void Checker::after(const Instr& in, const isa::Views& views, uint64_t index, const SourceLoc& where,
                    const SlotTags* tags) {
  const isa::OpInfo& info = isa::op_info(in.op);
  // 0. values narrowed out of their destination's range while it executed (not by an instruction that
  // computed from never-written data: its garbage rows would be what overflowed)
  if (const uint64_t n = cast_overflows() - casts_before_; n > 0 && !taint_pending_) {
    const Operand& d = in.slot(0);
    report(CheckKind::kCastOutOfRange, in, 0, index, where,
           fmt::format("{} value{} did not fit the destination dtype{}{} (integers saturate to their range and NaN "
                       "becomes 0; fp8/fp16 overflow to inf, or NaN for the fn formats)",
                       n, n == 1 ? "" : "s", d.present() ? " " : "", d.present() ? dtype_name(d.dtype) : ""));
  }
  // 1. mark the written bytes
  for (int s = 0; s < info.num_slots; ++s) {
    const Operand& o = in.slot(s);
    if (!o.present() || !on_chip(o.space) || !info.slots[static_cast<size_t>(s)].written) continue;
    memory::Buffer& sh = shadow(o.space);
    const int64_t pp = pitch(o.space), eb = dtype_bytes(o.dtype);
    const uint8_t key = tags && (*tags)[static_cast<size_t>(s)] ? (*tags)[static_cast<size_t>(s)] : kTagAny;
    // Elements computed from never-written data (before() found them) get key | kTainted: by element when
    // the operand has the output's shape, by partition when only its partition count matches (a reduction's
    // result), all of them else.
    const bool regs = s == reg_taint_slot_;  // written from never-set accumulator registers: all of it
    const bool taint = taint_pending_ || regs;
    const bool all = taint && (regs || taint_all_ || o.num_partitions != taint_parts_);
    const bool by_el = taint && !all && o.elems_per_partition() == taint_elems_;
    if (taint && !all && !by_el) {  // whole partitions: those with any tainted element
      taint_rows_.assign(taint_parts_, 0);
      for (uint32_t p = 0; p < taint_parts_; ++p) {
        const uint8_t* r = taint_mask_.data() + static_cast<int64_t>(p) * taint_elems_;
        taint_rows_[p] = std::find(r, r + taint_elems_, 1) != r + taint_elems_;
      }
    }
    if (taint) {
      taint_seen_ = true;
      verified_drop_all(o);  // no region may cover a tainted byte
      const Origin& from = regs && !taint_pending_ ? reg_origin_ : pending_origin_;
      if (from.set) origin_[key] = from;  // (by tag: kTagAny's entry is shared)
    } else {
      if (verified_exact(o, key)) continue;  // its bytes hold `key` already (and lie inside the dirty columns)
      verified_drop(o, key);
      verified_add(o, key, true);  // (written below: every byte of the operand's runs gets `key`)
    }
    int64_t& dlo = o.space == Space::kPsum ? psum_lo_ : sbuf_lo_;
    int64_t& dhi = o.space == Space::kPsum ? psum_hi_ : sbuf_hi_;
    const uint8_t tainted = static_cast<uint8_t>(key | kTainted);
    for_each_run(o, [&](uint32_t p, int64_t el0, int64_t off, int64_t n, int64_t step) {
      uint8_t* base = sh.data() + static_cast<int64_t>(p) * pp + off;
      const uint32_t pr = p - o.start_partition;
      const uint8_t mark = taint && (all || (!by_el && taint_rows_[pr])) ? tainted : key;
      if (n > 0) {  // the run's columns [off + min(0, (n-1) step), off + max(0, (n-1) step) + eb)
        const int64_t last = (n - 1) * step;
        dlo = std::min(dlo, off + std::min<int64_t>(0, last));
        dhi = std::max(dhi, off + std::max<int64_t>(0, last) + eb);
      }
      if (by_el) {
        const uint8_t* m = taint_mask_.data() + static_cast<int64_t>(pr) * taint_elems_ + el0;
        for (int64_t i = 0; i < n; ++i) std::memset(base + i * step, m[i] ? tainted : key, static_cast<size_t>(eb));
      } else if (step == eb) {
        std::memset(base, mark, static_cast<size_t>(n * eb));
      } else {
        for (int64_t i = 0; i < n; ++i) std::memset(base + i * step, mark, static_cast<size_t>(eb));
      }
      return true;
    });
  }
  // 2. the first NaN/Inf produced from finite inputs
  std::vector<float>& row = row_;
  if (in.op == isa::Opcode::kLoadStationary) {
    stationary_finite_ = !views[0].valid() || finite_row(views[0], row, nullptr, nullptr, nullptr);
    return;
  }
  if (first_[static_cast<size_t>(CheckKind::kNanProduced)] > 0) return;  // only the first one matters
  if (taint_pending_) return;  // computed from never-written data: a NaN there is garbage, not produced
  if (!reads_results(in)) return;  // (its product may still be running: see reads_results)
  // A side addressed at run time (an indirect DMA's gather or scatter rows): its view is the static access, not the
  // rows moved (a scatter into a fresh output left rows 0..P-1 unwritten: a false report), and a DMA moves values,
  // it computes none.
  if (isa::indirect_slot(in) >= 0) return;
  for (float x : in.imm)
    if (!std::isfinite(x)) return;  // an infinite immediate (a -inf mask or initial value) is intended
  // ... as is an immediate beyond the destination dtype's range (fp32.min as a bf16 mask value: -inf)
  const Operand& d0 = in.slot(0);
  if (d0.present() && dtype_is_float(d0.dtype) && d0.dtype != DType::kFloat32) {
    std::array<uint8_t, 8> b{};
    for (float x : in.imm) {
      store_f32(d0.dtype, b.data(), x);
      if (!std::isfinite(load_f32(d0.dtype, b.data()))) return;
    }
  }
  for (int s = 0; s < info.num_slots; ++s) {
    const isa::TileView& v = views[static_cast<size_t>(s)];
    if (!v.valid() || !info.slots[static_cast<size_t>(s)].written || !dtype_is_float(v.dtype)) continue;
    uint32_t bp = 0;
    int64_t bi = 0;
    float bv = 0;
    if (finite_row(v, row, &bp, &bi, &bv)) continue;
    // Non-finite output: were the inputs finite? (the matmul's stationary operand was loaded earlier)
    bool inputs_finite = in.op != isa::Opcode::kMultiplyMoving || stationary_finite_;
    // dst is an input too where the op keeps some of its elements: an accumulation, a predicated copy (an
    // element whose predicate is false keeps what dst held: the -inf of nl.where(c, x, -inf)'s memset), and a
    // stream shuffle whose mask keeps a partition (entry 255, spec nki-api.md 2.2)
    const bool keeps_dst = (in.flags & isa::kAccumulate) || in.op == isa::Opcode::kTensorCopyPredicated ||
                           (in.op == isa::Opcode::kNcStreamShuffle &&
                            std::find(in.shuffle.begin(), in.shuffle.end(), uint8_t{255}) != in.shuffle.end());
    for (int r = 0; r < info.num_slots && inputs_finite; ++r) {
      const isa::TileView& u = views[static_cast<size_t>(r)];
      const bool reads = !info.slots[static_cast<size_t>(r)].written || (r == 0 && keeps_dst);
      if (!u.valid() || !reads || !dtype_is_float(u.dtype)) continue;
      if (r == s && !keeps_dst) continue;
      inputs_finite = finite_row(u, row, nullptr, nullptr, nullptr);
    }
    if (!inputs_finite) return;
    report(CheckKind::kNanProduced, in, s, index, where,
           fmt::format("writes {} into {} (partition {} element {}) from finite inputs", bv, slot_name(in, s), bp, bi));
    return;
  }
}

}  // namespace nsim::engines

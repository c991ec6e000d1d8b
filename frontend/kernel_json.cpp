// kernel.json reader and writer (schema: docs/kernel-json.md).
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "frontend/ir.h"
#include "frontend/json.h"
#include "isa/dtype.h"
#include "isa/isa.h"
#include "sim/error.h"
#include "sim/text.h"

namespace nsim::frontend {

int Kernel::find_tensor(const std::string& tensor_name) const {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].name == tensor_name) return static_cast<int>(i);
  return -1;
}

namespace {

using json::Value;
using sim::edit_distance;
using sim::join;

constexpr int kMaxLoopDepth = 64;
constexpr int64_t kMaxTripCount = int64_t{1} << 40;
constexpr int kMaxHbmDims = 16;
constexpr int kMaxOnChipDims = 1 + isa::kMaxFreeDims;
constexpr int kMaxExprDepth = 64;
constexpr int kMaxBufs = 1024;
constexpr int kMaxSiteCount = 1 << 20;  // allocations of one site in one loop body (an unrolled inner loop's)

// Names of the non-slot fields of an op, in the order the writer emits them.
constexpr std::string_view kOpFields[] = {"op",      "engine", "alu0",    "alu1",       "act",       "reduce_cmd", "flags",
                                          "imm",     "iimm",   "shuffle", "axis_count", "dma_queue", "label",
                                          "order_group", "after", "loc"};
// Flag names by bit (isa/flags.def).
constexpr std::string_view kFlagNames[] = {
#define FLAG(e, name, meaning) name,
#include "isa/flags.def"
#undef FLAG
};
constexpr std::string_view kReduceCmdNames[] = {"idle", "reset", "reduce", "reset_reduce", "load_reduce"};
constexpr std::string_view kLoopKindNames[] = {"affine", "sequential", "static"};
constexpr std::string_view kTensorKindNames[] = {"input", "output", "internal"};
constexpr const auto& kImmDefault = isa::kImmDefault;
constexpr const auto& kIimmDefault = isa::kIimmDefault;

/// A name for a message: quoted, clipped to a sane length (hostile inputs may be megabytes).
std::string q(std::string_view s) {
  // fmt rather than operator+: GCC 12 reports a false -Wrestrict on the string concatenation.
  if (s.size() <= 64) return fmt::format("'{}'", s);
  return fmt::format("'{}...'", sim::clip_utf8(s, 64));
}

/// Candidates close to `name` (edit distance or substring), at most 5.
std::vector<std::string> close_names(std::string_view name, const std::vector<std::string>& candidates) {
  std::vector<std::string> out;
  if (name.empty() || name.size() > 64) return out;
  const size_t tol = std::max<size_t>(2, name.size() / 3);
  for (const std::string& c : candidates) {
    if (c.size() > 64) continue;
    const bool sub = name.size() >= 3 && (c.find(name) != std::string::npos || name.find(c) != std::string::npos);
    if (sub || edit_distance(name, c) <= tol) out.push_back(c);
    if (out.size() >= 5) break;
  }
  return out;
}

/// "; did you mean 'a' or 'b'?" / "" .
std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates) {
  const auto close = close_names(name, candidates);
  if (close.empty()) return {};
  std::vector<std::string> quoted;
  for (const auto& c : close) quoted.push_back(q(c));
  return fmt::format("; did you mean {}?", join(quoted, " or "));
}

template <size_t N>
std::vector<std::string> to_strings(const std::string_view (&a)[N]) {
  return std::vector<std::string>(std::begin(a), std::end(a));
}

std::vector<std::string> op_names() {
  std::vector<std::string> v;
  for (const isa::OpInfo& i : isa::op_table()) v.emplace_back(i.mnemonic);
  for (const isa::OpInfo& i : isa::macro_table()) v.emplace_back(i.mnemonic);
  return v;
}

std::vector<std::string> alu_names() {
  std::vector<std::string> v;
#define ALU(e, name, cls, red, arity) v.emplace_back(name);
#include "isa/alu_ops.def"
#undef ALU
  return v;
}

std::vector<std::string> act_names() {
  std::vector<std::string> v;
#define ACT(e, name, ...) v.emplace_back(name);
#include "isa/act_funcs.def"
#undef ACT
  return v;
}

std::vector<std::string> engine_names() {
  std::vector<std::string> v;
  for (int i = 0; i < isa::kNumEngines; ++i) v.emplace_back(isa::engine_name(static_cast<isa::Engine>(i)));
  return v;
}

std::vector<std::string> dtype_names() {
  std::vector<std::string> v;
  for (int i = 0; i < kNumDTypes; ++i) v.emplace_back(dtype_name(static_cast<DType>(i)));
  return v;
}

/// Slot names of an op (the MACRO rows such as "nc_matmul" included); empty for unknown names.
std::vector<std::string> slot_names(const std::string& op) {
  std::vector<std::string> v;
  const isa::OpInfo* info = isa::macro_from_name(op);
  if (auto oc = isa::opcode_from_name(op)) info = &isa::op_info(*oc);
  if (info)
    for (int i = 0; i < info->num_slots; ++i) v.emplace_back(info->slots[static_cast<size_t>(i)].name);
  return v;
}

std::string show_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x21 && u < 0x7f) return fmt::format("character '{}'", c);
  return fmt::format("byte 0x{:02x}", u);
}

bool is_identifier(std::string_view s) {
  if (s.empty()) return false;
  const auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!alpha(s[0])) return false;
  for (char c : s)
    if (!alpha(c) && !(c >= '0' && c <= '9')) return false;
  return true;
}

// ---------------------------------------------------------------- paths for messages

/// Where a value sits in the document ("body[3].op \"dma_copy\".src.index[1]"), for error messages.
/// Built lazily: each level is a node on the caller's stack pointing at its parent, and the text is
/// made only when an error is raised (building it eagerly was ~60% of reading a kernel.json). A Path
/// made from a temporary (`path + ".x"` as an argument) lives until the end of the full expression,
/// which is as long as the callee needs it; Paths are never copied or stored.
class Path {
 public:
  Path(const char* s) : a_(s) {}                         // NOLINT: a root, e.g. "(top level)"
  Path(const std::string& s) : a_(s) {}                  // NOLINT: a root; `s` outlives the Path
  Path(const Path&) = delete;
  Path& operator=(const Path&) = delete;

  /// This path followed by `text` as written (".loop", "name").
  friend Path operator+(const Path& p, std::string_view text) { return Path(&p, text, {}, kPlain); }
  friend Path operator+(const Path& p, const char* text) { return Path(&p, text, {}, kPlain); }
  /// This path followed by "[i]".
  Path operator[](size_t i) const { return Path(this, {}, {}, kPlain, static_cast<int64_t>(i)); }
  /// This path followed by `sep` and `name` ("." + a member name).
  Path member(std::string_view sep, std::string_view name) const { return Path(this, sep, name, kPlain); }
  /// This path followed by `sep` and `name` in JSON quotes, cut at 64 characters (with "..." when
  /// `ellipsis`).
  Path quoted(std::string_view sep, std::string_view name, bool ellipsis) const {
    return Path(this, sep, name, ellipsis ? kQuotedEllipsis : kQuotedCut);
  }

  std::string str() const {
    std::string out = parent_ ? parent_->str() : std::string();
    out.append(a_);
    switch (mode_) {
      case kPlain: out.append(b_); break;
      case kQuotedCut: out += json::quote(sim::clip_utf8(b_, 64)); break;
      case kQuotedEllipsis:
        out += json::quote(b_.size() <= 64 ? std::string(b_) : std::string(sim::clip_utf8(b_, 64)) + "...");
        break;
    }
    if (index_ >= 0) out += fmt::format("[{}]", index_);
    return out;
  }

 private:
  enum Mode : uint8_t { kPlain, kQuotedCut, kQuotedEllipsis };
  Path(const Path* parent, std::string_view a, std::string_view b, Mode mode, int64_t index = -1)
      : parent_(parent), a_(a), b_(b), mode_(mode), index_(index) {}
  const Path* parent_ = nullptr;
  std::string_view a_, b_;
  Mode mode_ = kPlain;
  int64_t index_ = -1;
};

// ---------------------------------------------------------------- reader

class Reader {
 public:
  explicit Reader(const std::string& filename) : file_(filename) {}
  /// Loop bodies given by token (parse_kernel_value with BodySources).
  void set_deferred(const BodySources* d) { deferred_ = d; }

  Kernel read(std::string_view text) {
    // A single-core kernel.json is read as a stream: every top-level member but "body" as a DOM, then
    // the body one statement at a time, so no DOM of the whole body is ever held (a 300 MB kernel.json
    // took 4.75 GB to load as one DOM). Anything else (not an object, a multi-core launch, a syntax
    // error between the members) takes the whole-document path, which reports errors as it always has.
    {
      json::Stream st(text, file_);
      std::optional<Value> root;
      json::Stream::Mark body{};
      bool has_body = false;
      try {
        if (st.begin_object()) {
          root = Value::object();
          std::string key;
          json::Stream::Mark at;
          std::vector<std::string> seen;
          while (st.next_member(key, at)) {
            if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
              root.reset();  // a duplicate name: the whole-document parser reports it
              break;
            }
            seen.push_back(key);
            if (key == "body") {
              body = at, has_body = true;
            } else {
              root->set(key, st.parse_at(at));
            }
          }
        }
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kJsonSyntax) throw;
        root.reset();
      }
      if (root && !root->find("core_programs") && !root->find("cores")) {
        root->set_pos(st.object_line(), st.object_column());
        if (!has_body) return read_root(*root, nullptr);
        // The body, and each loop's body in it, statement by statement.
        const BodySources bodies = [&](int token, const std::function<void(size_t, Value)>& fn, Value& whole) {
          if (st.for_each_statement(token, fn)) return true;
          whole = st.parse_body(token);
          return false;
        };
        set_deferred(&bodies);
        const int top = st.add_body(body);
        const BodySource each = [&](const std::function<void(size_t, Value)>& fn, Value& whole) {
          return bodies(top, fn, whole);
        };
        return read_root(*root, &each);
      }
    }
    const Value root = json::parse(text, file_);
    return read_root(root, nullptr);
  }

  /// The top level, its "body" either in `root` or, with `body`, read from there statement by statement.
  Kernel read_root(const Value& root, const BodySource* body) {
    if (!root.is_object())
      fail(ErrorCode::kWrongType, root, "(top level)", fmt::format("expected an object, found {}", root.type_name()));
    const Value* ver = root.find("nsim_kernel");
    if (!ver)
      fail(ErrorCode::kMissingField, root, "(top level)",
           fmt::format("missing required field 'nsim_kernel' (the schema version, {})", kKernelSchemaVersion));
    if (!ver->is_int() || ver->as_int() != kKernelSchemaVersion)
      fail(ErrorCode::kSchemaVersion, *ver, "nsim_kernel",
           fmt::format("unsupported schema version {}, this nsim reads version {}", describe(*ver), kKernelSchemaVersion));
    if (root.find("core_programs") || root.find("cores")) return read_launch(root);
    check_keys(root, "(top level)", {"nsim_kernel", "name", "tensors", "body", "schedule", "stacks"});
    return read_program(root, "", body);
  }

  /// One core's program: {"name", "tensors", "body", "schedule"} (the single-core top level).
  Kernel read_program(const Value& root, const std::string& prefix_text, const BodySource* each = nullptr) {
    const std::string top = prefix_text.empty() ? "(top level)" : prefix_text;
    const Path prefix(prefix_text);
    if (const Value* n = root.find("name")) k_.name = get_string(*n, prefix + "name");
    if (const Value* st = root.find("stacks")) {  // read first: locs refer to it by index
      expect_array(*st, prefix + "stacks");
      for (size_t i = 0; i < st->size(); ++i) stacks_.push_back(get_string((*st)[i], (prefix + "stacks")[i]));
    }
    if (const Value* sc = root.find("schedule")) read_schedule(*sc);
    if (const Value* ts = root.find("tensors")) {
      expect_array(*ts, prefix + "tensors");
      for (size_t i = 0; i < ts->size(); ++i) read_hbm_tensor((*ts)[i], (prefix + "tensors")[i]);
    }
    if (each) {  // the body from its source, statement by statement
      const Path bp = prefix + "body";
      std::vector<Stmt> body;
      Value whole;
      const bool array = (*each)([&](size_t i, Value v) { body.push_back(read_stmt(v, bp[i], 0)); }, whole);
      if (!array) expect_array(whole, bp);  // the error read_body gives
      k_.body = std::move(body);
      return std::move(k_);
    }
    const Value* body = root.find("body");
    if (!body) fail(ErrorCode::kMissingField, root, top, "missing required field 'body' (the list of statements)");
    k_.body = read_body(*body, prefix + "body", 0);
    return std::move(k_);
  }

  /// A multi-core (LNC=2) launch: {"nsim_kernel", "name", "cores": 2, "core_programs": [program, program]}.
  /// HBM tensors of the same name in both programs are one tensor (shared_hbm); the launch's own
  /// `tensors` become the union of the programs' HBM tensors (inputs and outputs by name).
  Kernel read_launch(const Value& root) {
    check_keys(root, "(top level)", {"nsim_kernel", "name", "cores", "core_programs"});
    const Value* cores = root.find("cores");
    const Value* progs = root.find("core_programs");
    if (!cores || !progs)
      fail(ErrorCode::kMultiCoreLaunch, root, "(top level)",
           "a multi-core launch needs both 'cores' (the LNC degree, 2) and 'core_programs' (one program per core)");
    const int64_t n = get_int(*cores, "cores", 1, 2);
    expect_array(*progs, "core_programs");
    if (static_cast<int64_t>(progs->size()) != n)
      fail(ErrorCode::kMultiCoreLaunch, *progs, "core_programs",
           fmt::format("'cores' is {} but {} core programs are given", n, progs->size()));
    Kernel launch;
    if (const Value* nm = root.find("name")) launch.name = get_string(*nm, "name");
    for (size_t c = 0; c < progs->size(); ++c) {
      const std::string pre = fmt::format("core_programs[{}].", c);
      const Value& pv = (*progs)[c];
      if (!pv.is_object())
        fail(ErrorCode::kWrongType, pv, pre, fmt::format("expected an object, found {}", pv.type_name()));
      check_keys(pv, pre, {"name", "tensors", "body", "schedule", "stacks"});
      Reader r(file_);
      Kernel prog = r.read_program(pv, pre);
      if (prog.name.empty()) prog.name = launch.name;
      for (const Tensor& t : prog.tensors) {
        if (t.space != isa::Space::kHbm) continue;
        const int have = launch.find_tensor(t.name);
        if (have < 0) {
          launch.tensors.push_back(t);
          continue;
        }
        Tensor& h = launch.tensors[static_cast<size_t>(have)];
        const bool in_h = h.kind == TensorKind::kInput, in_t = t.kind == TensorKind::kInput;
        if (h.shape != t.shape || h.dtype != t.dtype || in_h != in_t)
          fail(ErrorCode::kMultiCoreLaunch, pv, pre + "tensors",
               fmt::format("shared HBM tensor '{}' differs between the core programs (shape, dtype, or input in one "
                           "and not the other)",
                           t.name),
               t.loc);
        if (t.kind == TensorKind::kOutput) h.kind = TensorKind::kOutput;  // an output if any core writes it
      }
      launch.core_programs.push_back(std::move(prog));
    }
    return launch;
  }

 private:
  const std::string& file_;
  const BodySources* deferred_ = nullptr;
  Kernel k_;
  std::vector<std::string> stacks_;  ///< the "stacks" table: call stacks referenced by loc.stack
  std::unordered_map<std::string, int> tensor_ids_;
  std::vector<std::pair<std::string, int>> scope_;  ///< enclosing loop variables, outermost first

  [[noreturn]] void fail(ErrorCode code, const Value& at, const Path& path, const std::string& msg,
                         const SourceLoc& loc = {}) const {
    if (at.line() == 0)  // a value built in memory (a Python dict, parse_kernel_value): no text position
      throw Error(code, fmt::format("{}: {}: {}", file_, path.str(), msg), loc);
    throw Error(code, fmt::format("{}:{}:{}: {}: {}", file_, at.line(), at.column(), path.str(), msg), loc);
  }

  static std::string describe(const Value& v) {
    switch (v.type()) {
      case Value::Type::kNumber:
        if (v.is_int()) return std::to_string(v.as_int());
        return fmt::format("{}", v.as_double());
      case Value::Type::kString: return fmt::format("string {}", q(v.as_string()));
      case Value::Type::kBool: return v.as_bool() ? "true" : "false";
      default: return v.type_name();
    }
  }

  void check_keys(const Value& obj, const Path& path, const std::vector<std::string_view>& allowed,
                  const SourceLoc& loc = {}) const {
    for (size_t i = 0; i < obj.size(); ++i) {
      const std::string& key = obj.key(i);
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
      std::vector<std::string> names(allowed.begin(), allowed.end());
      fail(ErrorCode::kWrongType, obj[i], path,
           fmt::format("field {} is not allowed here (allowed: {}){}", q(key), join(names), did_you_mean(key, names)),
           loc);
    }
  }

  void expect_object(const Value& v, const Path& path, const SourceLoc& loc = {}) const {
    if (!v.is_object()) fail(ErrorCode::kWrongType, v, path, fmt::format("expected an object, found {}", v.type_name()), loc);
  }
  void expect_array(const Value& v, const Path& path, const SourceLoc& loc = {}) const {
    if (!v.is_array()) fail(ErrorCode::kWrongType, v, path, fmt::format("expected an array, found {}", v.type_name()), loc);
  }

  const Value& require(const Value& obj, std::string_view key, const Path& path, const SourceLoc& loc = {}) const {
    const Value* v = obj.find(key);
    if (!v) fail(ErrorCode::kMissingField, obj, path, fmt::format("missing required field '{}'", key), loc);
    return *v;
  }

  std::string get_string(const Value& v, const Path& path, const SourceLoc& loc = {}) const {
    if (!v.is_string()) fail(ErrorCode::kWrongType, v, path, fmt::format("expected a string, found {}", describe(v)), loc);
    return v.as_string();
  }

  /// An integer in [lo, hi]; integral numbers written with an exponent (1e3) are accepted.
  int64_t get_int(const Value& v, const Path& path, int64_t lo, int64_t hi, const SourceLoc& loc = {}) const {
    if (!v.is_number()) fail(ErrorCode::kWrongType, v, path, fmt::format("expected an integer, found {}", describe(v)), loc);
    int64_t i = 0;
    if (v.is_int()) {
      i = v.as_int();
    } else {
      const double d = v.as_double();
      if (d != std::floor(d)) fail(ErrorCode::kWrongType, v, path, fmt::format("expected an integer, found {}", describe(v)), loc);
      if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
        fail(ErrorCode::kWrongType, v, path, fmt::format("integer {} is out of range [{}, {}]", describe(v), lo, hi), loc);
      i = static_cast<int64_t>(d);
    }
    if (i < lo || i > hi) fail(ErrorCode::kWrongType, v, path, fmt::format("integer {} is out of range [{}, {}]", i, lo, hi), loc);
    return i;
  }

  template <size_t N>
  size_t get_word(const Value& v, const Path& path, const std::string_view (&words)[N], const char* what,
                  const SourceLoc& loc = {}) const {
    const std::string s = get_string(v, path, loc);
    for (size_t i = 0; i < N; ++i)
      if (s == words[i]) return i;
    const auto names = to_strings(words);
    fail(ErrorCode::kUnknownName, v, path, fmt::format("unknown {} {} (known: {})", what, q(s), join(names)), loc);
  }

  SourceLoc read_loc(const Value& v, const Path& path) const {
    expect_object(v, path);
    check_keys(v, path, {"file", "line", "function", "stack"});
    SourceLoc loc;
    if (const Value* f = v.find("file")) loc.file = get_string(*f, path + ".file");
    if (const Value* l = v.find("line")) loc.line = static_cast<int>(get_int(*l, path + ".line", 0, std::numeric_limits<int>::max()));
    if (const Value* f = v.find("function")) loc.function = get_string(*f, path + ".function");
    if (const Value* s = v.find("stack")) {
      if (stacks_.empty())
        fail(ErrorCode::kWrongType, *s, path + ".stack", "a 'stack' index needs the top-level 'stacks' list", loc);
      loc.stack = stacks_[static_cast<size_t>(get_int(*s, path + ".stack", 0, static_cast<int64_t>(stacks_.size()) - 1, loc))];
    }
    return loc;
  }

  std::vector<int64_t> read_shape(const Value& v, const Path& path, int max_dims, DType dt,
                                  const SourceLoc& loc) const {
    expect_array(v, path, loc);
    if (v.size() == 0 || v.size() > static_cast<size_t>(max_dims))
      fail(ErrorCode::kWrongType, v, path,
           fmt::format("expected 1 to {} dims{}, found {}", max_dims,
                       max_dims == kMaxOnChipDims ? " (partition + 4 free dims) for an on-chip tile" : "", v.size()),
           loc);
    std::vector<int64_t> shape;
    int64_t product = dtype_bytes(dt);
    for (size_t i = 0; i < v.size(); ++i) {
      const Path p = path[i];
      if (!v[i].is_number())
        fail(ErrorCode::kWrongType, v[i], p, fmt::format("expected a positive integer, found {}", describe(v[i])), loc);
      const int64_t d = get_int(v[i], p, 1, std::numeric_limits<int64_t>::max(), loc);
      if (__builtin_mul_overflow(product, d, &product))
        fail(ErrorCode::kWrongType, v, path, "the tensor size in bytes overflows a 64-bit integer", loc);
      shape.push_back(d);
    }
    return shape;
  }

  DType read_dtype(const Value& v, const Path& path, const SourceLoc& loc) const {
    const std::string s = get_string(v, path, loc);
    const auto dt = dtype_from_name(s);
    if (!dt)
      fail(ErrorCode::kUnknownName, v, path,
           fmt::format("unknown dtype {} (known: {}){}", q(s), join(dtype_names()), did_you_mean(s, dtype_names())), loc);
    return *dt;
  }

  int add_tensor(Tensor t, const Value& at, const Path& path) {
    if (auto it = tensor_ids_.find(t.name); it != tensor_ids_.end())
      fail(ErrorCode::kDuplicateName, at, path,
           fmt::format("tensor name {} is already used by {} (tensor names must be unique in a kernel)", q(t.name),
                       k_.tensors[static_cast<size_t>(it->second)].space == isa::Space::kHbm ? "an HBM tensor" : "an alloc"),
           t.loc);
    const int id = static_cast<int>(k_.tensors.size());
    tensor_ids_.emplace(t.name, id);
    k_.tensors.push_back(std::move(t));
    return id;
  }

  std::string read_tensor_name(const Value& obj, const Path& path, const SourceLoc& loc) const {
    const std::string name = get_string(require(obj, "name", path, loc), path + ".name", loc);
    if (name.empty()) fail(ErrorCode::kWrongType, *obj.find("name"), path + ".name", "a tensor name must not be empty", loc);
    return name;
  }

  void read_hbm_tensor(const Value& v, const Path& base) {
    expect_object(v, base);
    check_keys(v, base, {"name", "buffer", "kind", "dtype", "shape", "init", "loc"});
    Tensor t;
    if (const Value* l = v.find("loc")) t.loc = read_loc(*l, base + ".loc");
    t.name = read_tensor_name(v, base, t.loc);
    const std::string name = t.name;  // `path` refers to it; t is moved into the kernel at the end
    const Path path = base.quoted(" ", name, false);
    const Value& buf = require(v, "buffer", path, t.loc);
    const std::string b = get_string(buf, path + ".buffer", t.loc);
    if (b == "sbuf" || b == "psum")
      fail(ErrorCode::kWrongType, buf, path + ".buffer",
           fmt::format("kernel-level tensors live in hbm; declare {} tiles with an alloc statement in the body", b), t.loc);
    if (b != "hbm") fail(ErrorCode::kUnknownName, buf, path + ".buffer", fmt::format("unknown buffer {} (expected 'hbm')", q(b)), t.loc);
    t.space = isa::Space::kHbm;
    t.kind = TensorKind::kInternal;
    if (const Value* kd = v.find("kind")) t.kind = static_cast<TensorKind>(get_word(*kd, path + ".kind", kTensorKindNames, "tensor kind", t.loc));
    t.dtype = read_dtype(require(v, "dtype", path, t.loc), path + ".dtype", t.loc);
    t.shape = read_shape(require(v, "shape", path, t.loc), path + ".shape", kMaxHbmDims, t.dtype, t.loc);
    if (const Value* in = v.find("init")) {  // initial contents: an input declared before it, same dtype and shape
      t.init = get_string(*in, path + ".init", t.loc);
      const auto it = tensor_ids_.find(t.init);
      const Tensor* src = it == tensor_ids_.end() ? nullptr : &k_.tensors[static_cast<size_t>(it->second)];
      if (!src || src->space != isa::Space::kHbm || src->kind != TensorKind::kInput || t.kind == TensorKind::kInput)
        fail(ErrorCode::kUnknownName, *in, path + ".init",
             fmt::format("init {} must name an input tensor declared before this one (which is not an input)",
                         q(t.init)),
             t.loc);
      if (src->dtype != t.dtype || src->shape != t.shape)
        fail(ErrorCode::kShapeMismatch, *in, path + ".init",
             fmt::format("init {} is {} {}, this tensor {} {}", q(t.init), dtype_name(src->dtype),
                         shape_str(src->shape), dtype_name(t.dtype), shape_str(t.shape)),
             t.loc);
    }
    add_tensor(std::move(t), v, path);
  }

  int read_alloc(const Value& v, const Path& base) {
    expect_object(v, base);
    check_keys(v, base, {"name", "buffer", "dtype", "shape", "bufs", "site_count", "address", "loc"});
    Tensor t;
    if (const Value* l = v.find("loc")) t.loc = read_loc(*l, base + ".loc");
    t.name = read_tensor_name(v, base, t.loc);
    const std::string name = t.name;  // `path` refers to it; t is moved into the kernel at the end
    const Path path = base.quoted(" ", name, false);
    const Value& buf = require(v, "buffer", path, t.loc);
    const std::string b = get_string(buf, path + ".buffer", t.loc);
    if (b == "sbuf") {
      t.space = isa::Space::kSbuf;
    } else if (b == "psum") {
      t.space = isa::Space::kPsum;
    } else if (b == "hbm") {
      fail(ErrorCode::kWrongType, buf, path + ".buffer", "alloc makes on-chip tiles (sbuf or psum); declare HBM tensors in 'tensors'", t.loc);
    } else {
      fail(ErrorCode::kUnknownName, buf, path + ".buffer", fmt::format("unknown buffer {} (expected 'sbuf' or 'psum')", q(b)), t.loc);
    }
    t.kind = TensorKind::kInternal;
    t.dtype = read_dtype(require(v, "dtype", path, t.loc), path + ".dtype", t.loc);
    t.shape = read_shape(require(v, "shape", path, t.loc), path + ".shape", kMaxOnChipDims, t.dtype, t.loc);
    if (const Value* bf = v.find("bufs")) t.bufs = static_cast<int>(get_int(*bf, path + ".bufs", 0, kMaxBufs, t.loc));
    if (const Value* sc = v.find("site_count"))
      t.site_count = static_cast<int>(get_int(*sc, path + ".site_count", 0, kMaxSiteCount, t.loc));
    if (const Value* ad = v.find("address")) t.address = get_int(*ad, path + ".address", 0, int64_t{1} << 40, t.loc);
    return add_tensor(std::move(t), v, path);
  }

  std::vector<Stmt> read_body(const Value& v, const Path& path, int depth) {
    expect_array(v, path);
    std::vector<Stmt> body;
    body.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) body.push_back(read_stmt(v[i], path[i], depth));
    return body;
  }

  Stmt read_stmt(const Value& v, const Path& path, int depth) {
    if (!v.is_object())
      fail(ErrorCode::kWrongType, v, path,
           fmt::format("expected a statement object ({{\"op\": ...}}, {{\"loop\": ...}} or {{\"alloc\": ...}}), found {}",
                       v.type_name()));
    const bool has_op = v.find("op") != nullptr, has_loop = v.find("loop") != nullptr, has_alloc = v.find("alloc") != nullptr;
    if (int{has_op} + int{has_loop} + int{has_alloc} > 1)
      fail(ErrorCode::kWrongType, v, path, "a statement has exactly one of 'op', 'loop' or 'alloc'");
    if (has_op) return Stmt{Stmt::Kind::kOp, read_op(v, path)};
    if (has_loop) {
      check_keys(v, path, {"loop"});
      return Stmt{Stmt::Kind::kLoop, read_loop(*v.find("loop"), path + ".loop", depth)};
    }
    if (has_alloc) {
      check_keys(v, path, {"alloc"});
      return Stmt{Stmt::Kind::kAlloc, read_alloc(*v.find("alloc"), path + ".alloc")};
    }
    fail(ErrorCode::kMissingField, v, path, "a statement needs one of the fields 'op', 'loop' or 'alloc'");
  }

  int read_loop(const Value& v, const Path& base, int depth) {
    expect_object(v, base);
    check_keys(v, base, {"var", "start", "stop", "step", "kind", "body", "loc"});
    Loop l;
    if (const Value* lc = v.find("loc")) l.loc = read_loc(*lc, base + ".loc");
    const Value& var = require(v, "var", base, l.loc);
    l.var = get_string(var, base + ".var", l.loc);
    if (!is_identifier(l.var))
      fail(ErrorCode::kWrongType, var, base + ".var",
           fmt::format("loop variable {} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)", q(l.var)), l.loc);
    const Path& path = base;
    if (depth + 1 > kMaxLoopDepth)
      fail(ErrorCode::kBadLoop, v, path, fmt::format("loops nest deeper than {} levels", kMaxLoopDepth), l.loc);
    for (const auto& [name, id] : scope_)
      if (name == l.var)
        fail(ErrorCode::kDuplicateName, var, path + ".var",
             fmt::format("loop variable {} shadows the variable of an enclosing loop", q(l.var)), l.loc);
    constexpr int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
    if (const Value* s = v.find("start")) l.start = get_int(*s, path + ".start", lo, hi, l.loc);
    const Value& stop = require(v, "stop", path, l.loc);
    l.stop = get_int(stop, path + ".stop", lo, hi, l.loc);
    const Value* step = v.find("step");
    if (step) l.step = get_int(*step, path + ".step", lo, hi, l.loc);
    if (l.step == 0) fail(ErrorCode::kBadLoop, *step, path + ".step", "loop step must not be 0", l.loc);
    if ((l.step > 0 && l.stop < l.start) || (l.step < 0 && l.stop > l.start))
      fail(ErrorCode::kBadLoop, stop, path,
           fmt::format("range({}, {}, {}) runs backwards (negative trip count)", l.start, l.stop, l.step), l.loc);
    // Trip count without overflow: |stop - start| < 2^64 fits in uint64.
    const uint64_t span = l.step > 0 ? static_cast<uint64_t>(l.stop) - static_cast<uint64_t>(l.start)
                                     : static_cast<uint64_t>(l.start) - static_cast<uint64_t>(l.stop);
    const uint64_t mag = l.step > 0 ? static_cast<uint64_t>(l.step) : 0 - static_cast<uint64_t>(l.step);
    const uint64_t trips = span / mag + (span % mag != 0 ? 1 : 0);
    if (trips > static_cast<uint64_t>(kMaxTripCount))
      fail(ErrorCode::kBadLoop, stop, path,
           fmt::format("range({}, {}, {}) has {} iterations, more than the limit 2^40", l.start, l.stop, l.step, trips), l.loc);
    if (const Value* kd = v.find("kind")) l.kind = static_cast<LoopKind>(get_word(*kd, path + ".kind", kLoopKindNames, "loop kind", l.loc));
    const int id = static_cast<int>(k_.loops.size());
    k_.loops.push_back(l);
    if (const Value* b = v.find("body")) {
      scope_.emplace_back(l.var, id);
      std::vector<Stmt> body;
      if (deferred_ && b->line() < 0 && b->is_array() && b->size() == 0) {  // its statements from its source
        const Path bp = path + ".body";
        Value whole;
        const bool array =
            (*deferred_)(b->column(), [&](size_t i, Value s) { body.push_back(read_stmt(s, bp[i], depth + 1)); }, whole);
        if (!array) expect_array(whole, bp);
      } else {
        body = read_body(*b, path + ".body", depth + 1);
      }
      scope_.pop_back();
      k_.loops[static_cast<size_t>(id)].body = std::move(body);
    }
    return id;
  }

  // ---- index expressions

  struct ExprParser {
    const Reader& r;
    const Value& at;
    const Path& path;
    const SourceLoc& loc;
    std::string_view s;
    size_t p = 0;

    [[noreturn]] void bad(ErrorCode code, const std::string& msg) const {
      const std::string shown = s.size() <= 80 ? std::string(s) : std::string(sim::clip_utf8(s, 80)) + "...";
      r.fail(code, at, path, fmt::format("index expression \"{}\": {}", shown, msg), loc);
    }
    void ws() {
      while (p < s.size() && (s[p] == ' ' || s[p] == '\t')) ++p;
    }
    Affine add(const Affine& a, const Affine& b, bool negate_b) const {
      Affine out = a;
      int64_t bc = b.c;
      if (negate_b && __builtin_sub_overflow(int64_t{0}, bc, &bc)) bad(ErrorCode::kBadIndex, "constant overflows int64");
      if (__builtin_add_overflow(out.c, bc, &out.c)) bad(ErrorCode::kBadIndex, "constant overflows int64");
      for (auto [id, k] : b.terms) {
        if (negate_b && __builtin_sub_overflow(int64_t{0}, k, &k)) bad(ErrorCode::kBadIndex, "coefficient overflows int64");
        bool found = false;
        for (auto& [tid, c] : out.terms)
          if (tid == id) {
            if (__builtin_add_overflow(c, k, &c)) bad(ErrorCode::kBadIndex, "coefficient overflows int64");
            found = true;
          }
        if (!found) out.terms.emplace_back(id, k);
      }
      return out;
    }
    Affine scale(const Affine& a, int64_t f) const {
      Affine out;
      if (__builtin_mul_overflow(a.c, f, &out.c)) bad(ErrorCode::kBadIndex, "constant overflows int64");
      for (auto [id, k] : a.terms) {
        int64_t m = 0;
        if (__builtin_mul_overflow(k, f, &m)) bad(ErrorCode::kBadIndex, "coefficient overflows int64");
        out.terms.emplace_back(id, m);
      }
      return out;
    }
    Affine expr(int depth) {
      if (depth > kMaxExprDepth) bad(ErrorCode::kBadIndex, fmt::format("nested deeper than {} levels", kMaxExprDepth));
      Affine a = term(depth);
      for (;;) {
        ws();
        if (p < s.size() && (s[p] == '+' || s[p] == '-')) {
          const bool minus = s[p] == '-';
          ++p;
          a = add(a, term(depth), minus);
        } else {
          return a;
        }
      }
    }
    Affine term(int depth) {
      Affine a = unary(depth);
      for (;;) {
        ws();
        if (p < s.size() && s[p] == '*') {
          ++p;
          const size_t at_pos = p;
          Affine b = unary(depth);
          if (!a.is_const() && !b.is_const())
            bad(ErrorCode::kBadIndex,
                fmt::format("not affine: a product of loop variables (at column {}); index expressions are sums of "
                            "integer multiples of loop variables",
                            at_pos + 1));
          a = a.is_const() ? scale(b, a.c) : scale(a, b.c);
        } else {
          return a;
        }
      }
    }
    Affine unary(int depth) {
      ws();
      if (p < s.size() && (s[p] == '-' || s[p] == '+')) {
        const bool minus = s[p] == '-';
        ++p;
        if (depth + 1 > kMaxExprDepth) bad(ErrorCode::kBadIndex, fmt::format("nested deeper than {} levels", kMaxExprDepth));
        Affine a = unary(depth + 1);
        return minus ? scale(a, -1) : a;
      }
      return primary(depth);
    }
    Affine primary(int depth) {
      ws();
      if (p >= s.size()) bad(ErrorCode::kBadIndex, "unexpected end, expected a number, a loop variable or '('");
      const char c = s[p];
      if (c == '(') {
        ++p;
        Affine a = expr(depth + 1);
        ws();
        if (p >= s.size() || s[p] != ')') bad(ErrorCode::kBadIndex, fmt::format("expected ')' at column {}", p + 1));
        ++p;
        return a;
      }
      if (c >= '0' && c <= '9') {
        size_t e = p;
        while (e < s.size() && s[e] >= '0' && s[e] <= '9') ++e;
        Affine a;
        const auto res = std::from_chars(s.data() + p, s.data() + e, a.c);
        if (res.ec != std::errc()) bad(ErrorCode::kBadIndex, "integer literal overflows int64");
        p = e;
        if (p < s.size() && ((s[p] >= 'a' && s[p] <= 'z') || (s[p] >= 'A' && s[p] <= 'Z') || s[p] == '_' || s[p] == '.'))
          bad(ErrorCode::kBadIndex, fmt::format("unexpected {} at column {} (write 2*i, not 2i; integers only)", show_char(s[p]), p + 1));
        return a;
      }
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
        size_t e = p;
        while (e < s.size() && ((s[e] >= 'a' && s[e] <= 'z') || (s[e] >= 'A' && s[e] <= 'Z') || (s[e] >= '0' && s[e] <= '9') || s[e] == '_')) ++e;
        const std::string_view name = s.substr(p, e - p);
        p = e;
        for (auto it = r.scope_.rbegin(); it != r.scope_.rend(); ++it)
          if (it->first == name) {
            Affine a;
            a.terms.emplace_back(it->second, 1);
            return a;
          }
        std::vector<std::string> vars;
        for (const auto& [n, id] : r.scope_) vars.push_back(n);
        bad(ErrorCode::kUnknownName,
            fmt::format("unknown loop variable {} ({}){}", q(name),
                        vars.empty() ? std::string("no loop variable is in scope here") : "in scope: " + join(vars),
                        did_you_mean(name, vars)));
      }
      bad(ErrorCode::kBadIndex, fmt::format("unexpected {} at column {}", show_char(c), p + 1));
    }
  };

  Affine read_expr(const Value& v, const Path& path, const SourceLoc& loc) const {
    if (v.is_number()) {
      Affine a;
      a.c = get_int(v, path, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), loc);
      return a;
    }
    if (!v.is_string())
      fail(ErrorCode::kWrongType, v, path,
           fmt::format("expected an index (an integer or an affine expression string such as \"128*i + 64\"), found {}",
                       v.type_name()),
           loc);
    ExprParser ep{*this, v, path, loc, v.as_string()};
    Affine a = ep.expr(0);
    ep.ws();
    if (ep.p < ep.s.size()) ep.bad(ErrorCode::kBadIndex, fmt::format("unexpected {} at column {}", show_char(ep.s[ep.p]), ep.p + 1));
    std::erase_if(a.terms, [](const std::pair<int, int64_t>& t) { return t.second == 0; });
    return a;
  }

  // ---- accesses

  int lookup_tensor(const Value& at, const std::string& name, const Path& path, const SourceLoc& loc) const {
    auto it = tensor_ids_.find(name);
    if (it != tensor_ids_.end()) return it->second;
    std::vector<std::string> names;
    if (name.size() <= 64)
      for (const Tensor& t : k_.tensors) names.push_back(t.name);
    fail(ErrorCode::kUnknownName, at, path,
         fmt::format("unknown tensor {} (no tensor of that name is declared before this point){}", q(name),
                     did_you_mean(name, names)),
         loc);
  }

  DimAccess read_dim(const Value& v, const Path& path, int64_t extent, const SourceLoc& loc) const {
    DimAccess d;
    if (!v.is_object()) {
      d.start = read_expr(v, path, loc);
      return d;
    }
    check_keys(v, path, {"start", "size", "step", "broadcast"}, loc);
    if (const Value* s = v.find("start")) d.start = read_expr(*s, path + ".start", loc);
    constexpr int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
    if (const Value* b = v.find("broadcast")) {
      if (v.find("size"))
        fail(ErrorCode::kWrongType, *v.find("size"), path, "'size' and 'broadcast' exclude each other (broadcast: n is the size)", loc);
      d.broadcast = true;
      d.size = get_int(*b, path + ".broadcast", 1, hi, loc);
      if (const Value* st = v.find("step")) d.step = get_int(*st, path + ".step", lo, hi, loc);
      return d;
    }
    if (const Value* st = v.find("step")) {
      d.step = get_int(*st, path + ".step", lo, hi, loc);
      if (d.step == 0)
        fail(ErrorCode::kWrongType, *st, path + ".step", "step 0 is not allowed (use {\"broadcast\": n} to repeat an element)", loc);
    }
    if (const Value* sz = v.find("size")) {
      d.size = get_int(*sz, path + ".size", 1, hi, loc);
    } else {
      if (!d.start.is_const())
        fail(ErrorCode::kMissingField, v, path, "missing field 'size' (required when 'start' depends on a loop variable)", loc);
      const int64_t c = d.start.c;
      if (c < 0 || c >= extent)
        fail(ErrorCode::kIndexOutOfBounds, v, path, fmt::format("start {} is outside the dim of size {}", c, extent), loc);
      d.size = d.step > 0 ? (extent - c - 1) / d.step + 1 : c / (d.step == lo ? hi : -d.step) + 1;
    }
    return d;
  }

  Access read_access(const Value& v, const Path& path, const SourceLoc& loc) const {
    Access a;
    if (v.is_string()) {
      a.tensor = lookup_tensor(v, v.as_string(), path, loc);
      return a;
    }
    if (!v.is_object())
      fail(ErrorCode::kWrongType, v, path,
           fmt::format("expected a tensor name or {{\"tensor\": name, \"index\": [...]}}, found {}", v.type_name()), loc);
    check_keys(v, path, {"tensor", "shape", "strides", "index", "order", "dtype"}, loc);
    const Value& tv = require(v, "tensor", path, loc);
    a.tensor = lookup_tensor(tv, get_string(tv, path + ".tensor", loc), path + ".tensor", loc);
    const Tensor& t = k_.tensors[static_cast<size_t>(a.tensor)];
    // The shape the access indexes before any re-dimensioning: the tensor's, or for a reinterpreting view of
    // another element size the tensor's bytes as elements of its dtype (the last dim scaled; spec 3.9 view(dtype)).
    bool retyped = false;
    if (const Value* dv = v.find("dtype")) {
      a.dtype = read_dtype(*dv, path + ".dtype", loc);
      retyped = dtype_bytes(*a.dtype) != dtype_bytes(t.dtype);
      if (retyped && t.space != isa::Space::kHbm && t.shape.size() < 2)
        fail(ErrorCode::kBadDtype, *dv, path + ".dtype",
             fmt::format("a view of tile {} ({} {}) as {}: a tile of one dim (its partitions) has no free dim for a "
                         "view of another element size to scale", q(t.name), dtype_name(t.dtype), shape_str(t.shape),
                         dtype_name(*a.dtype)), loc);
      if (retyped && access_base_shape(t, a).back() == 0)
        fail(ErrorCode::kBadDtype, *dv, path + ".dtype",
             fmt::format("a view of tensor {} ({} {}) as {}: the last dim's {} bytes are not a whole number of {}-byte "
                         "elements (a reinterpreting view scales the last dim by the ratio of the element sizes)",
                         q(t.name), dtype_name(t.dtype), shape_str(t.shape), dtype_name(*a.dtype),
                         t.shape.back() * dtype_bytes(t.dtype), dtype_bytes(*a.dtype)), loc);
    }
    const std::vector<int64_t> base_shape = access_base_shape(t, a);
    if (const Value* sv = v.find("shape")) {  // a re-dimensioned view: the elements row-major with this shape
      const bool chip = t.space != isa::Space::kHbm;
      const Path sp = path + ".shape";
      a.shape = read_shape(*sv, sp, chip ? kMaxOnChipDims : kMaxHbmDims, a.dtype.value_or(t.dtype), loc);
      int64_t n = 1, m = 1;  // (read_shape keeps the byte size of either within int64)
      for (int64_t d : a.shape) n *= d;
      for (int64_t d : base_shape) m *= d;
      if (const Value* tv2 = v.find("strides")) {  // a strided view: any element count, the strides given
        const Path tp = path + ".strides";
        expect_array(*tv2, tp, loc);
        if (tv2->size() != a.shape.size())
          fail(ErrorCode::kWrongType, *tv2, tp,
               fmt::format("{} strides for a view of shape {} (one per dim)", tv2->size(), shape_str(a.shape)), loc);
        for (size_t i = 0; i < tv2->size(); ++i)
          a.strides.push_back(get_int((*tv2)[i], tp[i], 1, std::numeric_limits<int64_t>::max(), loc));
        if (chip && a.strides[0] != m / t.shape[0])
          fail(ErrorCode::kBadReshape, *tv2, tp,
               fmt::format("a strided view of tile {} (shape {}): strides[0] is the partition step, {} (found {})",
                           q(t.name), shape_str(t.shape), m / t.shape[0], a.strides[0]), loc);
      } else if (n != m) {
        fail(ErrorCode::kBadReshape, *sv, sp,
             fmt::format("a view of tensor {} (shape {}, {} elements{}) as shape {} ({} elements): a re-dimensioned "
                         "view keeps the element count", q(t.name), shape_str(base_shape), m,
                         retyped ? fmt::format(" of {}", dtype_name(*a.dtype)) : std::string(), shape_str(a.shape), n),
             loc);
      }
      if (chip && a.shape[0] != t.shape[0])
        fail(ErrorCode::kBadReshape, *sv, sp,
             fmt::format("a view of tile {} (shape {}) as shape {}: the partition dim (dim 0, size {}) stays dim 0 "
                         "with the same size", q(t.name), shape_str(t.shape), shape_str(a.shape), t.shape[0]), loc);
      if (a.shape == t.shape && a.strides.empty() && !retyped) a.shape.clear();
    } else if (v.find("strides")) {
      fail(ErrorCode::kWrongType, *v.find("strides"), path + ".strides", "\"strides\" needs \"shape\"", loc);
    } else if (retyped) {
      a.shape = base_shape;
    }
    const std::vector<int64_t>& sh = access_shape(t, a);
    const Value* idx = v.find("index");
    if (!idx && !v.find("order") && a.shape.empty()) return a;
    if (idx) expect_array(*idx, path + ".index", loc);
    const size_t given = idx ? idx->size() : 0;
    if (given > sh.size())
      fail(ErrorCode::kWrongType, *idx, path + ".index",
           fmt::format("{} index entries for tensor {} with {} dims", given, q(t.name), sh.size()), loc);
    for (size_t i = 0; i < sh.size(); ++i) {
      if (i < given) {
        a.dims.push_back(read_dim((*idx)[i], (path + ".index")[i], sh[i], loc));
      } else {
        a.dims.push_back(DimAccess{Affine{}, sh[i], 1, false});
      }
    }
    if (const Value* ord = v.find("order")) {
      const Path op = path + ".order";
      expect_array(*ord, op, loc);
      std::vector<char> seen(sh.size(), 0);
      if (ord->size() != sh.size())
        fail(ErrorCode::kWrongType, *ord, op,
             fmt::format("{} entries for tensor {} with {} dims (a permutation of its dims)", ord->size(), q(t.name),
                         sh.size()), loc);
      for (size_t i = 0; i < ord->size(); ++i) {
        const int d = static_cast<int>(get_int((*ord)[i], op[i], 0,
                                               static_cast<int64_t>(sh.size()) - 1, loc));
        if (seen[static_cast<size_t>(d)]) fail(ErrorCode::kWrongType, (*ord)[i], op[i], fmt::format("dim {} twice", d), loc);
        seen[static_cast<size_t>(d)] = 1;
        a.order.push_back(d);
      }
      if (t.space != isa::Space::kHbm && a.order[0] != 0)
        fail(ErrorCode::kWrongType, *ord, op, "the partition dim (0) of an on-chip tensor is visited first", loc);
      bool identity = true;
      for (size_t i = 0; i < a.order.size(); ++i) identity = identity && a.order[i] == static_cast<int>(i);
      if (identity) a.order.clear();
    }
    return a;
  }

  // ---- schedule edges: [["after", "before" | ["before", ...]], ...]

  void read_schedule(const Value& v) {
    expect_array(v, "schedule");
    const Path sched("schedule");
    for (size_t i = 0; i < v.size(); ++i) {
      const Path p = sched[i];
      const Value& e = v[i];
      expect_array(e, p);
      if (e.size() != 2) fail(ErrorCode::kWrongType, e, p, fmt::format("expected [after, before], found {} items", e.size()));
      ScheduleEdge edge;
      edge.after = get_string(e[0], p + "[0]");
      if (e[1].is_string()) {
        edge.before.push_back(e[1].as_string());
      } else {
        expect_array(e[1], p + "[1]");
        for (size_t j = 0; j < e[1].size(); ++j) edge.before.push_back(get_string(e[1][j], (p + "[1]")[j]));
      }
      k_.schedule.push_back(std::move(edge));
    }
  }

  // ---- ops

  int read_op(const Value& v, const Path& base) {
    Op op;
    if (const Value* l = v.find("loc")) op.loc = read_loc(*l, base + ".loc");
    const Value& nv = *v.find("op");
    op.name = get_string(nv, base + ".op", op.loc);
    const Path path = base.quoted(".op ", op.name, true);
    const std::vector<std::string> slots = slot_names(op.name);
    if (slots.empty()) {
      const auto names = op_names();
      const auto close = close_names(op.name, names);
      std::vector<std::string> quoted;
      for (const auto& c : close) quoted.push_back(q(c));
      fail(ErrorCode::kUnknownOp, nv, base + ".op",
           close.empty() ? fmt::format("unknown op {} (known ops: {})", q(op.name), join(names))
                         : fmt::format("unknown op {}; did you mean {}?", q(op.name), join(quoted, " or ")),
           op.loc);
    }
    std::vector<std::string_view> allowed;
    for (const auto& s : slots) allowed.push_back(s);
    for (std::string_view f : kOpFields) allowed.push_back(f);
    check_keys(v, path, allowed, op.loc);

    for (size_t i = 0; i < v.size(); ++i) {
      const std::string& key = v.key(i);
      const Value& f = v[i];
      const Path fp = path.member(".", key);
      if (key == "op" || key == "loc") continue;
      if (auto it = std::find(slots.begin(), slots.end(), key); it != slots.end()) {
        op.operands[static_cast<size_t>(it - slots.begin())] = read_access(f, fp, op.loc);
      } else if (key == "engine") {
        const std::string s = get_string(f, fp, op.loc);
        const auto e = isa::engine_from_name(s);
        if (!e) fail(ErrorCode::kUnknownName, f, fp, fmt::format("unknown engine {} (known: {})", q(s), join(engine_names())), op.loc);
        op.engine = *e;
      } else if (key == "alu0" || key == "alu1") {
        const std::string s = get_string(f, fp, op.loc);
        const auto a = isa::alu_from_name(s);
        if (!a) {
          const auto names = alu_names();
          fail(ErrorCode::kUnknownName, f, fp, fmt::format("unknown ALU op {} (known: {}){}", q(s), join(names), did_you_mean(s, names)), op.loc);
        }
        (key == "alu0" ? op.alu0 : op.alu1) = *a;
      } else if (key == "act") {
        const std::string s = get_string(f, fp, op.loc);
        const auto a = isa::act_from_name(s);
        if (!a) {
          const auto names = act_names();
          fail(ErrorCode::kUnknownName, f, fp,
               fmt::format("unknown activation function {} (known: {}){}", q(s), join(names), did_you_mean(s, names)), op.loc);
        }
        op.act = *a;
      } else if (key == "reduce_cmd") {
        op.reduce_cmd = static_cast<isa::ReduceCmd>(get_word(f, fp, kReduceCmdNames, "reduce_cmd", op.loc));
      } else if (key == "flags") {
        expect_array(f, fp, op.loc);
        for (size_t j = 0; j < f.size(); ++j) {
          const Path ep = fp[j];
          if (f[j].is_number()) {
            op.flags = static_cast<uint16_t>(op.flags | get_int(f[j], ep, 0, 0xFFFF, op.loc));
          } else {
            op.flags = static_cast<uint16_t>(op.flags | (1u << get_word(f[j], ep, kFlagNames, "flag", op.loc)));
          }
        }
      } else if (key == "imm") {
        expect_array(f, fp, op.loc);
        if (f.size() > 4) fail(ErrorCode::kWrongType, f, fp, fmt::format("at most 4 values, found {}", f.size()), op.loc);
        for (size_t j = 0; j < f.size(); ++j) op.imm[j] = read_float(f[j], fp[j], op.loc);
      } else if (key == "iimm") {
        expect_array(f, fp, op.loc);
        if (f.size() > 10) fail(ErrorCode::kWrongType, f, fp, fmt::format("at most 10 values, found {}", f.size()), op.loc);
        for (size_t j = 0; j < f.size(); ++j) {
          if (f[j].is_string()) {  // an index expression (isa::kIimmExprOps), evaluated per instance
            if (!isa::iimm_takes_exprs(op.name))
              fail(ErrorCode::kWrongType, f[j], fp[j],
                   fmt::format("expected an integer, found a string: iimm takes index expressions for {} only",
                               fmt::join(isa::kIimmExprOps, ", ")),
                   op.loc);
            Affine a = read_expr(f[j], fp[j], op.loc);
            if (!a.is_const()) {
              op.iimm[j] = 0;
              op.iimm_expr.emplace_back(static_cast<uint8_t>(j), std::move(a));
              continue;
            }
            if (a.c < std::numeric_limits<int32_t>::min() || a.c > std::numeric_limits<int32_t>::max())
              fail(ErrorCode::kWrongType, f[j], fp[j],
                   fmt::format("integer {} is out of range [{}, {}]", a.c, std::numeric_limits<int32_t>::min(),
                               std::numeric_limits<int32_t>::max()),
                   op.loc);
            op.iimm[j] = static_cast<int32_t>(a.c);
            continue;
          }
          op.iimm[j] = static_cast<int32_t>(get_int(f[j], fp[j], std::numeric_limits<int32_t>::min(),
                                                    std::numeric_limits<int32_t>::max(), op.loc));
        }
      } else if (key == "shuffle") {
        expect_array(f, fp, op.loc);
        if (f.size() != 32) fail(ErrorCode::kWrongType, f, fp, fmt::format("expected 32 values, found {}", f.size()), op.loc);
        for (size_t j = 0; j < 32; ++j) op.shuffle[j] = static_cast<uint8_t>(get_int(f[j], fp[j], 0, 255, op.loc));
      } else if (key == "axis_count") {
        op.axis_count = static_cast<uint8_t>(get_int(f, fp, 0, 255, op.loc));
      } else if (key == "dma_queue") {
        op.dma_queue = static_cast<int>(get_int(f, fp, 0, 255, op.loc));
      } else if (key == "label") {
        op.label = get_string(f, fp, op.loc);
      } else if (key == "order_group") {
        op.order_group = static_cast<int>(get_int(f, fp, 0, std::numeric_limits<int32_t>::max(), op.loc));
      } else if (key == "after") {
        if (f.is_string()) {
          op.after.push_back(get_string(f, fp, op.loc));
        } else {
          expect_array(f, fp, op.loc);
          for (size_t j = 0; j < f.size(); ++j) op.after.push_back(get_string(f[j], fp[j], op.loc));
        }
      }
    }
    const int id = static_cast<int>(k_.ops.size());
    k_.ops.push_back(std::move(op));
    return id;
  }

  float read_float(const Value& v, const Path& path, const SourceLoc& loc) const {
    if (v.is_string()) {
      const std::string& s = v.as_string();
      if (s == "inf") return std::numeric_limits<float>::infinity();
      if (s == "-inf") return -std::numeric_limits<float>::infinity();
      if (s == "nan") return std::numeric_limits<float>::quiet_NaN();
      fail(ErrorCode::kWrongType, v, path, fmt::format("expected a number or \"inf\", \"-inf\", \"nan\", found {}", describe(v)), loc);
    }
    if (!v.is_number()) fail(ErrorCode::kWrongType, v, path, fmt::format("expected a number, found {}", describe(v)), loc);
    const double d = v.is_int() ? static_cast<double>(v.as_int()) : v.as_double();
    if (!(std::fabs(d) <= static_cast<double>(FLT_MAX)))
      fail(ErrorCode::kWrongType, v, path, fmt::format("{} is out of the range of float32", describe(v)), loc);
    return static_cast<float>(d);
  }
};

// ---------------------------------------------------------------- writer

class Writer {
 public:
  explicit Writer(const Kernel& k) : k_(k) {}

  std::string write() {
    // Which tensors an alloc statement declares; everything else is kernel-level.
    alloc_of_.assign(k_.tensors.size(), false);
    loop_seen_.assign(k_.loops.size(), false);
    mark_allocs(k_.body, 0);
    {
      std::unordered_map<std::string, int> names;
      for (size_t i = 0; i < k_.tensors.size(); ++i)
        if (!names.emplace(k_.tensors[i].name, static_cast<int>(i)).second)
          throw Error(ErrorCode::kDuplicateName, fmt::format("write_kernel_json: two tensors named {}", q(k_.tensors[i].name)));
    }
    Value root = Value::object();
    root.set("nsim_kernel", Value::integer(kKernelSchemaVersion));
    if (!k_.name.empty()) root.set("name", Value::string(k_.name));
    Value tensors = Value::array();
    for (size_t i = 0; i < k_.tensors.size(); ++i)
      if (!alloc_of_[i]) tensors.push(tensor(k_.tensors[i], false));
    if (tensors.size()) root.set("tensors", std::move(tensors));
    std::fill(loop_seen_.begin(), loop_seen_.end(), false);
    root.set("body", body(k_.body, 0));
    if (!k_.schedule.empty()) {
      Value sc = Value::array();
      for (const ScheduleEdge& e : k_.schedule) {
        Value pair = Value::array(), before = Value::array();
        pair.push(Value::string(e.after));
        for (const auto& b : e.before) before.push(Value::string(b));
        pair.push(std::move(before));
        sc.push(std::move(pair));
      }
      root.set("schedule", std::move(sc));
    }
    if (!stacks_.empty()) {
      Value st = Value::array();
      for (const std::string& s : stacks_) st.push(Value::string(s));
      root.set("stacks", std::move(st));
    }
    return json::write(root);
  }

 private:
  const Kernel& k_;
  mutable std::vector<std::string> stacks_;  ///< interned call stacks of the locs written (loc() is called from const members)
  mutable std::unordered_map<std::string, int64_t> stack_ids_;
  std::vector<bool> alloc_of_;
  std::vector<bool> loop_seen_;
  std::vector<int> scope_;  ///< enclosing loop ids

  [[noreturn]] static void bad(const std::string& msg) { throw Error(ErrorCode::kInternal, "write_kernel_json: " + msg); }

  void mark_allocs(const std::vector<Stmt>& b, int depth) {
    if (depth > kMaxLoopDepth) bad(fmt::format("loops nest deeper than {} levels", kMaxLoopDepth));
    for (const Stmt& s : b) {
      if (s.kind == Stmt::Kind::kAlloc) {
        if (s.index < 0 || static_cast<size_t>(s.index) >= k_.tensors.size()) bad(fmt::format("alloc of tensor id {} out of range", s.index));
        if (alloc_of_[static_cast<size_t>(s.index)]) bad(fmt::format("tensor {} is allocated twice", q(k_.tensors[static_cast<size_t>(s.index)].name)));
        alloc_of_[static_cast<size_t>(s.index)] = true;
      } else if (s.kind == Stmt::Kind::kLoop) {
        if (s.index < 0 || static_cast<size_t>(s.index) >= k_.loops.size()) bad(fmt::format("loop id {} out of range", s.index));
        if (loop_seen_[static_cast<size_t>(s.index)]) bad(fmt::format("loop id {} is referenced twice (or cyclically)", s.index));
        loop_seen_[static_cast<size_t>(s.index)] = true;
        mark_allocs(k_.loops[static_cast<size_t>(s.index)].body, depth + 1);
      } else if (s.index < 0 || static_cast<size_t>(s.index) >= k_.ops.size()) {
        bad(fmt::format("op id {} out of range", s.index));
      }
    }
  }

  Value loc(const SourceLoc& l) const {
    Value v = Value::object();
    if (!l.file.empty()) v.set("file", Value::string(l.file));
    if (l.line != 0) v.set("line", Value::integer(l.line));
    if (!l.function.empty()) v.set("function", Value::string(l.function));
    if (!l.stack.empty()) {  // interned: each distinct stack is written once, in "stacks"
      auto [it, fresh] = stack_ids_.try_emplace(l.stack, static_cast<int64_t>(stacks_.size()));
      if (fresh) stacks_.push_back(l.stack);
      v.set("stack", Value::integer(it->second));
    }
    return v;
  }

  static Value shape(const std::vector<int64_t>& s) {
    Value v = Value::array();
    for (int64_t d : s) v.push(Value::integer(d));
    return v;
  }

  Value tensor(const Tensor& t, bool alloc) const {
    Value v = Value::object();
    v.set("name", Value::string(t.name));
    v.set("buffer", Value::string(std::string(isa::space_name(t.space))));
    if (!alloc) {
      const auto kind = static_cast<size_t>(t.kind);
      v.set("kind", Value::string(std::string(kind < std::size(kTensorKindNames) ? kTensorKindNames[kind] : "internal")));
    }
    v.set("dtype", Value::string(std::string(dtype_name(t.dtype))));
    v.set("shape", shape(t.shape));
    if (alloc && t.bufs != 0) v.set("bufs", Value::integer(t.bufs));
    if (alloc && t.site_count != 0) v.set("site_count", Value::integer(t.site_count));
    if (alloc && t.address >= 0) v.set("address", Value::integer(t.address));
    if (!alloc && !t.init.empty()) v.set("init", Value::string(t.init));
    if (t.loc != SourceLoc{}) v.set("loc", loc(t.loc));
    return v;
  }

  Value body(const std::vector<Stmt>& b, int depth) {
    Value arr = Value::array();
    for (const Stmt& s : b) {
      Value st = Value::object();
      const auto idx = static_cast<size_t>(s.index);
      switch (s.kind) {
        case Stmt::Kind::kAlloc: st.set("alloc", tensor(k_.tensors[idx], true)); break;
        case Stmt::Kind::kLoop: st.set("loop", loop(s.index, depth)); break;
        case Stmt::Kind::kOp: st = op(k_.ops[idx]); break;
      }
      arr.push(std::move(st));
    }
    return arr;
  }

  Value loop(int id, int depth) {
    const Loop& l = k_.loops[static_cast<size_t>(id)];
    Value v = Value::object();
    v.set("var", Value::string(l.var));
    if (l.start != 0) v.set("start", Value::integer(l.start));
    v.set("stop", Value::integer(l.stop));
    if (l.step != 1) v.set("step", Value::integer(l.step));
    if (l.kind != LoopKind::kAffine) {
      const auto kind = static_cast<size_t>(l.kind);
      v.set("kind", Value::string(std::string(kind < std::size(kLoopKindNames) ? kLoopKindNames[kind] : "affine")));
    }
    scope_.push_back(id);
    v.set("body", body(l.body, depth + 1));
    scope_.pop_back();
    if (l.loc != SourceLoc{}) v.set("loc", loc(l.loc));
    return v;
  }

  Value expr(const Affine& a) const {
    if (a.is_const()) return Value::integer(a.c);
    std::string s;
    for (auto [id, coef] : a.terms) {
      if (id < 0 || static_cast<size_t>(id) >= k_.loops.size()) bad(fmt::format("index term of loop id {} out of range", id));
      const std::string& var = k_.loops[static_cast<size_t>(id)].var;
      if (s.empty()) {
        if (coef == 1) {
          s = var;
        } else if (coef == -1) {
          s = "-" + var;
        } else {
          s = fmt::format("{}*{}", coef, var);
        }
      } else {
        const bool neg = coef < 0;
        const uint64_t mag = neg ? 0 - static_cast<uint64_t>(coef) : static_cast<uint64_t>(coef);
        s += neg ? " - " : " + ";
        s += mag == 1 ? var : fmt::format("{}*{}", mag, var);
      }
    }
    if (a.c > 0) s += fmt::format(" + {}", a.c);
    if (a.c < 0) s += fmt::format(" - {}", 0 - static_cast<uint64_t>(a.c));
    return Value::string(std::move(s));
  }

  Value access(const Access& a) const {
    if (a.tensor < 0 || static_cast<size_t>(a.tensor) >= k_.tensors.size()) bad(fmt::format("access of tensor id {} out of range", a.tensor));
    const Tensor& t = k_.tensors[static_cast<size_t>(a.tensor)];
    if (a.dims.empty() && a.order.empty() && !a.dtype && a.shape.empty()) return Value::string(t.name);
    Value idx = Value::array();
    for (const DimAccess& d : a.dims) {
      if (!d.broadcast && d.size == 1 && d.step == 1) {
        idx.push(expr(d.start));
        continue;
      }
      Value o = Value::object();
      if (d.broadcast) {
        o.set("broadcast", Value::integer(d.size));
        if (!(d.start.is_const() && d.start.c == 0)) o.set("start", expr(d.start));
      } else {
        if (!(d.start.is_const() && d.start.c == 0)) o.set("start", expr(d.start));
        o.set("size", Value::integer(d.size));
      }
      if (d.step != 1) o.set("step", Value::integer(d.step));
      idx.push(std::move(o));
    }
    Value v = Value::object();
    v.set("tensor", Value::string(t.name));
    if (!a.shape.empty()) v.set("shape", shape(a.shape));
    if (!a.strides.empty()) v.set("strides", shape(a.strides));
    if (!a.dims.empty()) v.set("index", std::move(idx));
    if (!a.order.empty()) {
      Value ord = Value::array();
      for (int d : a.order) ord.push(Value::integer(d));
      v.set("order", std::move(ord));
    }
    if (a.dtype) v.set("dtype", Value::string(std::string(dtype_name(*a.dtype))));
    return v;
  }

  static Value float_value(float f) {
    if (std::isnan(f)) return Value::string("nan");
    if (std::isinf(f)) return Value::string(f > 0 ? "inf" : "-inf");
    // Shortest text that reads back (through double) to the same float.
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, f);
    double d = 0.0;
    std::from_chars(buf, r.ptr, d);
    if (static_cast<float>(d) != f || std::signbit(d) != std::signbit(f)) d = static_cast<double>(f);
    return Value::number(d);
  }

  Value op(const Op& o) const {
    Value v = Value::object();
    v.set("op", Value::string(o.name));
    const std::vector<std::string> slots = slot_names(o.name);
    if (slots.empty()) throw Error(ErrorCode::kUnknownOp, fmt::format("write_kernel_json: unknown op {}", q(o.name)), o.loc);
    if (o.engine) v.set("engine", Value::string(std::string(isa::engine_name(*o.engine))));
    for (size_t i = 0; i < o.operands.size(); ++i) {
      if (!o.operands[i]) continue;
      if (i >= slots.size()) bad(fmt::format("op {} has an operand in slot {}, it has {} slots", q(o.name), i, slots.size()));
      v.set(slots[i], access(*o.operands[i]));
    }
    if (o.alu0 != isa::AluOp::kBypass) v.set("alu0", Value::string(std::string(isa::alu_name(o.alu0))));
    if (o.alu1 != isa::AluOp::kBypass) v.set("alu1", Value::string(std::string(isa::alu_name(o.alu1))));
    if (o.act != isa::ActFunc::kCopy) v.set("act", Value::string(std::string(isa::act_name(o.act))));
    if (o.reduce_cmd != isa::ReduceCmd::kIdle) {
      const auto rc = static_cast<size_t>(o.reduce_cmd);
      if (rc >= std::size(kReduceCmdNames)) bad(fmt::format("reduce_cmd {} out of range", rc));
      v.set("reduce_cmd", Value::string(std::string(kReduceCmdNames[rc])));
    }
    if (o.flags != 0) {
      Value f = Value::array();
      unsigned rest = o.flags;
      for (size_t b = 0; b < std::size(kFlagNames); ++b)
        if (o.flags & (1u << b)) {
          f.push(Value::string(std::string(kFlagNames[b])));
          rest &= ~(1u << b);
        }
      if (rest) f.push(Value::integer(rest));
      v.set("flags", std::move(f));
    }
    {
      size_t n = 4;
      while (n > 0 && o.imm[n - 1] == kImmDefault[n - 1] && std::signbit(o.imm[n - 1]) == std::signbit(kImmDefault[n - 1])) --n;
      if (n) {
        Value a = Value::array();
        for (size_t i = 0; i < n; ++i) a.push(float_value(o.imm[i]));
        v.set("imm", std::move(a));
      }
    }
    {
      size_t n = 10;
      while (n > 0 && o.iimm[n - 1] == kIimmDefault[n - 1]) --n;
      for (const auto& [j, e] : o.iimm_expr) n = std::max(n, static_cast<size_t>(j) + 1);
      if (n) {
        Value a = Value::array();
        for (size_t i = 0; i < n; ++i) {
          auto e = std::find_if(o.iimm_expr.begin(), o.iimm_expr.end(), [&](const auto& x) { return x.first == i; });
          a.push(e != o.iimm_expr.end() ? expr(e->second) : Value::integer(o.iimm[i]));
        }
        v.set("iimm", std::move(a));
      }
    }
    if (std::any_of(o.shuffle.begin(), o.shuffle.end(), [](uint8_t x) { return x != 0; })) {
      Value a = Value::array();
      for (uint8_t x : o.shuffle) a.push(Value::integer(x));
      v.set("shuffle", std::move(a));
    }
    if (o.axis_count != 0) v.set("axis_count", Value::integer(o.axis_count));
    if (o.dma_queue) v.set("dma_queue", Value::integer(*o.dma_queue));
    if (!o.label.empty()) v.set("label", Value::string(o.label));
    if (o.order_group) v.set("order_group", Value::integer(o.order_group));
    if (!o.after.empty()) {
      Value a = Value::array();
      for (const std::string& l : o.after) a.push(Value::string(l));
      v.set("after", std::move(a));
    }
    if (o.loc != SourceLoc{}) v.set("loc", loc(o.loc));
    return v;
  }
};

}  // namespace

Kernel parse_kernel_json(std::string_view text, const std::string& filename) { return Reader(filename).read(text); }

Kernel parse_kernel_value(const json::Value& root, const std::string& filename) {
  return Reader(filename).read_root(root, nullptr);
}

Kernel parse_kernel_value(const json::Value& root, const BodySources& bodies, const std::string& filename) {
  Reader r(filename);
  r.set_deferred(&bodies);
  const BodySource top = [&](const std::function<void(size_t, json::Value)>& fn, json::Value& whole) {
    return bodies(0, fn, whole);
  };
  return r.read_root(root, &top);
}

std::string write_kernel_json(const Kernel& k) { return Writer(k).write(); }

}  // namespace nsim::frontend

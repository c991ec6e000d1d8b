// _nsim: the private pybind11 module behind the `nsim` Python package (python/nsim/_core.py).
// It runs kernel.json files exactly as `nsim run|check|disasm|config` do (frontend/cli/main.cpp),
// with numpy arrays instead of .npy files. Every nsim::Error becomes _nsim.NsimError with the
// attributes code (the NSIM-Exxx string), message, file, line, function.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "engines/bounds.h"
#include "engines/params.h"
#include "engines/simulator.h"
#include "frontend/compiler/allocate.h"
#include "frontend/analyze.h"
#include "frontend/disasm.h"
#include "frontend/eager.h"
#include "frontend/gzip.h"
#include "frontend/diff.h"
#include "frontend/inputs.h"
#include "frontend/json.h"
#include "frontend/ir.h"
#include "frontend/lower.h"
#include "frontend/progress.h"
#include "frontend/multicore.h"
#include "frontend/tables.h"
#include "isa/semantics/parallel.h"
#include "isa/isa.h"

#ifndef NSIM_VERSION
#define NSIM_VERSION "dev"
#endif

namespace py = pybind11;
using namespace nsim;

namespace {

PyObject* g_nsim_error = nullptr;  // _nsim.NsimError (owned by the module; one extra reference kept)

/// A Python str from bytes that should be UTF-8; a stray byte becomes U+FFFD rather than a
/// UnicodeDecodeError raised in place of the NsimError being reported.
py::str lenient_str(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

std::string config_name(const std::string& c) { return c == "inf2" ? "trn1" : c; }

sim::Config load_cfg(const std::string& config, const std::vector<std::string>& overrides) {
  return engines::load_config(config_name(config), overrides);
}

// Run `f`; non-nsim C++ exceptions (other than pybind11's own) become kInternal like in the CLI.
template <class F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const py::error_already_set&) {
    throw;
  } catch (const py::builtin_exception&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kInternal, "out of memory");
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kInternal, fmt::format("internal error: {}", e.what()));
  }
}

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("({}{})", fmt::join(s, ", "), s.size() == 1 ? "," : "");
}

// The data of a C-contiguous numpy array (its __array_interface__ address): read or filled in place,
// without the copies of tobytes() / frombuffer(...).copy() (each a pass over the whole tensor).
uint8_t* array_data(const py::object& contiguous) {
  return reinterpret_cast<uint8_t*>(
      py::cast<uintptr_t>(contiguous.attr("__array_interface__")["data"].cast<py::tuple>()[0]));
}

// An input's bytes in its tensor's dtype. Where the array already has that dtype: a view of the
// C-contiguous array itself (the caller's, when it is contiguous), kept alive by `array`, so a large input
// is not held twice on the host; its bytes are copied once, into the simulator's HBM. Else a converted
// copy in `bytes`. Only destroyed with the GIL held (`array`).
struct InputData {
  py::object array;
  std::vector<uint8_t> bytes;
  const uint8_t* data = nullptr;  // into `array` or `bytes` (a moved vector keeps its buffer)
  size_t size = 0;
  frontend::InputBytes view() const { return {data, size}; }
};

InputData view_of(py::object contiguous) {
  InputData d;
  d.size = contiguous.attr("nbytes").cast<size_t>();
  d.data = d.size ? array_data(contiguous) : nullptr;
  d.array = std::move(contiguous);
  return d;
}

InputData copy_of(std::vector<uint8_t> bytes) {
  InputData d;
  d.bytes = std::move(bytes);
  d.data = d.bytes.data();
  d.size = d.bytes.size();
  return d;
}

// Convert a numpy array (any numeric/bool dtype, or an ml_dtypes dtype) to the bytes of tensor `t`.
// Arrays are handled through numpy's Python API only (no pybind11 numpy internals), so the module
// works with any numpy (1.x or 2.x) whatever pybind11 version it was built with.
InputData input_data(const frontend::Tensor& t, const py::handle& obj) {
  py::module_ np = py::module_::import("numpy");
  py::object arr = np.attr("ascontiguousarray")(obj);
  const auto shape = arr.attr("shape").cast<std::vector<int64_t>>();
  if (shape != t.shape)
    throw Error(ErrorCode::kBadInput, fmt::format("input '{}': shape {} does not match the tensor shape {}", t.name,
                                                  shape_str(shape), shape_str(t.shape)));
  py::object dt = arr.attr("dtype");
  const auto dname = py::str(dt.attr("name")).cast<std::string>();
  const auto kind = py::str(dt.attr("kind")).cast<std::string>();
  const auto itemsize = dt.attr("itemsize").cast<int>();
  const int eb = dtype_bytes(t.dtype);
  const auto n = arr.attr("size").cast<int64_t>();
  if (dname == dtype_name(t.dtype) && itemsize == eb) return view_of(arr);  // same dtype: raw bytes
  if (dtype_is_mx_x4(t.dtype)) {  // no cast path: the packed bits as they are (x4 structured dtype or uint)
    if (itemsize == eb && (kind == "V" || kind == "u")) return view_of(arr);
    throw Error(ErrorCode::kBadInput,
                fmt::format("input '{}': an {} tensor takes the packed bits only ({}-byte unsigned or the x4 dtype), "
                            "got numpy dtype '{}' (there is no cast path to an MX x4 type)",
                            t.name, dtype_name(t.dtype), eb, dname));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * static_cast<size_t>(eb));
  if (dtype_is_int(t.dtype) && (kind == "i" || kind == "u" || kind == "b")) {  // integer -> integer: exact
    const py::object wide = np.attr("ascontiguousarray")(arr, py::arg("dtype") = np.attr("int64"));
    const uint8_t* v = n ? array_data(wide) : nullptr;
    for (int64_t i = 0; i < n; ++i) {
      int64_t x = 0;
      std::memcpy(&x, v + static_cast<size_t>(i) * 8, 8);
      store_int(t.dtype, &bytes[static_cast<size_t>(i * eb)], x);
    }
    return copy_of(std::move(bytes));
  }
  if (kind != "f" && kind != "i" && kind != "u" && kind != "b" && kind != "V")
    throw Error(ErrorCode::kBadInput,
                fmt::format("input '{}': numpy dtype '{}' cannot be converted to {}", t.name, dname, dtype_name(t.dtype)));
  const py::object f = np.attr("ascontiguousarray")(arr, py::arg("dtype") = np.attr("float32"));
  if (n) store_f32_n(t.dtype, bytes.data(), reinterpret_cast<const float*>(array_data(f)), n);
  return copy_of(std::move(bytes));
}

// numpy dtype of an nsim dtype: native where numpy has it, ml_dtypes for bf16/fp8, float32 for tf32.
py::object numpy_dtype(DType dt) {
  py::module_ np = py::module_::import("numpy");
  switch (dt) {
    case DType::kBFloat16:
    case DType::kFloat8E4M3:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
    case DType::kFloat8E8M0FNU:
      return np.attr("dtype")(py::module_::import("ml_dtypes").attr(std::string(dtype_name(dt)).c_str()));
    case DType::kFloat8E5M2X4:
    case DType::kFloat8E4M3FNX4:
    case DType::kFloat4E2M1FNX4: {  // nki-api.md 3.2: a single-field structured dtype named after the type
      const std::string name(dtype_name(dt));
      py::list fields;
      fields.append(py::make_tuple(name, dtype_bytes(dt) == 4 ? "<u4" : "<u2"));
      return np.attr("dtype")(fields);
    }
    case DType::kTFloat32: return np.attr("dtype")("float32");
    default: return np.attr("dtype")(std::string(dtype_name(dt)));
  }
}

/// An output's bytes handed to numpy without a copy: the simulator's HBM storage of the tensor, exposed
/// through the buffer protocol (_nsim._HostBytes); the array made over it keeps it alive and writable.
struct HostBytes {
  memory::Buffer b;
};

/// A new numpy array of output tensor `t` over its HBM storage `b`, moved out of the simulator (zeros
/// when empty: no storage).
py::object output_array(const frontend::Tensor& t, memory::Buffer b) {
  py::module_ np = py::module_::import("numpy");
  py::object dt = numpy_dtype(t.dtype);
  py::tuple shape = py::cast(t.shape);
  if (b.empty()) return np.attr("zeros")(shape, py::arg("dtype") = dt);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  const auto want = static_cast<size_t>(n) * dt.attr("itemsize").cast<size_t>();
  if (want != b.size())
    throw Error(ErrorCode::kInternal, fmt::format("output '{}': {} bytes of HBM storage, {} expected", t.name, b.size(), want));
  py::object holder = py::cast(HostBytes{std::move(b)});
  return np.attr("frombuffer")(holder, py::arg("dtype") = dt).attr("reshape")(shape);
}

py::list lines_list(const std::vector<Simulator::LineStats>& stats) {
  py::list out;
  for (const auto& l : stats) {
    py::dict d;
    d["src"] = l.loc.str();
    d["file"] = l.loc.file;
    d["line"] = l.loc.line;
    d["function"] = l.loc.function;
    d["instructions"] = l.instructions;
    d["instruction_time_ns"] = sim::ps_to_ns(l.instr_time);
    out.append(std::move(d));
  }
  return out;
}

// What fast-forward made of each loop source line (Simulator::fast_forward_loops) as dicts {src, file, line,
// function, instances: {outcome: count}, outcome, why}: `outcome` the main one (engines::ff_main_outcome), `why`
// its text ("" when skipped).
py::list ff_loops_list(const std::vector<Simulator::FfLoop>& loops) {
  py::list out;
  for (const Simulator::FfLoop& fl : loops) {
    py::dict d, n;
    d["src"] = fl.loc.str();
    d["file"] = fl.loc.file;
    d["line"] = fl.loc.line;
    d["function"] = fl.loc.function;
    for (size_t i = 0; i < fl.n.size(); ++i)
      if (fl.n[i]) n[engines::kFfOutcomes[i].name] = fl.n[i];
    d["instances"] = std::move(n);
    const engines::FfOutcome main = engines::ff_main_outcome(fl.n);
    d["outcome"] = engines::ff_outcome(main).name;
    d["why"] = main == engines::FfOutcome::kSkipped ? "" : engines::ff_outcome(main).what;
    out.append(std::move(d));
  }
  return out;
}

// The sanitizer's reports as dicts {code, check, op, tensor, slot, detail, file, line, function,
// instruction, count, fix, message}.
py::list check_list(const std::vector<engines::CheckReport>& reports) {
  py::list out;
  for (const engines::CheckReport& r : reports) {
    py::dict d;
    d["code"] = r.info().code;
    d["check"] = r.info().name;
    d["fix"] = r.info().fix;
    d["op"] = r.op;
    d["tensor"] = r.tensor;
    d["slot"] = r.slot;
    d["detail"] = r.detail;
    d["file"] = r.loc.file;
    d["line"] = r.loc.line;
    d["function"] = r.loc.function;
    d["instruction"] = r.instruction;
    d["count"] = r.count;
    d["message"] = r.str();
    out.append(std::move(d));
  }
  return out;
}

// _nsim.EagerSession: numerics instruction by instruction while a kernel is traced (frontend/eager.h).
class PyEagerSession {
 public:
  PyEagerSession(const std::string& config, const std::vector<std::string>& overrides)
      : s_(guarded([&] { return frontend::EagerSession(load_cfg(config, overrides)); })) {}
  void add_input(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
                 const py::object& array) {
    guarded([&] {
      const auto dt = dtype_from_name(dtype);
      if (!dt) throw Error(ErrorCode::kBadDtype, fmt::format("eager: unknown dtype '{}'", dtype));
      frontend::Tensor t;
      t.name = name;
      t.space = isa::Space::kHbm;
      t.dtype = *dt;
      t.shape = shape;
      const InputData d = array.is_none() ? InputData{} : input_data(t, array);  // copied once, into HBM
      s_.add_hbm(name, shape, *dt, d.data, d.size);
      return 0;
    });
  }
  bool has_tensor(const std::string& name) const { return s_.has_tensor(name); }
  uint64_t run(const std::string& fragment) {
    return guarded([&] {
      py::gil_scoped_release nogil;
      return s_.run(fragment);
    });
  }
  py::bytes read(const std::string& name) const {
    const std::vector<uint8_t> b = guarded([&] { return s_.read(name); });
    return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
  }
  uint64_t instructions() const { return s_.instructions(); }

 private:
  frontend::EagerSession s_;
};

/// The effective configuration's YAML text, made when first asked for (Profile.config_yaml): writing
/// it took ~1 ms, a quarter of simulating a small kernel.
py::cpp_function lazy_yaml(const sim::Config& cfg) {
  auto keep = std::make_shared<const sim::Config>(cfg);
  return py::cpp_function([keep]() { return keep->to_yaml(); });
}

/// The stats as nested Python dicts, the structure of sim::StatsRegistry::json() read back by json.loads
/// (members in order of first appearance; a leaf is {"value", "unit", "description"}, the value an int
/// when integral and below 2^53, None when not finite; a name that is also the prefix of another keeps
/// its leaf). Made directly: writing the JSON text and parsing it again cost ~2.8 M CPU instructions per
/// run, an eighth of a timing-only 1024^3 GEMM (docs/performance.md).
py::dict stats_dict(const sim::StatsRegistry& reg) {
  py::dict root;
  const py::str k_value("value"), k_unit("unit"), k_description("description");
  const auto is_leaf = [&](const py::handle& h) {
    if (!PyDict_Check(h.ptr())) return false;
    PyObject* u = PyDict_GetItemWithError(h.ptr(), k_unit.ptr());
    return u != nullptr && PyUnicode_Check(u);
  };
  for (const sim::StatEntry& e : reg.entries()) {
    py::dict node = root;
    size_t pos = 0;
    bool dropped = false;
    for (size_t dot = e.name.find('.'); dot != std::string::npos; pos = dot + 1, dot = e.name.find('.', pos)) {
      py::str key(e.name.data() + pos, dot - pos);
      PyObject* child = PyDict_GetItemWithError(node.ptr(), key.ptr());  // borrowed
      if (child != nullptr && is_leaf(child)) {
        dropped = true;
        break;
      }
      if (child == nullptr || !PyDict_Check(child)) {
        py::dict fresh;
        node[key] = fresh;
        node = fresh;
      } else {
        node = py::reinterpret_borrow<py::dict>(child);
      }
    }
    if (dropped) continue;
    py::dict leaf;
    const double v = e.value;
    if (!std::isfinite(v))
      leaf[k_value] = py::none();
    else if (v == std::floor(v) && std::fabs(v) < 0x1p53)
      leaf[k_value] = py::int_(static_cast<int64_t>(v));
    else
      leaf[k_value] = py::float_(v);
    leaf[k_unit] = py::str(e.unit);
    leaf[k_description] = py::str(e.description);
    node[py::str(e.name.data() + pos, e.name.size() - pos)] = std::move(leaf);
  }
  return root;
}

/// Options of one simulation (the keyword arguments of run_kernel / Kernel.simulate).
struct RunArgs {
  std::string config = "trn2";
  std::vector<std::string> overrides;
  bool timing_only = false;
  std::string trace_path;
  uint64_t seed = 0;
  uint64_t trace_limit = 0;
  std::pair<double, double> trace_window{0.0, 0.0};
  bool check = false;
  uint64_t max_instructions = 0;
  double max_sim_time_ns = 0.0;
  bool fast_forward = false;
};

/// Verify, lower and simulate a parsed kernel: (outputs, stats dict, lines, config_yaml, check_reports,
/// fast_forward_loops).
/// The kernel is only read, so one parsed kernel serves any number of runs (Kernel.simulate).
py::tuple simulate_kernel(const frontend::Kernel& k, const py::dict& inputs, const RunArgs& a,
                          const py::object& progress) {
  const sim::Config cfg = load_cfg(a.config, a.overrides);
  const bool timing_only = a.timing_only;
  // Inputs are converted up front (needs the GIL); names and shapes are checked before running. The
  // arrays viewed are read during the run, without the GIL (as the kernel's own inputs: another Python
  // thread writing them meanwhile races with the run).
  std::map<std::string, InputData> given;
  frontend::InputViews views;
  for (const auto& [key, value] : inputs) {
    const std::string name = py::str(key);
    const int id = k.find_tensor(name);
    if (id < 0 || k.tensors[static_cast<size_t>(id)].kind != frontend::TensorKind::kInput ||
        k.tensors[static_cast<size_t>(id)].space != isa::Space::kHbm)
      throw Error(ErrorCode::kBadInput, fmt::format("input '{}' is not an input tensor of kernel '{}'", name, k.name));
    if (!timing_only) views[name] = (given[name] = input_data(k.tensors[static_cast<size_t>(id)], value)).view();
  }
  SimOptions opts;
  opts.numerics = !timing_only;
  opts.check = a.check && !timing_only;
  opts.trace_path = a.trace_path;
  opts.trace_limit = a.trace_limit;
  opts.trace_window_start_ns = a.trace_window.first, opts.trace_window_end_ns = a.trace_window.second;
  opts.max_instructions = a.max_instructions;
  opts.max_sim_time_ns = a.max_sim_time_ns;
  opts.fast_forward = a.fast_forward;
  std::optional<Simulator> sim;
  if (!k.core_programs.empty()) {  // an LNC=2 launch (frontend/multicore.h)
    std::map<std::string, memory::Buffer> raw_outputs;  // the shared HBM's storage, moved out (no copy)
    std::optional<frontend::MultiCoreRun> mc;
    std::optional<sim::StatsRegistry> stats;
    {
      py::gil_scoped_release nogil;
      mc.emplace(k, cfg, opts);
      if (!timing_only) mc->write_inputs(views, a.seed);
      mc->run();
      stats.emplace(mc->stats());
      if (!timing_only)
        for (const auto& t : k.tensors)
          if (t.space == isa::Space::kHbm && t.kind == frontend::TensorKind::kOutput)
            raw_outputs[t.name] = mc->core(0).take_hbm(t.name);
    }
    py::dict outputs;
    for (const auto& t : k.tensors)
      if (auto it = raw_outputs.find(t.name); it != raw_outputs.end())
        outputs[py::str(t.name)] = output_array(t, std::move(it->second));
    py::list lines = lines_list(mc->line_stats());
    py::list reports = check_list(mc->check_reports());
    return py::make_tuple(outputs, stats_dict(*stats), lines, lazy_yaml(cfg), reports, py::list());  // (no fast-forward)
  }
  std::optional<sim::StatsRegistry> stats;
  {
    py::gil_scoped_release nogil;
    sim.emplace(cfg, opts);
    frontend::AllocationPlan plan;  // worked out once, by the verifier, for the lowering
    frontend::verify_kernel(k, sim->params(), &plan);
    frontend::Lowering::allocate_hbm(k, *sim);
    if (!timing_only) frontend::write_inputs(k, *sim, views, a.seed);
    frontend::Lowering low(k, *sim, &plan);
    // progress(instructions, simulated_ns) once the run takes over 2 s, about once a second
    // (frontend/progress.h), with the GIL held only for the call.
    frontend::ProgressClock clock;
    if (!progress.is_none())
      low.set_progress([&](uint64_t n, sim::Ps simulated) {
        if (!clock.due()) return;
        py::gil_scoped_acquire gil;
        progress(n, sim::ps_to_ns(simulated));
      });
    low.run();
    sim->finish();
    if (clock.shown()) {  // the last call: the whole run
      py::gil_scoped_acquire gil;
      progress(low.instructions(), sim::ps_to_ns(sim->total_time()));
    }
    stats.emplace(sim->stats());
  }
  // Outputs: numpy arrays over the simulator's HBM storage, moved out of it (no copy; the simulator is
  // done with it).
  py::dict outputs;
  if (!timing_only)
    for (const auto& t : k.tensors)
      if (t.space == isa::Space::kHbm && t.kind == frontend::TensorKind::kOutput)
        outputs[py::str(t.name)] = output_array(t, sim->take_hbm(t.name));
  return py::make_tuple(outputs, stats_dict(*stats), lines_list(sim->line_stats()), lazy_yaml(cfg),
                        check_list(sim->check_reports()), ff_loops_list(sim->fast_forward_loops()));
}

py::tuple run_kernel(const std::string& kernel_json, const py::dict& inputs, const std::string& config,
                     const std::vector<std::string>& overrides, bool timing_only, const std::string& trace_path,
                     uint64_t seed, const std::string& filename, uint64_t trace_limit,
                     std::pair<double, double> trace_window, bool check, uint64_t max_instructions,
                     double max_sim_time_ns, const py::object& progress, bool fast_forward) {
  return guarded([&]() -> py::tuple {
    const frontend::Kernel k = frontend::parse_kernel_json(kernel_json, filename);
    return simulate_kernel(k, inputs,
                           RunArgs{config, overrides, timing_only, trace_path, seed, trace_limit, trace_window, check,
                                   max_instructions, max_sim_time_ns, fast_forward},
                           progress);
  });
}

/// A kernel dict (the Python tracer's, json.loads') as a JSON value, without writing its text: what
/// json.dumps would write, read back by json::parse, for dicts with string keys, lists, tuples, str,
/// int, float, bool and None; other objects go through `fallback` (nsim._core._json_default: numpy
/// scalars and arrays, sets), whose exceptions propagate. Anything json.dumps + json::parse would treat
/// differently (non-string keys, NaN or infinite floats, strings that are not valid UTF-8, nesting deeper
/// than json::kMaxDepth, e.g. a cycle) makes convert() return nullopt: the caller then takes the text path,
/// which reports these as it always has.
class FromPython {
 public:
  explicit FromPython(py::handle fallback) : fallback_(fallback) {}
  std::optional<frontend::json::Value> convert(py::handle obj) {
    try {
      return value(obj, 0);
    } catch (const NotDirect&) {
      return std::nullopt;
    }
  }

  /// A single-core kernel dict read with its "body" converted one statement at a time, and a loop statement's
  /// body likewise, as a kernel.json text is read (parse_kernel_value with BodySources): the converted values of
  /// a kernel with its loops unrolled outweigh the kernel they describe (~4 KB per op), and held whole they set
  /// a run's peak memory. None when the dict needs convert() (no "body" list, a multi-core launch) or the text
  /// path.
  std::optional<frontend::Kernel> read_streamed(py::handle obj, const std::string& filename) {
    PyObject* d = obj.ptr();
    if (!PyDict_Check(d)) return std::nullopt;
    PyObject* body = PyDict_GetItemString(d, "body");  // borrowed
    if (body == nullptr || !PyList_Check(body) || PyDict_GetItemString(d, "core_programs") ||
        PyDict_GetItemString(d, "cores"))
      return std::nullopt;
    try {
      frontend::json::Value top = frontend::json::Value::object();
      PyObject *key = nullptr, *item = nullptr;
      Py_ssize_t pos = 0;
      while (PyDict_Next(d, &pos, &key, &item)) {
        const std::string k = key_of(key);
        if (k != "body") top.set(k, value(item, 1));
      }
      // (The lists are the dict's, alive while it is read: borrowed. Their statements' conversion calls no
      // Python code but the fallback of non-JSON values, which get their own objects.)
      bodies_.assign(1, {body, 2});
      const frontend::BodySources each = [&](int token, const std::function<void(size_t, frontend::json::Value)>& fn,
                                             frontend::json::Value&) {
        const auto [list, depth] = bodies_[static_cast<size_t>(token)];
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i)
          fn(static_cast<size_t>(i), statement(py::handle(PyList_GET_ITEM(list, i)), depth));
        return true;
      };
      return frontend::parse_kernel_value(top, each, filename);
    } catch (const NotDirect&) {
      return std::nullopt;
    }
  }

 private:
  struct NotDirect {};
  using Value = frontend::json::Value;
  /// read_streamed's bodies by token (0: the kernel's): the list and the depth of its statements.
  std::vector<std::pair<PyObject*, int>> bodies_;

  /// A statement at `depth` for read_streamed: a loop's members converted but its body, which becomes an
  /// empty array at position (-1, token) (frontend::BodySources), read when the loop is; anything else whole.
  Value statement(py::handle obj, int depth) {
    PyObject* p = obj.ptr();
    PyObject* lp = PyDict_Check(p) && PyDict_Size(p) == 1 ? PyDict_GetItemString(p, "loop") : nullptr;
    PyObject* body = lp != nullptr && PyDict_Check(lp) ? PyDict_GetItemString(lp, "body") : nullptr;
    if (body == nullptr || !PyList_Check(body) || depth + 2 > frontend::json::kMaxDepth) return value(obj, depth);
    Value loop = Value::object();
    loop.reserve(static_cast<size_t>(PyDict_Size(lp)));
    PyObject *key = nullptr, *item = nullptr;
    Py_ssize_t pos = 0;
    while (PyDict_Next(lp, &pos, &key, &item)) {
      std::string k = key_of(key);
      if (k == "body") {
        Value marker = Value::array();
        marker.set_pos(-1, static_cast<int>(bodies_.size()));
        bodies_.emplace_back(body, depth + 3);
        loop.set(std::move(k), std::move(marker));
      } else {
        loop.set(std::move(k), value(item, depth + 2));
      }
    }
    Value st = Value::object();
    st.set("loop", std::move(loop));
    return st;
  }
  /// A dict key as UTF-8; NotDirect for what json.dumps would treat otherwise.
  static std::string key_of(PyObject* key) {
    if (!PyUnicode_Check(key)) throw NotDirect{};
    Py_ssize_t n = 0;
    const char* u = PyUnicode_AsUTF8AndSize(key, &n);
    if (u == nullptr) {
      PyErr_Clear();
      throw NotDirect{};
    }
    return std::string(u, static_cast<size_t>(n));
  }
  py::handle fallback_;

  Value value(py::handle obj, int depth) {
    PyObject* p = obj.ptr();
    if (depth > frontend::json::kMaxDepth) throw NotDirect{};
    if (p == Py_None) return Value::null();
    if (PyBool_Check(p)) return Value::boolean(p == Py_True);
    if (PyLong_Check(p)) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(p, &overflow);
      if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
      if (overflow != 0) throw NotDirect{};  // the parser's double of a long integer text: the text path
      return Value::integer(static_cast<int64_t>(v));
    }
    if (PyFloat_Check(p)) {
      const double d = PyFloat_AS_DOUBLE(p);
      if (!std::isfinite(d)) throw NotDirect{};
      return Value::real(d);
    }
    if (PyUnicode_Check(p)) {
      Py_ssize_t n = 0;
      const char* u = PyUnicode_AsUTF8AndSize(p, &n);
      if (u == nullptr) {  // lone surrogates
        PyErr_Clear();
        throw NotDirect{};
      }
      return Value::string(std::string(u, static_cast<size_t>(n)));
    }
    if (PyDict_Check(p)) {
      Value v = Value::object();
      v.reserve(static_cast<size_t>(PyDict_Size(p)));
      PyObject *key = nullptr, *item = nullptr;
      Py_ssize_t pos = 0;
      while (PyDict_Next(p, &pos, &key, &item)) v.set(key_of(key), value(item, depth + 1));
      return v;
    }
    if (PyList_Check(p) || PyTuple_Check(p)) {
      Value v = Value::array();
      const size_t n = static_cast<size_t>(PySequence_Fast_GET_SIZE(p));
      v.reserve(n);
      PyObject** items = PySequence_Fast_ITEMS(p);
      for (size_t i = 0; i < n; ++i) v.push(value(items[i], depth + 1));
      return v;
    }
    py::object made = py::reinterpret_borrow<py::object>(fallback_)(obj);  // raises for non-JSON values
    return value(made, depth + 1);
  }
};

/// _nsim.Kernel: a kernel read once (kernel.json text) and simulated any number of times, e.g. over
/// the configurations of a sweep, without reading the text again (docs/kernel-json.md, "Loading a
/// kernel once").
class PyKernel {
 public:
  PyKernel(const std::string& kernel_json, const std::string& filename)
      : k_(guarded([&] { return frontend::parse_kernel_json(kernel_json, filename); })), file_(filename) {}
  PyKernel(frontend::Kernel k, const std::string& filename) : k_(std::move(k)), file_(filename) {}
  /// A kernel dict read without its JSON text (FromPython); None when it needs the text path.
  static std::optional<PyKernel> from_object(const py::handle& obj, const py::handle& fallback,
                                             const std::string& filename) {
    FromPython from(fallback);
    std::optional<frontend::Kernel> k = guarded([&] { return from.read_streamed(obj, filename); });
    if (k) return PyKernel(std::move(*k), filename);
    std::optional<frontend::json::Value> v = from.convert(obj);
    if (!v) return std::nullopt;
    return guarded([&] { return PyKernel(frontend::parse_kernel_value(*v, filename), filename); });
  }
  py::tuple simulate(const py::dict& inputs, const std::string& config, const std::vector<std::string>& overrides,
                     bool timing_only, const std::string& trace_path, uint64_t seed, uint64_t trace_limit,
                     std::pair<double, double> trace_window, bool check, uint64_t max_instructions,
                     double max_sim_time_ns, const py::object& progress, bool fast_forward) const {
    return guarded([&]() -> py::tuple {
      return simulate_kernel(k_, inputs,
                             RunArgs{config, overrides, timing_only, trace_path, seed, trace_limit, trace_window,
                                     check, max_instructions, max_sim_time_ns, fast_forward},
                             progress);
    });
  }
  void check(const std::string& config, const std::vector<std::string>& overrides) const;
  const std::string& name() const { return k_.name; }
  const std::string& filename() const { return file_; }
  std::string to_json() const {
    return guarded([&] {
      if (!k_.core_programs.empty())  // docs/kernel-json.md: the writer writes single-core kernels only
        throw Error(ErrorCode::kMultiCoreLaunch,
                    "to_json: a multi-core launch is not written by nsim (write_kernel_json writes one core)");
      return frontend::write_kernel_json(k_);
    });
  }
  const frontend::Kernel& kernel() const { return k_; }

 private:
  frontend::Kernel k_;  // never changed after construction: runs only read it
  std::string file_;
};

/// Verify a parsed kernel for a configuration (`nsim check`); raises NsimError.
void check_parsed(const frontend::Kernel& k, const std::string& config, const std::vector<std::string>& overrides) {
  guarded([&] {
    const sim::Config cfg = load_cfg(config, overrides);
    if (!k.core_programs.empty()) {
      SimOptions o;
      o.numerics = false;
      frontend::MultiCoreRun mc(k, cfg, o);  // checks the LNC degree and verifies every program
      return 0;
    }
    frontend::verify_kernel(k, engines::CoreParams::from_config(cfg));
    return 0;
  });
}

void check_kernel(const std::string& kernel_json, const std::string& config, const std::vector<std::string>& overrides,
                  const std::string& filename) {
  check_parsed(guarded([&] { return frontend::parse_kernel_json(kernel_json, filename); }), config, overrides);
}

void PyKernel::check(const std::string& config, const std::vector<std::string>& overrides) const {
  check_parsed(k_, config, overrides);
}

std::vector<std::string> disasm(const std::string& kernel_json, const std::string& config,
                                const std::vector<std::string>& overrides, int64_t limit, const std::string& filename) {
  return guarded([&] {
    const frontend::Kernel k = frontend::parse_kernel_json(kernel_json, filename);
    return frontend::disassemble_kernel(k, load_cfg(config, overrides), limit).instructions;
  });
}

// (report text, report JSON) of `nsim analyze`.
std::pair<std::string, std::string> analyze_kernel(const std::string& kernel_json, const std::string& config,
                                                   const std::vector<std::string>& overrides, const std::string& filename,
                                                   size_t max_lines) {
  return guarded([&] {
    const frontend::Kernel k = frontend::parse_kernel_json(kernel_json, filename);
    const sim::Config cfg = load_cfg(config, overrides);
    engines::AnalysisReport r;
    {
      py::gil_scoped_release nogil;
      r = frontend::analyze_kernel(k, cfg);
    }
    return std::make_pair(r.to_text(max_lines), r.to_json());
  });
}

// (text, JSON) comparison of two stats JSONs, as `nsim diff` prints and writes it.
std::pair<std::string, std::string> diff_stats(const std::string& json_a, const std::string& json_b,
                                               const std::string& label_a, const std::string& label_b, int max_lines) {
  return guarded([&] {
    const frontend::ProfileDiff d = frontend::diff_profiles(json_a, json_b, label_a, label_b);
    return std::make_pair(frontend::to_text(d, max_lines), frontend::to_json(d));
  });
}

// The readable stats table of `nsim run --stats-table` (sim::StatsRegistry::to_table) from a stats JSON:
// the nested stats (Profile.stats) or a whole `nsim run --stats` document. Leaves are {"value", "unit",
// "description"}; a null value (non-finite) shows as "-".
void add_stat_leaves(sim::StatsRegistry& r, const frontend::json::Value& n, const std::string& name) {
  const frontend::json::Value* v = n.find("value");
  if (v && (v->is_number() || v->is_null())) {
    const frontend::json::Value *u = n.find("unit"), *d = n.find("description");
    r.add(name, v->is_number() ? v->as_double() : std::numeric_limits<double>::quiet_NaN(), u ? u->as_string() : "",
          d ? d->as_string() : "");
    return;
  }
  for (size_t i = 0; i < n.size(); ++i)
    if (n[i].is_object()) add_stat_leaves(r, n[i], name.empty() ? n.key(i) : name + "." + n.key(i));
}
std::string stats_table(const std::string& stats_json) {
  return guarded([&] {
    const frontend::json::Value root = frontend::json::parse(stats_json, "stats");
    const frontend::json::Value* st = root.find("stats");
    sim::StatsRegistry r;
    add_stat_leaves(r, st && st->is_object() ? *st : root, "");
    return r.to_table();
  });
}

// Simulate timing-only and write the instruction and/or DMA tables as CSV (`nsim run --instructions
// --dma`; an empty path skips that table). Returns (instruction rows, DMA rows).
std::pair<uint64_t, uint64_t> write_tables(const std::string& kernel_json, const std::string& config,
                                           const std::vector<std::string>& overrides,
                                           const std::string& instructions_path, const std::string& dma_path,
                                           const std::string& filename) {
  return guarded([&] {
    const frontend::Kernel k = frontend::parse_kernel_json(kernel_json, filename);
    const sim::Config cfg = load_cfg(config, overrides);
    py::gil_scoped_release nogil;
    SimOptions opts;
    opts.numerics = false;  // the timing does not depend on the data
    Simulator sim(cfg, opts);
    frontend::AllocationPlan plan;
    frontend::verify_kernel(k, sim.params(), &plan);
    frontend::Lowering::allocate_hbm(k, sim);
    frontend::TableWriter tables(sim, instructions_path, dma_path);
    frontend::Lowering low(k, sim, &plan);
    low.run();
    sim.finish();
    tables.close();
    return std::make_pair(tables.instruction_rows(), tables.dma_rows());
  });
}

std::string effective_config(const std::string& config, const std::vector<std::string>& overrides) {
  return guarded([&] { return load_cfg(config, overrides).to_yaml(); });
}

const char* cost_class_name(isa::CostClass c) {
  using C = isa::CostClass;
  switch (c) {
    case C::kDma: return "dma";
    case C::kDmaTranspose: return "dma_transpose";
    case C::kStream: return "stream";
    case C::kElementwise: return "elementwise";
    case C::kStreamReduce: return "stream_reduce";
    case C::kTensorTensor: return "tensor_tensor";
    case C::kMemset: return "memset";
    case C::kLoadStationary: return "load_stationary";
    case C::kMultiplyMoving: return "multiply_moving";
    case C::kActivation: return "activation";
    case C::kActivationReduce: return "activation_reduce";
    case C::kTranspose: return "transpose";
    case C::kTensorReduce: return "tensor_reduce";
    case C::kStartOverhead: return "start_overhead";
    case C::kScalarTensorTensor: return "scalar_tensor_tensor";
    case C::kReciprocal: return "reciprocal";
    case C::kScan: return "scan";
    case C::kBnAggr: return "bn_aggr";
    case C::kBarrier: return "barrier";
    case C::kRegisterLoad: return "register_load";
    case C::kQuantizeMx: return "quantize_mx";
    case C::kExponential: return "exponential";
    case C::kRand2: return "rand2";
    case C::kTopk: return "topk";
  }
  return "unknown";
}

py::dict op_dict(const isa::OpInfo& info, bool macro) {
    py::dict d;
    d["name"] = info.mnemonic;
    py::list engines;
    for (int e = 0; e < isa::kNumEngines; ++e)
      if (info.engines & isa::engine_bit(static_cast<isa::Engine>(e)))
        engines.append(std::string(isa::engine_name(static_cast<isa::Engine>(e))));
    d["engines"] = engines;
    d["default_engine"] = std::string(isa::engine_name(info.default_engine));
    d["cost_class"] = cost_class_name(info.cost);
    py::list slots;
    for (int i = 0; i < info.num_slots; ++i) {
      const isa::SlotInfo& s = info.slots[static_cast<size_t>(i)];
      py::dict sd;
      sd["name"] = s.name;
      py::list bufs;
      for (isa::Space sp : {isa::Space::kHbm, isa::Space::kSbuf, isa::Space::kPsum})
        if (s.buffers & isa::space_bit(sp)) bufs.append(std::string(isa::space_name(sp)));
      sd["buffers"] = bufs;
      sd["dtypes"] = std::string(isa::dtype_class_name(s.dtypes));
      sd["required"] = s.required;
      sd["role"] = std::string(isa::slot_role_name(s.role));
      sd["written"] = s.written;
      sd["vector"] = s.vector;
      slots.append(std::move(sd));
    }
    d["slots"] = slots;
    if (macro) d.attr("pop")("cost_class");
    return d;
}

py::list op_table_py() {
  py::list out;
  for (const isa::OpInfo& info : isa::op_table()) out.append(op_dict(info, false));
  return out;
}

py::list macro_table_py() {
  py::list out;
  for (const isa::OpInfo& info : isa::macro_table()) out.append(op_dict(info, true));
  return out;
}

py::list alu_table_py() {
  py::list out;
  for (int i = 0; i < isa::kNumAluOps; ++i) {
    const auto op = static_cast<isa::AluOp>(i);
    py::dict d;
    d["name"] = std::string(isa::alu_name(op));
    d["class"] = std::string(isa::alu_class_name(isa::alu_class(op)));
    d["reduce"] = isa::alu_reduce_legal(op);
    d["arity"] = isa::alu_arity(op);
    out.append(std::move(d));
  }
  return out;
}

py::list dtype_table_py() {
  py::list out;
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto t = static_cast<DType>(i);
    py::dict d;
    d["name"] = std::string(dtype_name(t));
    d["bytes"] = dtype_bytes(t);
    d["is_float"] = dtype_is_float(t);
    d["is_int"] = dtype_is_int(t);
    d["values"] = dtype_values(t);
    out.append(std::move(d));
  }
  return out;
}

py::dict alu_sets_py() {
  py::dict out;
  for (int i = 0; i < isa::kNumAluSets; ++i) {
    const auto s = static_cast<isa::AluSet>(i);
    py::list members;
    for (int a = 0; a < isa::kNumAluOps; ++a)
      if (isa::alu_in_set(static_cast<isa::AluOp>(a), s)) members.append(std::string(isa::alu_name(static_cast<isa::AluOp>(a))));
    out[std::string(isa::alu_set_name(s)).c_str()] = members;
  }
  return out;
}

std::vector<std::string> engine_names_py() {
  std::vector<std::string> v;
  for (int e = 0; e < isa::kNumEngines; ++e) v.emplace_back(isa::engine_name(static_cast<isa::Engine>(e)));
  return v;
}

std::vector<std::string> flag_names_py() {
  std::vector<std::string> v;
  for (int b = 0; b < isa::kNumFlags; ++b) v.emplace_back(isa::flag_name(b));
  return v;
}

const char* param_kind_name(sim::ParamKind k) {
  using K = sim::ParamKind;
  switch (k) {
    case K::kInt: return "int";
    case K::kReal: return "real";
    case K::kBool: return "bool";
    case K::kString: return "string";
    case K::kFrequency: return "frequency";
    case K::kBytes: return "bytes";
    case K::kBandwidth: return "bandwidth";
    case K::kTime: return "time";
    case K::kCycles: return "cycles";
    case K::kStringList: return "string_list";
  }
  return "?";
}

const char* param_unit(sim::ParamKind k) {
  using K = sim::ParamKind;
  switch (k) {
    case K::kFrequency: return "GHz";
    case K::kBytes: return "B";
    case K::kBandwidth: return "B/ns";
    case K::kTime: return "ps";
    case K::kCycles: return "cycles";
    default: return "";
  }
}

py::list param_schema_py() {
  py::list out;
  for (const sim::ParamDecl& p : engines::param_schema()) {
    py::dict d;
    d["key"] = std::string(p.key);
    d["kind"] = param_kind_name(p.kind);
    d["unit"] = param_unit(p.kind);
    d["min"] = p.min;
    d["max"] = p.max;
    d["description"] = std::string(p.description);
    out.append(std::move(d));
  }
  return out;
}

/// Every parameter of a resolved configuration (preset + overrides) in its kind's unit (engines/params.def).
py::dict config_values_py(const std::string& config, const std::vector<std::string>& overrides) {
  const sim::Config c = guarded([&] { return load_cfg(config, overrides); });
  py::dict out;
  using K = sim::ParamKind;
  for (const sim::ParamDecl& p : engines::param_schema()) {
    const std::string key(p.key);
    switch (p.kind) {
      case K::kInt: out[key.c_str()] = c.get_int(p.key); break;
      case K::kReal: out[key.c_str()] = c.get_real(p.key); break;
      case K::kBool: out[key.c_str()] = c.get_bool(p.key); break;
      case K::kString: out[key.c_str()] = c.get_string(p.key); break;
      case K::kFrequency: out[key.c_str()] = c.freq_ghz(p.key); break;
      case K::kBytes: out[key.c_str()] = c.bytes(p.key); break;
      case K::kBandwidth: out[key.c_str()] = c.bw_bytes_per_ns(p.key); break;
      case K::kTime: out[key.c_str()] = c.time_ps(p.key); break;
      case K::kCycles: out[key.c_str()] = c.cycles(p.key); break;
      case K::kStringList: out[key.c_str()] = c.get_list(p.key); break;
    }
  }
  return out;
}

/// The operand-verification limits (isa::Limits) of a configuration, as CoreParams derives them.
py::dict limits_py(const std::string& config, const std::vector<std::string>& overrides) {
  const isa::Limits l = guarded([&] { return engines::CoreParams::from_config(load_cfg(config, overrides)).limits(); });
  py::dict d;
  d["generation"] = l.generation;
  d["partitions"] = l.partitions;
  d["sbuf_bytes_per_partition"] = l.sbuf_bytes_per_partition;
  d["psum_bytes_per_partition"] = l.psum_bytes_per_partition;
  d["psum_bank_bytes"] = l.psum_bank_bytes;
  d["psum_banks"] = l.psum_bank_bytes > 0 ? l.psum_bytes_per_partition / l.psum_bank_bytes : 0;
  d["hbm_bytes"] = l.hbm_bytes;
  d["pe_rows"] = l.pe_rows;
  d["pe_cols"] = l.pe_cols;
  d["moving_fmax"] = l.moving_fmax;
  d["moving_fmax_bf16"] = l.moving_fmax_bf16;
  d["dst_bf16"] = l.dst_bf16;
  d["fp8_double_row"] = l.fp8_double_row;
  return d;
}

std::vector<std::string> alu_ops() {
  return {
#define ALU(e, name, cls, red, arity) name,
#include "isa/alu_ops.def"
#undef ALU
  };
}

std::vector<std::string> act_funcs() {
  return {
#define ACT(e, name, ...) name,
#include "isa/act_funcs.def"
#undef ACT
  };
}

std::vector<std::string> dtypes() {
  return {
#define DTYPE(e, name, bytes, is_float, is_signed, values) name,
#include "isa/dtypes.def"
#undef DTYPE
  };
}

py::list error_codes_py() {
  py::list out;
  for (const ErrorInfo& e : error_table()) {
    py::dict d;
    d["code"] = error_code_str(e.code);
    d["name"] = std::string(e.name);
    d["family"] = std::string(error_family_name(e.family));
    d["meaning"] = std::string(e.meaning);
    d["hint"] = std::string(e.hint);
    out.append(d);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_nsim, m) {
  py::class_<HostBytes>(m, "_HostBytes", py::buffer_protocol(),
                        "The bytes of an output array, handed over from the simulator's HBM (internal).")
      .def_buffer([](HostBytes& h) {
        return py::buffer_info(h.b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(h.b.size())}, {py::ssize_t{1}});
      });
  m.doc() = "nsim simulator core (private; use the `nsim` package)";

  g_nsim_error = PyErr_NewException("_nsim.NsimError", PyExc_Exception, nullptr);
  if (g_nsim_error == nullptr) throw py::error_already_set();
  m.add_object("NsimError", py::reinterpret_borrow<py::object>(g_nsim_error));

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object exc = py::reinterpret_borrow<py::object>(g_nsim_error)(lenient_str(e.what()));
      exc.attr("code") = e.code_str();
      exc.attr("message") = lenient_str(e.message());
      exc.attr("file") = lenient_str(e.loc().file);
      exc.attr("line") = e.loc().line;
      exc.attr("function") = lenient_str(e.loc().function);
      PyErr_SetObject(g_nsim_error, exc.ptr());
    }
  });

  m.def("run_kernel", &run_kernel, py::arg("kernel_json"), py::arg("inputs") = py::dict(), py::arg("config") = "trn2",
        py::arg("overrides") = std::vector<std::string>{}, py::arg("timing_only") = false, py::arg("trace_path") = "",
        py::arg("seed") = 0, py::arg("filename") = "kernel.json", py::arg("trace_limit") = 0,
        py::arg("trace_window") = std::pair<double, double>{0.0, 0.0}, py::arg("check") = false,
        py::arg("max_instructions") = 0, py::arg("max_sim_time_ns") = 0.0, py::arg("progress") = py::none(),
        py::arg("fast_forward") = false,
        "Parse, verify and simulate a kernel.json text. Returns (outputs, stats, lines, config_yaml,\n"
        "check_reports, fast_forward_loops); stats: the nested dict of the stats JSON; check: run the sanitizer\n"
        "(numerics only), whose reports are dicts; fast_forward_loops: dicts {src, file, line, function, instances,\n"
        "outcome, why} per loop source line fast-forward met.\n"
        "progress: None, or called as progress(instructions, simulated_ns) once the run takes over 2 s, about\n"
        "once a second, and once more at the end (a single-core run; NSIM_PROGRESS_INTERVAL=<s> sets both).\n"
        "trace_limit: keep the N earliest trace slices (0 = all); trace_window: (start_ns, end_ns), keep slices\n"
        "overlapping [start, end) (end 0 = no end). max_instructions / max_sim_time_ns: E416 when exceeded (0 = none).\n"
        "fast_forward: timing-only runs skip the middle iterations of loops whose iterations repeat, counted as\n"
        "repeats (SimOptions::fast_forward, docs/timing-model.md; nsim.simulate_json turns it on wherever it\n"
        "applies unless asked not to).");
  py::class_<frontend::ProgressClock>(m, "ProgressClock",
                                     "When to show the progress of a long step (frontend/progress.h): due() is true\n"
                                     "once the step took 2 s, then at most once a second (NSIM_PROGRESS_INTERVAL=<s>\n"
                                     "sets both); the tracer's progress line uses it as the simulator's does.")
      .def(py::init<>())
      .def("due", &frontend::ProgressClock::due, "Whether to report now.")
      .def("elapsed", &frontend::ProgressClock::elapsed, "Seconds since the clock was made.")
      .def("shown", &frontend::ProgressClock::shown, "Whether due() ever returned true.");
  py::class_<PyKernel>(m, "Kernel",
                       "A kernel.json read once into nsim's IR and simulated any number of times (nsim.load_kernel).")
      .def(py::init<const std::string&, const std::string&>(), py::arg("kernel_json"),
           py::arg("filename") = "kernel.json", "Parse a kernel.json text; raises NsimError as run_kernel does.")
      .def_static("from_object", &PyKernel::from_object, py::arg("obj"), py::arg("fallback"),
                  py::arg("filename") = "<dict>",
                  "Read a kernel dict without writing its JSON text; None when the dict needs the text path\n"
                  "(non-string keys, NaN, long integers, invalid strings, deep nesting). `fallback(x)` makes a JSON\n"
                  "value of any other object (as json.dumps' default=).")
      .def("simulate", &PyKernel::simulate, py::arg("inputs") = py::dict(), py::arg("config") = "trn2",
           py::arg("overrides") = std::vector<std::string>{}, py::arg("timing_only") = false,
           py::arg("trace_path") = "", py::arg("seed") = 0, py::arg("trace_limit") = 0,
           py::arg("trace_window") = std::pair<double, double>{0.0, 0.0}, py::arg("check") = false,
           py::arg("max_instructions") = 0, py::arg("max_sim_time_ns") = 0.0, py::arg("progress") = py::none(),
           py::arg("fast_forward") = false,
           "Verify, lower and simulate: the arguments and result of run_kernel (without the text).")
      .def("check", &PyKernel::check, py::arg("config") = "trn2", py::arg("overrides") = std::vector<std::string>{},
           "Verify for a configuration, as check_kernel; raises NsimError.")
      .def("to_json", &PyKernel::to_json, "The kernel as kernel.json text (write_kernel_json: parse(to_json()) == kernel).")
      .def_property_readonly("name", &PyKernel::name)
      .def_property_readonly("filename", &PyKernel::filename);
  py::class_<PyEagerSession>(m, "EagerSession",
                             "Numerics of a kernel executed op by op while it is traced (eager values).")
      .def(py::init<const std::string&, const std::vector<std::string>&>(), py::arg("config") = "trn2",
           py::arg("overrides") = std::vector<std::string>{})
      .def("add_input", &PyEagerSession::add_input, py::arg("name"), py::arg("dtype"), py::arg("shape"),
           py::arg("array") = py::none(), "Declare an HBM tensor with its contents (None: unwritten).")
      .def("has_tensor", &PyEagerSession::has_tensor, py::arg("name"))
      .def("run", &PyEagerSession::run, py::arg("fragment"),
           "Execute the ops of a kernel.json fragment; returns the instructions executed.")
      .def("read", &PyEagerSession::read, py::arg("name"), "Bytes of a whole tensor (row-major).")
      .def_property_readonly("instructions", &PyEagerSession::instructions);
  m.def(
      "check_table",
      [] {
        py::list out;
        for (const engines::CheckInfo& c : engines::kChecks) {
          py::dict d;
          d["code"] = c.code;
          d["check"] = c.name;
          d["fix"] = c.fix;
          out.append(std::move(d));
        }
        return out;
      },
      "The sanitizer's checks: [{code, check, fix}] (engines/check/checker.h).");
  m.def(
      "kernel_bytes",
      [](const py::bytes& data, const std::string& what) {
        std::string text = guarded([&] { return frontend::kernel_text(std::string(data), what); });
        return py::bytes(text);
      },
      py::arg("data"), py::arg("what") = "kernel.json",
      "The bytes of a kernel file, uncompressed when they are gzip data (docs/kernel-json.md, \"Compressed\n"
      "kernel.json\"); a truncated or corrupt gzip stream raises NsimError (BadCompression).");
  m.def("check_kernel", &check_kernel, py::arg("kernel_json"), py::arg("config") = "trn2",
        py::arg("overrides") = std::vector<std::string>{}, py::arg("filename") = "kernel.json",
        "Parse and verify a kernel.json text for a configuration; raises NsimError.");
  m.def("disasm", &disasm, py::arg("kernel_json"), py::arg("config") = "trn2",
        py::arg("overrides") = std::vector<std::string>{}, py::arg("limit") = -1, py::arg("filename") = "kernel.json",
        "Lowered instruction stream, one string per instruction ('...   ; file:line (function)').");
  m.def("analyze_kernel", &analyze_kernel, py::arg("kernel_json"), py::arg("config") = "trn2",
        py::arg("overrides") = std::vector<std::string>{}, py::arg("filename") = "<string>", py::arg("max_lines") = 5,
        "Simulate timing-only with the analyzer: (report text, report JSON).");
  m.def("diff_stats", &diff_stats, py::arg("json_a"), py::arg("json_b"), py::arg("label_a") = "a",
        py::arg("label_b") = "b", py::arg("max_lines") = 20,
        "Compare two stats JSONs (nsim run --stats format): (report text, comparison JSON); max_lines < 0 = all.");
  m.def("write_tables", &write_tables, py::arg("kernel_json"), py::arg("config") = "trn2",
        py::arg("overrides") = std::vector<std::string>{}, py::arg("instructions_path") = "",
        py::arg("dma_path") = "", py::arg("filename") = "kernel.json",
        "Simulate timing-only and write the instruction / DMA-packet CSV tables of `nsim run --instructions\n"
        "--dma` (empty path = not written). Returns (instruction rows, DMA rows).");
  m.def("stats_table", &stats_table, py::arg("stats_json"),
        "Readable stats table (as `nsim run --stats-table`) of a stats JSON (nested stats or a --stats file).");
  m.def("effective_config", &effective_config, py::arg("config") = "trn2",
        py::arg("overrides") = std::vector<std::string>{}, "Effective configuration as YAML.");
  m.def(
      "bound_verdict",
      [](const py::function& stat) {
        const engines::BoundVerdict v =
            engines::bound_verdict([&](const std::string& n) { return stat(n).cast<double>(); });
        py::list bounds;
        for (const auto& b : v.bounds) {
          py::dict d;
          d["name"] = b.name;
          d["ns"] = b.ns;
          d["what"] = b.what;
          bounds.append(d);
        }
        py::dict r;
        r["verdict"] = v.verdict;
        r["top_share_percent"] = v.top_share_percent;
        r["latency_threshold_percent"] = v.latency_threshold_percent;
        r["bounds"] = bounds;
        return r;
      },
      py::arg("stat"),
      "The bound verdict (engines/bounds.h) from stat(name) -> value: {verdict, top_share_percent, "
      "latency_threshold_percent, bounds: [{name, ns, what}], largest first}.");
  m.def("op_table", &op_table_py,
        "The ISA opcode table (isa/opcodes.def OP rows): one dict per opcode {name, engines, default_engine,\n"
        "cost_class, slots: [{name, buffers, dtypes, required, role, written, vector}]}.");
  m.def("macro_table", &macro_table_py,
        "The frontend ops (isa/opcodes.def MACRO rows, e.g. nc_matmul): dicts as op_table without cost_class.");
  m.def("alu_table", &alu_table_py,
        "The ALU operators (isa/alu_ops.def): [{name, class, reduce, arity}]; class arith, bitvec, unary,\n"
        "compare, logical or special.");
  m.def("alu_sets", &alu_sets_py,
        "ALU operators an instruction argument accepts (isa/alu_sets.def): {\"instruction.argument\": [names]}.");
  m.def("dtype_table", &dtype_table_py, "The dtypes (isa/dtypes.def): [{name, bytes, is_float, is_int, values}].");
  m.def("engines", &engine_names_py, "Engine names, in isa::Engine order.");
  m.def("instr_flags", &flag_names_py, "Instruction flag names by bit (isa/flags.def).");
  m.def(
      "imm_defaults",
      [] {
        return py::make_tuple(std::vector<float>(isa::kImmDefault.begin(), isa::kImmDefault.end()),
                              std::vector<int32_t>(isa::kIimmDefault.begin(), isa::kIimmDefault.end()));
      },
      "(imm, iimm): the default immediates of an op (isa::kImmDefault, kIimmDefault).");
  m.def(
      "iimm_expr_ops",
      [] { return std::vector<std::string>(isa::kIimmExprOps.begin(), isa::kIimmExprOps.end()); },
      "The ops whose iimm entries may be loop index expressions (isa::kIimmExprOps).");
  m.def("param_schema", &param_schema_py,
        "The configuration parameters (engines/params.def): [{key, kind, unit, min, max, description}].");
  m.def("config_values", &config_values_py, py::arg("config") = "trn2",
        py::arg("overrides") = std::vector<std::string>{},
        "Every parameter of a resolved configuration (preset + overrides) in its kind's unit: {key: value}.");
  m.def("limits", &limits_py, py::arg("config") = "trn2", py::arg("overrides") = std::vector<std::string>{},
        "The hardware limits of a configuration (isa::Limits, derived from CoreParams) as a dict.");
  m.def("alu_ops", &alu_ops, "ALU op names.");
  m.def("act_funcs", &act_funcs, "Activation function names.");
  m.def("dtypes", &dtypes, "Dtype names (numpy / ml_dtypes spelling).");
  m.def("error_codes", &error_codes_py,
        "The error-code table (sim/errors.def): one dict per code with code (NSIM-Exxx), name, family, meaning\n"
        "and hint.");
  m.def(
      "matmul_dtype_rule",
      [](const std::string& stationary, const std::string& moving, int generation, bool fp8_double_row,
         bool double_row, bool transpose) -> py::object {
        const auto st = dtype_from_name(stationary), mv = dtype_from_name(moving);
        if (!st || !mv) throw py::value_error("unknown dtype '" + (st ? moving : stationary) + "'");
        isa::Limits lim;  // (what the rules read of a core's limits)
        lim.generation = generation;
        lim.fp8_double_row = fp8_double_row;
        const auto r = isa::matmul_dtype_rule(*st, *mv, lim, double_row, transpose);
        if (!r) return py::none();
        return py::make_tuple(std::string(error_info(r->code).name), r->message);
      },
      py::arg("stationary"), py::arg("moving"), py::arg("generation"), py::arg("fp8_double_row"),
      py::arg("double_row") = false, py::arg("transpose") = false,
      "nc_matmul's input dtype rules (isa::matmul_dtype_rule): None, or (error name, message) of the first\n"
      "rule the pair breaks on a core of that generation with (or without) the fp8 double-row mode.");
  m.def("version", [] { return std::string(NSIM_VERSION); }, "nsim version.");
  m.attr("THREADS_ENV") = std::string(isa::sem::kThreadsEnv);
  m.def("host_threads", &isa::sem::host_threads,
        "Host threads a simulation may use (the environment variable THREADS_ENV, else the CPUs this process may "
        "run on), read once per process.");
}

#include "sim/config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>

#include "sim/error.h"
#include "sim/text.h"

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#endif

namespace nsim::sim {
namespace {

namespace fs = std::filesystem;

// ------------------------------------------------------------------------------------------------
// Small text helpers

std::string_view trim(std::string_view s) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Comma-separated list (override syntax): items are trimmed, empty items dropped.
std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> items;
  while (true) {
    const size_t comma = text.find(',');
    const std::string_view item = trim(text.substr(0, comma));
    if (!item.empty()) items.emplace_back(item);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return items;
}

std::string closest_key(std::string_view key, std::span<const ParamDecl> schema) {
  std::string_view best;
  size_t best_dist = static_cast<size_t>(-1);
  for (const ParamDecl& d : schema) {
    const size_t dist = edit_distance(key, d.key);
    if (dist < best_dist) {
      best_dist = dist;
      best = d.key;
    }
  }
  return std::string(best);
}

std::string_view kind_name(ParamKind kind) {
  switch (kind) {
    case ParamKind::kInt: return "integer";
    case ParamKind::kReal: return "real";
    case ParamKind::kBool: return "bool";
    case ParamKind::kString: return "string";
    case ParamKind::kFrequency: return "frequency";
    case ParamKind::kBytes: return "bytes";
    case ParamKind::kBandwidth: return "bandwidth";
    case ParamKind::kTime: return "time";
    case ParamKind::kCycles: return "cycles";
    case ParamKind::kStringList: return "string list";
  }
  return "?";
}

// What a value of each kind looks like, for error messages.
std::string_view expected_text(ParamKind kind) {
  switch (kind) {
    case ParamKind::kInt: return "an integer such as 128";
    case ParamKind::kReal: return "a number such as 0.5";
    case ParamKind::kBool: return "true or false";
    case ParamKind::kString: return "a string";
    case ParamKind::kFrequency: return "a frequency such as 1.4GHz";
    case ParamKind::kBytes: return "a whole number of bytes such as 192KiB or 2048";
    case ParamKind::kBandwidth: return "a bandwidth such as 23B/ns or 410GB/s";
    case ParamKind::kTime: return "a time such as 800ns";
    case ParamKind::kCycles: return "a whole number of cycles such as 64 or 64cycles";
    case ParamKind::kStringList: return "a list of strings";
  }
  return "?";
}

[[noreturn]] void bad_value(std::string_view key, ParamKind kind, std::string_view found, std::string_view why) {
  std::string msg = fmt::format("config key '{}': expected {}, found '{}'", key, expected_text(kind), found);
  if (!why.empty()) msg += fmt::format(" ({})", why);
  throw Error(ErrorCode::kConfigBadValue, std::move(msg));
}

// ------------------------------------------------------------------------------------------------
// Numbers with units

struct Unit {
  std::string_view name;
  double scale;  // value in the normalised unit of one of these
};

// -> GHz
constexpr Unit kFrequencyUnits[] = {{"Hz", 1e-9}, {"kHz", 1e-6}, {"MHz", 1e-3}, {"GHz", 1.0}};
// -> bytes
constexpr Unit kByteUnits[] = {{"B", 1.0},          {"kB", 1e3},           {"KB", 1e3},
                               {"MB", 1e6},         {"GB", 1e9},           {"TB", 1e12},
                               {"KiB", 1024.0},     {"MiB", 1048576.0},    {"GiB", 1073741824.0},
                               {"TiB", 1099511627776.0}};
// -> picoseconds
constexpr Unit kTimeUnits[] = {{"ps", 1.0}, {"ns", 1e3}, {"us", 1e6}, {"ms", 1e9}, {"s", 1e12}};

std::string unit_names(std::span<const Unit> units) {
  std::vector<std::string> names;
  for (const Unit& u : units) names.emplace_back(u.name);
  return join(names, ", ");
}

std::optional<double> find_unit(std::span<const Unit> units, std::string_view name) {
  for (const Unit& u : units)
    if (u.name == name) return u.scale;
  return std::nullopt;
}

struct NumberAndUnit {
  double value;
  std::string_view unit;  // trimmed; empty when the text is a bare number
};

// "1.4 GHz" -> {1.4, "GHz"}; nullopt when the text does not start with a finite number.
std::optional<NumberAndUnit> split_number(std::string_view text) {
  text = trim(text);
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc{} || !std::isfinite(value)) return std::nullopt;
  return NumberAndUnit{value, trim(std::string_view(ptr, static_cast<size_t>(end - ptr)))};
}

constexpr double kMaxInt64AsDouble = 9.2e18;  // a little below 2^63

// Rounds `x` to an integer if it is one up to floating-point noise (1.1KB = 1100.0000000000002).
std::optional<int64_t> as_whole(double x) {
  const double r = std::round(x);
  if (std::fabs(x - r) > 1e-9 * std::max(1.0, std::fabs(x))) return std::nullopt;
  return static_cast<int64_t>(r);
}

std::optional<int64_t> parse_int_text(std::string_view text) {
  text = trim(text);
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc{} || ptr != end || text.empty()) return std::nullopt;
  return v;
}

int64_t parse_int(std::string_view text, std::string_view key) {
  const auto v = parse_int_text(text);
  if (!v) bad_value(key, ParamKind::kInt, text, "");
  return *v;
}

double parse_real(std::string_view text, std::string_view key) {
  const auto nu = split_number(text);
  if (!nu || !nu->unit.empty()) bad_value(key, ParamKind::kReal, text, "");
  return nu->value;
}

bool parse_bool(std::string_view text, std::string_view key) {
  // true/false plus the YAML 1.1 spellings yaml-cpp reads as booleans (but not y/n).
  static constexpr std::string_view kTrue[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static constexpr std::string_view kFalse[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  const std::string_view t = trim(text);
  if (std::find(std::begin(kTrue), std::end(kTrue), t) != std::end(kTrue)) return true;
  if (std::find(std::begin(kFalse), std::end(kFalse), t) != std::end(kFalse)) return false;
  bad_value(key, ParamKind::kBool, text, "");
}

int64_t parse_cycles(std::string_view text, std::string_view key) {
  std::string_view t = trim(text);
  for (std::string_view suffix : {"cycles", "cycle"}) {
    if (ends_with(t, suffix)) {
      t = trim(t.substr(0, t.size() - suffix.size()));
      break;
    }
  }
  const auto v = parse_int_text(t);
  if (!v) bad_value(key, ParamKind::kCycles, text, "");
  if (*v < 0) bad_value(key, ParamKind::kCycles, text, "must not be negative");
  return *v;
}

// Checks that `text` is a valid value of `kind` (throws E102 otherwise).
void check_scalar(ParamKind kind, std::string_view text, std::string_view key) {
  switch (kind) {
    case ParamKind::kInt: parse_int(text, key); return;
    case ParamKind::kReal: parse_real(text, key); return;
    case ParamKind::kBool: parse_bool(text, key); return;
    case ParamKind::kString: return;
    case ParamKind::kFrequency: parse_frequency_ghz(text, key); return;
    case ParamKind::kBytes: parse_bytes(text, key); return;
    case ParamKind::kBandwidth: parse_bandwidth_bytes_per_ns(text, key); return;
    case ParamKind::kTime: parse_time_ps(text, key); return;
    case ParamKind::kCycles: parse_cycles(text, key); return;
    case ParamKind::kStringList: return;
  }
}

// Checks a valid value of `d`'s kind against its declared range (throws E102 naming the range).
void check_range(const ParamDecl& d, std::string_view text) {
  double v = 0;
  const char* unit = "";
  switch (d.kind) {
    case ParamKind::kInt: v = static_cast<double>(parse_int(text, d.key)); break;
    case ParamKind::kReal: v = parse_real(text, d.key); break;
    case ParamKind::kFrequency: v = parse_frequency_ghz(text, d.key); unit = " GHz"; break;
    case ParamKind::kBytes: v = static_cast<double>(parse_bytes(text, d.key)); unit = " bytes"; break;
    case ParamKind::kBandwidth: v = parse_bandwidth_bytes_per_ns(text, d.key); unit = " B/ns"; break;
    case ParamKind::kTime: v = static_cast<double>(parse_time_ps(text, d.key)); unit = " ps"; break;
    case ParamKind::kCycles: v = static_cast<double>(parse_cycles(text, d.key)); unit = " cycles"; break;
    default: return;
  }
  if (!(v >= d.min && v <= d.max))
    throw Error(ErrorCode::kConfigBadValue, fmt::format("config key '{}': '{}' is outside its valid range [{:g}, {:g}]{}",
                                                        d.key, text, d.min, d.max, unit));
}

// ------------------------------------------------------------------------------------------------
// Loading YAML files with `preset:` inheritance

/// One value as read from a file or an override, before validation against the schema.
struct RawValue {
  enum class Type { kScalar, kList, kNull };
  Type type = Type::kScalar;
  std::string text;                // kScalar
  std::vector<std::string> items;  // kList
  std::string origin;              // "file:line" or "override 'k=v'", for messages
};
using RawMap = std::map<std::string, RawValue, std::less<>>;

constexpr std::string_view kPresetKey = "preset";
constexpr std::string_view kTextName = "<yaml text>";

class Loader {
 public:
  explicit Loader(std::string configs_dir) : configs_dir_(std::move(configs_dir)) {}

  /// `preset_or_path` as given to Config::load: a preset name or a path (relative to the cwd).
  RawMap load_root(std::string_view preset_or_path) {
    const fs::path path = resolve(std::string(trim(preset_or_path)), fs::current_path(), "");
    return load_file(path);
  }

  /// The files read so far and their texts, in the order read (Config::load's cache checks them).
  const std::vector<std::pair<fs::path, std::string>>& files() const { return files_; }

  /// The whole file, or nullopt when it cannot be read.
  static std::optional<std::string> read_whole(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream text;
    text << in.rdbuf();
    return std::move(text).str();
  }

  /// YAML text given to Config::from_yaml; its preset is resolved in configs_dir.
  RawMap load_text(std::string_view text) {
    return load_document(std::string(text), std::string(kTextName), fs::path(configs_dir_));
  }

  /// "trn2" -> <configs_dir>/trn2.yaml; a path (contains '/' or ends in .yaml/.yml) -> relative to
  /// `base_dir`. Throws E104 when the file does not exist.
  fs::path resolve(const std::string& value, const fs::path& base_dir, const std::string& origin) const {
    const bool is_path = value.find('/') != std::string::npos || ends_with(value, ".yaml") || ends_with(value, ".yml");
    fs::path path;
    if (is_path) {
      path = fs::path(value);
      if (path.is_relative()) path = base_dir / path;
    } else {
      path = fs::path(configs_dir_) / (value + ".yaml");
    }
    std::error_code ec;
    if (!value.empty() && fs::is_regular_file(path, ec)) return path;

    std::string msg = fmt::format("preset '{}'{} not found: no file {}", value,
                                  origin.empty() ? "" : fmt::format(" (at {})", origin), path.string());
    if (!is_path) {
      const std::string avail = available_presets();
      msg += avail.empty() ? fmt::format(" (no presets in {})", configs_dir_)
                           : fmt::format(" (presets in {}: {})", configs_dir_, avail);
    }
    throw Error(ErrorCode::kConfigPresetNotFound, std::move(msg));
  }

 private:
  std::string available_presets() const {
    std::vector<std::string> names;
    std::error_code ec;
    for (fs::directory_iterator it(configs_dir_, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().extension() == ".yaml") names.push_back(it->path().stem().string());
    }
    std::sort(names.begin(), names.end());
    return join(names, ", ");
  }

  RawMap load_file(const fs::path& path) {
    std::error_code ec;
    fs::path canonical = fs::weakly_canonical(path, ec);
    if (ec) canonical = fs::absolute(path);
    for (size_t i = 0; i < stack_.size(); ++i) {
      if (stack_[i] != canonical) continue;
      std::vector<std::string> chain;
      for (size_t j = i; j < stack_.size(); ++j) chain.push_back(stack_[j].string());
      chain.push_back(canonical.string());
      throw Error(ErrorCode::kConfigPresetCycle, fmt::format("preset cycle: {}", join(chain, " -> ")));
    }
    std::optional<std::string> text = read_whole(path);
    if (!text) throw Error(ErrorCode::kConfigPresetNotFound, fmt::format("cannot read config file {}", path.string()));
    files_.emplace_back(path, *text);

    stack_.push_back(canonical);
    RawMap values = load_document(*text, path.string(), path.parent_path());
    stack_.pop_back();
    return values;
  }

  /// One document parsed: its `preset:` (if any) and its own keys, flattened.
  struct ParsedDoc {
    bool has_preset = false;
    std::string preset, preset_origin;
    RawMap own;
  };

  RawMap load_document(const std::string& text, const std::string& file, const fs::path& base_dir) {
    // yaml-cpp takes ~1,000 CPU instructions per byte (3 ms for the trn2 preset and the trn1 file it
    // inherits), more than simulating a small kernel: documents parsed before in this process (a Python
    // session running many kernels, a sweep) are taken from a cache keyed by their file name and full
    // text, so an edited file is parsed again. Only documents that parsed without error are cached.
    const std::string cache_key = file + '\0' + text;
    std::shared_ptr<const ParsedDoc> doc;
    {
      std::lock_guard<std::mutex> lock(doc_cache_mutex());
      auto& cache = doc_cache();
      if (auto it = cache.find(cache_key); it != cache.end()) doc = it->second;
    }
    if (!doc) {
      doc = std::make_shared<const ParsedDoc>(parse_document(text, file));
      std::lock_guard<std::mutex> lock(doc_cache_mutex());
      auto& cache = doc_cache();
      if (cache.size() >= kDocCacheMax) cache.clear();  // a bound for processes that generate many configs
      cache.emplace(cache_key, doc);
    }
    // The preset's keys first; this document's keys override them.
    RawMap values;
    if (doc->has_preset) values = load_file(resolve(doc->preset, base_dir, doc->preset_origin));
    for (const auto& [key, value] : doc->own) values[key] = value;
    return values;
  }

  static constexpr size_t kDocCacheMax = 256;
  static std::mutex& doc_cache_mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<std::string, std::shared_ptr<const ParsedDoc>, std::less<>>& doc_cache() {
    static std::map<std::string, std::shared_ptr<const ParsedDoc>, std::less<>> cache;
    return cache;
  }

  static ParsedDoc parse_document(const std::string& text, const std::string& file) {
    ParsedDoc doc;
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      throw Error(ErrorCode::kConfigParse, fmt::format("YAML syntax error in {} at line {}, column {}: {}", file,
                                                       e.mark.line + 1, e.mark.column + 1, e.msg));
    }
    if (root.IsNull()) return doc;  // empty file
    if (!root.IsMap()) {
      throw Error(ErrorCode::kConfigParse,
                  fmt::format("{} at line {}: expected a mapping of config keys at the top level", file,
                              root.Mark().line + 1));
    }
    const YAML::Node& const_root = root;  // const operator[] never inserts
    const YAML::Node preset = const_root[std::string(kPresetKey)];
    if (preset) {
      doc.preset_origin = fmt::format("{}:{}", file, preset.Mark().line + 1);
      if (!preset.IsScalar() || trim(preset.Scalar()).empty()) {
        throw Error(ErrorCode::kConfigBadValue,
                    fmt::format("'preset' at {}: expected a preset name such as trn1 or a path to a .yaml file",
                                doc.preset_origin));
      }
      doc.has_preset = true;
      doc.preset = std::string(trim(preset.Scalar()));
    }
    flatten(root, "", file, doc.own);
    return doc;
  }

  // Nested maps -> dotted keys. Keys may themselves contain dots ("tensor.pe_rows: 128").
  static void flatten(const YAML::Node& map, const std::string& prefix, const std::string& file, RawMap& out) {
    for (const auto& entry : map) {
      const YAML::Node& k = entry.first;
      const YAML::Node& v = entry.second;
      const int line = k.Mark().line + 1;
      if (!k.IsScalar()) {
        throw Error(ErrorCode::kConfigParse, fmt::format("{} at line {}: config keys must be plain words", file, line));
      }
      if (prefix.empty() && k.Scalar() == kPresetKey) continue;  // handled by load_document
      const std::string key = prefix.empty() ? k.Scalar() : prefix + "." + k.Scalar();
      const std::string origin = fmt::format("{}:{}", file, line);
      if (v.IsMap()) {
        flatten(v, key, file, out);
        continue;
      }
      RawValue value;
      value.origin = origin;
      if (v.IsScalar()) {
        value.text = v.Scalar();
      } else if (v.IsSequence()) {
        value.type = RawValue::Type::kList;
        for (const YAML::Node& item : v) {
          if (!item.IsScalar()) {
            throw Error(ErrorCode::kConfigBadValue,
                        fmt::format("config key '{}' (at {}): list items must be plain strings", key, origin));
          }
          value.items.push_back(item.Scalar());
        }
      } else {
        value.type = RawValue::Type::kNull;
      }
      if (out.count(key)) {
        throw Error(ErrorCode::kConfigParse,
                    fmt::format("{} at line {}: key '{}' is given twice (first at {})", file, line, key, out[key].origin));
      }
      out.emplace(key, std::move(value));
    }
  }

  std::string configs_dir_;
  std::vector<fs::path> stack_;  // files being loaded, outermost first (cycle detection)
  std::vector<std::pair<fs::path, std::string>> files_;  // every file read, with its text
};

// ------------------------------------------------------------------------------------------------
// Validation against the schema

struct Validated {
  std::map<std::string, std::string, std::less<>> raw;
  std::map<std::string, std::vector<std::string>, std::less<>> lists;
  std::map<std::string, ParamKind, std::less<>> kinds;
};

Validated validate(RawMap values, std::span<const ParamDecl> schema, const std::vector<std::string>& overrides) {
  Validated out;
  for (const ParamDecl& d : schema) out.kinds.emplace(std::string(d.key), d.kind);

  // 1. Keys from files must be declared.
  std::vector<std::string> unknown;
  for (const auto& [key, value] : values) {
    if (!out.kinds.count(key)) {
      unknown.push_back(fmt::format("unknown config key '{}' (at {}); did you mean '{}'?", key, value.origin,
                                    closest_key(key, schema)));
    }
  }
  if (!unknown.empty()) throw Error(ErrorCode::kConfigUnknownKey, join(unknown, "; "));

  // 2. Overrides, in order (a later one wins).
  for (const std::string& ov : overrides) {
    const size_t eq = ov.find('=');
    if (eq == std::string::npos) {
      throw Error(ErrorCode::kConfigBadOverride, fmt::format("bad override '{}': expected key=value", ov));
    }
    const std::string key(trim(std::string_view(ov).substr(0, eq)));
    const std::string_view text = trim(std::string_view(ov).substr(eq + 1));
    if (key.empty()) {
      throw Error(ErrorCode::kConfigBadOverride, fmt::format("bad override '{}': empty key before '='", ov));
    }
    const auto kind = out.kinds.find(key);
    if (kind == out.kinds.end()) {
      throw Error(ErrorCode::kConfigUnknownKey, fmt::format("unknown config key '{}' in override '{}'; did you mean '{}'?",
                                                            key, ov, closest_key(key, schema)));
    }
    RawValue value;
    value.origin = fmt::format("override '{}'", ov);
    if (kind->second == ParamKind::kStringList) {
      value.type = RawValue::Type::kList;
      value.items = split_list(text);
    } else {
      value.text = std::string(text);
    }
    values[key] = std::move(value);
  }

  // 3. Every declared key must be present.
  std::vector<std::string> missing;
  for (const ParamDecl& d : schema) {
    if (!values.count(d.key)) missing.emplace_back(d.key);
  }
  if (!missing.empty()) {
    throw Error(ErrorCode::kConfigMissingKey,
                fmt::format("missing config key{} ({}): {}; set them in the YAML (or its preset) or with -p key=value",
                            missing.size() == 1 ? "" : "s", missing.size(), join(missing, ", ")));
  }

  // 4. Every value must parse with its kind.
  for (auto& [key, value] : values) {
    const ParamKind kind = out.kinds.at(key);
    if (value.type == RawValue::Type::kNull) {
      throw Error(ErrorCode::kConfigBadValue,
                  fmt::format("config key '{}' (at {}) has no value; expected {}", key, value.origin, expected_text(kind)));
    }
    if (kind == ParamKind::kStringList) {
      if (value.type == RawValue::Type::kScalar) value.items = split_list(value.text);  // "a, b" in YAML
      out.raw[key] = join(value.items, ",");
      out.lists[key] = std::move(value.items);
      continue;
    }
    if (value.type == RawValue::Type::kList) {
      throw Error(ErrorCode::kConfigBadValue, fmt::format("config key '{}' (at {}): expected {}, found a list", key,
                                                          value.origin, expected_text(kind)));
    }
    try {
      check_scalar(kind, value.text, key);
      for (const ParamDecl& d : schema)
        if (d.key == key) check_range(d, value.text);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("{} (at {})", e.message(), value.origin));
    }
    out.raw[key] = std::move(value.text);
  }
  return out;
}

// ------------------------------------------------------------------------------------------------
// Getters

using KindMap = std::map<std::string, ParamKind, std::less<>>;
using TextMap = std::map<std::string, std::string, std::less<>>;

// The raw text of `key`, after checking that the key exists and has one of `accepted` kinds.
const std::string& lookup(const TextMap& raw, const KindMap& kinds, std::string_view key,
                          std::initializer_list<ParamKind> accepted, std::string_view getter) {
  const auto it = raw.find(key);
  if (it == raw.end()) {
    throw Error(ErrorCode::kConfigMissingKey,
                fmt::format("config key '{}' is not in the configuration (is it declared in the schema?)", key));
  }
  const ParamKind kind = kinds.find(key)->second;
  if (accepted.size() && std::find(accepted.begin(), accepted.end(), kind) == accepted.end()) {
    throw Error(ErrorCode::kConfigBadValue,
                fmt::format("config key '{}' is declared as {}, which {}() cannot read", key, kind_name(kind), getter));
  }
  return it->second;
}

// ------------------------------------------------------------------------------------------------
// to_yaml

struct YamlTree {
  const std::string* value = nullptr;                // scalar leaf
  const std::vector<std::string>* list = nullptr;    // list leaf
  std::map<std::string, YamlTree> children;          // sorted
};

void emit_scalar(YAML::Emitter& out, const std::string& text) {
  // Strings a YAML reader would take as null must stay strings.
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") {
    out << YAML::DoubleQuoted << text;
  } else {
    out << text;
  }
}

void emit_tree(YAML::Emitter& out, const YamlTree& node, const std::string& prefix) {
  for (const auto& [name, child] : node.children) {
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    if (child.value || child.list) {
      out << YAML::Key << key << YAML::Value;
      if (child.list) {
        out << YAML::BeginSeq;
        for (const std::string& item : *child.list) emit_scalar(out, item);
        out << YAML::EndSeq;
      } else {
        emit_scalar(out, *child.value);
      }
      // A key that is both a value and a prefix of other keys: write the others dotted, at this level.
      if (!child.children.empty()) emit_tree(out, child, key);
    } else {
      out << YAML::Key << key << YAML::Value << YAML::BeginMap;
      emit_tree(out, child, "");
      out << YAML::EndMap;
    }
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Unit parsing (public)

double parse_frequency_ghz(std::string_view text, std::string_view key) {
  constexpr ParamKind kind = ParamKind::kFrequency;
  const auto nu = split_number(text);
  const std::string units = unit_names(kFrequencyUnits);
  if (!nu) bad_value(key, kind, text, "not a number");
  if (nu->unit.empty()) bad_value(key, kind, text, fmt::format("missing unit; use one of {}", units));
  const auto scale = find_unit(kFrequencyUnits, nu->unit);
  if (!scale) bad_value(key, kind, text, fmt::format("unknown unit '{}'; use one of {}", nu->unit, units));
  const double ghz = nu->value * *scale;
  if (!(ghz > 0)) bad_value(key, kind, text, "must be positive");
  return ghz;
}

int64_t parse_bytes(std::string_view text, std::string_view key) {
  constexpr ParamKind kind = ParamKind::kBytes;
  const auto nu = split_number(text);
  if (!nu) bad_value(key, kind, text, "not a number");
  double scale = 1.0;
  if (!nu->unit.empty()) {
    const auto s = find_unit(kByteUnits, nu->unit);
    if (!s) bad_value(key, kind, text, fmt::format("unknown unit '{}'; use one of {}", nu->unit, unit_names(kByteUnits)));
    scale = *s;
  }
  const double bytes = nu->value * scale;
  if (bytes < 0) bad_value(key, kind, text, "must not be negative");
  if (bytes > kMaxInt64AsDouble) bad_value(key, kind, text, "too large");
  const auto whole = as_whole(bytes);
  if (!whole) bad_value(key, kind, text, fmt::format("{} is not a whole number of bytes", bytes));
  return *whole;
}

double parse_bandwidth_bytes_per_ns(std::string_view text, std::string_view key) {
  constexpr ParamKind kind = ParamKind::kBandwidth;
  const auto nu = split_number(text);
  if (!nu) bad_value(key, kind, text, "not a number");
  const std::string_view unit = nu->unit;
  const size_t slash = unit.find('/');
  const std::string units = fmt::format("<bytes unit>/<time unit> with bytes units {} and time units {}",
                                        unit_names(kByteUnits), unit_names(kTimeUnits));
  if (slash == std::string_view::npos) bad_value(key, kind, text, fmt::format("missing unit; use {}", units));
  const auto size = find_unit(kByteUnits, trim(unit.substr(0, slash)));
  const auto time_ps = find_unit(kTimeUnits, trim(unit.substr(slash + 1)));
  if (!size || !time_ps) bad_value(key, kind, text, fmt::format("unknown unit '{}'; use {}", unit, units));
  const double bpns = nu->value * *size / (*time_ps / 1000.0);
  if (!(bpns > 0)) bad_value(key, kind, text, "must be positive");
  return bpns;
}

int64_t parse_time_ps(std::string_view text, std::string_view key) {
  constexpr ParamKind kind = ParamKind::kTime;
  const auto nu = split_number(text);
  const std::string units = unit_names(kTimeUnits);
  if (!nu) bad_value(key, kind, text, "not a number");
  if (nu->unit.empty()) bad_value(key, kind, text, fmt::format("missing unit; use one of {}", units));
  const auto scale = find_unit(kTimeUnits, nu->unit);
  if (!scale) bad_value(key, kind, text, fmt::format("unknown unit '{}'; use one of {}", nu->unit, units));
  const double ps = nu->value * *scale;
  if (ps < 0) bad_value(key, kind, text, "must not be negative");
  if (ps > kMaxInt64AsDouble) bad_value(key, kind, text, "too large");
  return std::llround(ps);
}

// ------------------------------------------------------------------------------------------------
// Config

namespace {

/// Configurations loaded before in this process, by everything a load depends on: the schema, the
/// configs directory, the working directory (relative paths), the preset or path and the overrides.
/// An entry also keeps the files the load read with their texts; it is used only while every one of
/// them still reads back the same (an edited preset is loaded again). Validation costs ~0.8 M CPU
/// instructions, a tenth of simulating a small kernel from a loaded handle (docs/performance.md).
struct LoadedConfig {
  Config config;
  std::vector<std::pair<fs::path, std::string>> files;
};
constexpr size_t kConfigCacheMax = 64;
std::mutex& config_cache_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::shared_ptr<const LoadedConfig>, std::less<>>& config_cache() {
  static std::map<std::string, std::shared_ptr<const LoadedConfig>, std::less<>> cache;
  return cache;
}

}  // namespace

Config Config::load(std::string_view preset_or_path, std::span<const ParamDecl> schema,
                    const std::vector<std::string>& overrides, const std::string& configs_dir) {
  std::error_code ec;
  std::string key = fmt::format("{}\n{}\n{}\n{}\n{}", static_cast<const void*>(schema.data()), schema.size(),
                                configs_dir, fs::current_path(ec).string(), preset_or_path);
  for (const std::string& o : overrides) key.append("\n").append(o);
  std::shared_ptr<const LoadedConfig> hit;
  {
    std::lock_guard<std::mutex> lock(config_cache_mutex());
    if (auto it = config_cache().find(key); it != config_cache().end()) hit = it->second;
  }
  if (hit) {
    bool same = true;
    for (const auto& [path, text] : hit->files) {
      const std::optional<std::string> now = Loader::read_whole(path);
      if (!now || *now != text) {
        same = false;
        break;
      }
    }
    if (same) return hit->config;
  }
  Loader loader(configs_dir);
  Validated v = validate(loader.load_root(preset_or_path), schema, overrides);
  Config c;
  // "trn2" -> "trn2"; "dir/my_run.yaml" -> "my_run".
  c.name_ = fs::path(std::string(trim(preset_or_path))).stem().string();
  c.raw_ = std::move(v.raw);
  c.lists_ = std::move(v.lists);
  c.kinds_ = std::move(v.kinds);
  auto entry = std::make_shared<const LoadedConfig>(LoadedConfig{c, loader.files()});
  std::lock_guard<std::mutex> lock(config_cache_mutex());
  if (config_cache().size() >= kConfigCacheMax) config_cache().clear();  // a bound for generated configs
  config_cache()[key] = std::move(entry);
  return c;
}

Config Config::from_yaml(std::string_view yaml_text, std::span<const ParamDecl> schema,
                         const std::vector<std::string>& overrides, const std::string& configs_dir) {
  Loader loader(configs_dir);
  Validated v = validate(loader.load_text(yaml_text), schema, overrides);
  Config c;
  const auto name = v.raw.find("name");
  c.name_ = name != v.raw.end() ? name->second : "inline";
  c.raw_ = std::move(v.raw);
  c.lists_ = std::move(v.lists);
  c.kinds_ = std::move(v.kinds);
  return c;
}

namespace {

// Where the running code lives: the shared object holding this code (the _nsim Python module,
// found via dladdr), then the executable (/proc/self/exe). For the CLI both are the same file.
std::vector<fs::path> binary_dirs() {
  std::vector<fs::path> dirs;
  const auto add = [&dirs](const fs::path& file) {
    std::error_code ec;
    const fs::path dir = fs::weakly_canonical(file, ec).parent_path();
    if (ec || dir.empty() || std::find(dirs.begin(), dirs.end(), dir) != dirs.end()) return;
    dirs.push_back(dir);
  };
#if defined(__unix__) || defined(__APPLE__)
  static const char anchor = 0;  // any address inside this object
  Dl_info info{};
  // dli_fname is the path the object was loaded from; for the main program glibc reports argv[0],
  // which may be relative or a bare name: only absolute paths are trusted, /proc/self/exe covers the rest.
  if (::dladdr(&anchor, &info) != 0 && info.dli_fname != nullptr &&
      info.dli_fname[0] == '/') {
    add(info.dli_fname);
  }
#endif
  std::error_code ec;
  if (const fs::path exe = fs::read_symlink("/proc/self/exe", ec); !ec && exe.is_absolute()) add(exe);
  return dirs;
}

bool has_presets(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".yaml" && it->is_regular_file(ec)) return true;
  }
  return false;
}

// The first of <dir>/configs, <dir>/../configs, <dir>/../share/nsim/configs (dir: binary_dirs()) that
// holds presets; "" if none does. Cached: the binary does not move while it runs.
const std::string& configs_dir_near_binary() {
  static const std::string dir = [] {
    for (const fs::path& base : binary_dirs()) {
      for (const fs::path& candidate :
           {base / "configs", base.parent_path() / "configs", base.parent_path() / "share" / "nsim" / "configs"}) {
        if (has_presets(candidate)) return candidate.lexically_normal().string();
      }
    }
    return std::string();
  }();
  return dir;
}

}  // namespace

// $NSIM_CONFIGS_DIR, else presets next to the binary (a build dir carries a copy of configs/, see
// CMakeLists.txt; a moved build dir or an installed binary still finds them), else the source tree's
// configs/ compiled in as NSIM_CONFIGS_DIR.
std::string Config::default_configs_dir() {
  if (const char* env = std::getenv("NSIM_CONFIGS_DIR"); env != nullptr && *env != '\0') return env;
  if (const std::string& near = configs_dir_near_binary(); !near.empty()) return near;
#ifdef NSIM_CONFIGS_DIR
  return NSIM_CONFIGS_DIR;
#else
  return "configs";
#endif
}

bool Config::has(std::string_view key) const { return raw_.find(key) != raw_.end(); }

int64_t Config::get_int(std::string_view key) const {
  return parse_int(lookup(raw_, kinds_, key, {ParamKind::kInt}, "get_int"), key);
}

double Config::get_real(std::string_view key) const {
  const std::string& text = lookup(raw_, kinds_, key, {ParamKind::kReal, ParamKind::kInt}, "get_real");
  return parse_real(text, key);
}

bool Config::get_bool(std::string_view key) const {
  return parse_bool(lookup(raw_, kinds_, key, {ParamKind::kBool}, "get_bool"), key);
}

std::string Config::get_string(std::string_view key) const {
  return lookup(raw_, kinds_, key, {}, "get_string");  // any kind: the text as written
}

std::vector<std::string> Config::get_list(std::string_view key) const {
  lookup(raw_, kinds_, key, {ParamKind::kStringList}, "get_list");
  return lists_.find(key)->second;
}

double Config::freq_ghz(std::string_view key) const {
  return parse_frequency_ghz(lookup(raw_, kinds_, key, {ParamKind::kFrequency}, "freq_ghz"), key);
}

int64_t Config::bytes(std::string_view key) const {
  return parse_bytes(lookup(raw_, kinds_, key, {ParamKind::kBytes}, "bytes"), key);
}

double Config::bw_bytes_per_ns(std::string_view key) const {
  return parse_bandwidth_bytes_per_ns(lookup(raw_, kinds_, key, {ParamKind::kBandwidth}, "bw_bytes_per_ns"), key);
}

int64_t Config::time_ps(std::string_view key) const {
  return parse_time_ps(lookup(raw_, kinds_, key, {ParamKind::kTime}, "time_ps"), key);
}

int64_t Config::cycles(std::string_view key) const {
  return parse_cycles(lookup(raw_, kinds_, key, {ParamKind::kCycles}, "cycles"), key);
}

std::string Config::to_yaml() const {
  YamlTree root;
  for (const auto& [key, text] : raw_) {
    YamlTree* node = &root;
    std::string_view rest = key;
    while (true) {
      const size_t dot = rest.find('.');
      node = &node->children[std::string(rest.substr(0, dot))];
      if (dot == std::string_view::npos) break;
      rest.remove_prefix(dot + 1);
    }
    const auto list = lists_.find(key);
    if (list != lists_.end()) {
      node->list = &list->second;
    } else {
      node->value = &text;
    }
  }
  YAML::Emitter out;
  out << YAML::BeginMap;
  emit_tree(out, root, "");
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace nsim::sim

#pragma once
/// Configuration: YAML presets with `preset:` inheritance, key=value overrides, unit strings, a
/// declared schema (unknown keys are errors). Generic: the hardware keys are declared by the layer
/// that reads them (engines/params.def) and passed in as a schema.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nsim::sim {

/// How a parameter's value is written and normalised.
enum class ParamKind : uint8_t {
  kInt,        ///< plain integer ("64")
  kReal,       ///< plain number ("0.5")
  kBool,       ///< true/false
  kString,     ///< free text / enum word
  kFrequency,  ///< "1.4GHz", "960MHz" -> GHz
  kBytes,      ///< "192KiB", "2KiB", "16GiB", "2048", "2048B" -> bytes
  kBandwidth,  ///< "23B/ns", "410GB/s", "2.9TB/s" -> bytes per ns (1 GB/s == 1 B/ns)
  kTime,       ///< "800ns", "3us", "1.2ms", "500ps" -> picoseconds
  kCycles,     ///< "64" or "64cycles" -> cycles (integer)
  kStringList, ///< YAML sequence of strings, or a comma-separated string in overrides
};

/// One declared parameter: its dotted key, kind, meaning and valid range.
struct ParamDecl {
  std::string_view key;
  ParamKind kind;
  std::string_view description;
  /// Valid range in the kind's unit (GHz, bytes, B/ns, ps, cycles, or the number itself); a value
  /// outside it is E102. Ignored for strings, lists and booleans.
  double min = -1e300, max = 1e300;
};

/// The effective, validated configuration of one run.
class Config {
 public:
  /// Load `preset_or_path` ("trn2" -> <configs_dir>/trn2.yaml, or a path to a .yaml file), follow
  /// `preset:` inheritance (child keys override parent keys), apply overrides ("tensor.pe_rows=64"),
  /// validate every key against `schema` and require every schema key to be present.
  /// Throws nsim::Error E101..E107. A load equal to an earlier one in this process (same schema, configs
  /// dir, working directory, preset or path and overrides) whose files still read back the same text
  /// returns the configuration validated then.
  static Config load(std::string_view preset_or_path, std::span<const ParamDecl> schema,
                     const std::vector<std::string>& overrides = {},
                     const std::string& configs_dir = default_configs_dir());
  /// Same, from YAML text (its `preset:` is resolved in configs_dir).
  static Config from_yaml(std::string_view yaml_text, std::span<const ParamDecl> schema,
                          const std::vector<std::string>& overrides = {},
                          const std::string& configs_dir = default_configs_dir());
  /// $NSIM_CONFIGS_DIR if set, else configs/ next to (or one level above, or in ../share/nsim/ of) the
  /// running binary or the _nsim module, else the source tree's configs/ (compile definition NSIM_CONFIGS_DIR).
  static std::string default_configs_dir();

  bool has(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  double get_real(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  std::string get_string(std::string_view key) const;
  std::vector<std::string> get_list(std::string_view key) const;
  double freq_ghz(std::string_view key) const;
  int64_t bytes(std::string_view key) const;
  double bw_bytes_per_ns(std::string_view key) const;
  int64_t time_ps(std::string_view key) const;
  double time_ns(std::string_view key) const { return static_cast<double>(time_ps(key)) / 1000.0; }
  int64_t cycles(std::string_view key) const;

  /// The effective config as YAML (nested maps, values as written after overrides), for run outputs.
  std::string to_yaml() const;
  /// Name of the preset chain leaf ("trn2"), or the file stem.
  const std::string& name() const { return name_; }
  /// Raw values by dotted key (after inheritance and overrides).
  const std::map<std::string, std::string, std::less<>>& raw() const { return raw_; }

 private:
  std::string name_;
  std::map<std::string, std::string, std::less<>> raw_;         // dotted key -> value text
  std::map<std::string, std::vector<std::string>, std::less<>> lists_;
  std::map<std::string, ParamKind, std::less<>> kinds_;
};

/// Unit parsing, exposed for tests. Each throws nsim::Error(kConfigBadValue) naming `key`.
double parse_frequency_ghz(std::string_view text, std::string_view key);
int64_t parse_bytes(std::string_view text, std::string_view key);
double parse_bandwidth_bytes_per_ns(std::string_view text, std::string_view key);
int64_t parse_time_ps(std::string_view text, std::string_view key);

}  // namespace nsim::sim

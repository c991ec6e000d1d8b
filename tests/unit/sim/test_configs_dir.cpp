// Config::default_configs_dir(): $NSIM_CONFIGS_DIR, else the presets next to the running binary (the build
// dir carries a copy of configs/), else the source tree's configs/ compiled in (issue 15).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "sim/config.h"

namespace {

using nsim::sim::Config;
namespace fs = std::filesystem;

// Restores $NSIM_CONFIGS_DIR as the test found it.
class EnvGuard {
 public:
  EnvGuard() {
    if (const char* v = std::getenv("NSIM_CONFIGS_DIR")) saved_ = v;
  }
  ~EnvGuard() {
    if (saved_) ::setenv("NSIM_CONFIGS_DIR", saved_->c_str(), 1);
    else ::unsetenv("NSIM_CONFIGS_DIR");
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::optional<std::string> saved_;
};

}  // namespace

TEST_CASE("presets are found next to the binary without NSIM_CONFIGS_DIR", "[config][configs_dir]") {
  EnvGuard guard;
  ::unsetenv("NSIM_CONFIGS_DIR");
  const fs::path exe_dir = fs::canonical("/proc/self/exe").parent_path();
  // This test binary lives in the build dir, which the build gives a copy of configs/.
  const fs::path copy = exe_dir / "configs";
  REQUIRE(fs::is_regular_file(copy / "trn2.yaml"));
  CHECK(fs::path(Config::default_configs_dir()) == copy);
  CHECK(fs::is_regular_file(fs::path(Config::default_configs_dir()) / "README.md"));
}

TEST_CASE("NSIM_CONFIGS_DIR wins over the presets next to the binary", "[config][configs_dir]") {
  EnvGuard guard;
  ::setenv("NSIM_CONFIGS_DIR", "/some/where else", 1);
  CHECK(Config::default_configs_dir() == "/some/where else");
  ::setenv("NSIM_CONFIGS_DIR", "", 1);  // empty: as if unset
  CHECK(Config::default_configs_dir() != "");
  CHECK(fs::is_regular_file(fs::path(Config::default_configs_dir()) / "trn1.yaml"));
}

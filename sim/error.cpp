#include "sim/error.h"

#include <fmt/format.h>

namespace nsim {

std::string SourceLoc::str() const {
  if (file.empty()) return {};
  if (function.empty()) return fmt::format("{}:{}", file, line);
  return fmt::format("{}:{} ({})", file, line, function);
}

std::string error_code_str(ErrorCode code) { return fmt::format("NSIM-E{:03d}", static_cast<int>(code)); }

static std::string format_what(ErrorCode code, const std::string& msg, const SourceLoc& loc) {
  std::string s = fmt::format("{}: {}", error_code_str(code), msg);
  if (!loc.file.empty()) s += fmt::format(" [at {}]", loc.str());
  return s;
}

Error::Error(ErrorCode code, std::string message, SourceLoc loc)
    : std::runtime_error(format_what(code, message, loc)), code_(code), message_(std::move(message)), loc_(std::move(loc)) {}

}  // namespace nsim

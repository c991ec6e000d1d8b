#include "sim/error.h"

#include <fmt/format.h>

namespace nsim {

std::string SourceLoc::str() const {
  if (file.empty()) return {};
  if (function.empty()) return fmt::format("{}:{}", file, line);
  return fmt::format("{}:{} ({})", file, line, function);
}

namespace {

// The prefix of every code string; the number comes from sim/errors.def.
constexpr std::string_view kCodePrefix = "NSIM-";

constexpr ErrorInfo kTable[] = {
#define NSIM_ERROR(number, name, family, meaning, hint) {ErrorCode::k##name, #name, ErrorFamily::family, meaning, hint},
#include "sim/errors.def"
#undef NSIM_ERROR
};

}  // namespace

std::span<const ErrorInfo> error_table() { return kTable; }

const ErrorInfo& error_info(ErrorCode code) {
  for (const ErrorInfo& e : kTable)
    if (e.code == code) return e;
  return error_info(ErrorCode::kInternal);  // unreachable for values of the enum
}

std::string_view error_family_name(ErrorFamily family) {
  switch (family) {
#define NSIM_ERROR_FAMILY(f) \
  case ErrorFamily::f: return #f;
    NSIM_ERROR_FAMILIES(NSIM_ERROR_FAMILY)
#undef NSIM_ERROR_FAMILY
  }
  return "internal";
}

std::string error_code_str(ErrorCode code) { return fmt::format("{}E{:03d}", kCodePrefix, static_cast<int>(code)); }

static std::string format_what(ErrorCode code, const std::string& msg, const SourceLoc& loc) {
  std::string s = fmt::format("{}: {}", error_code_str(code), msg);
  if (!loc.file.empty()) s += fmt::format(" [at {}]", loc.str());
  return s;
}

Error::Error(ErrorCode code, std::string message, SourceLoc loc)
    : std::runtime_error(format_what(code, message, loc)), code_(code), message_(std::move(message)), loc_(std::move(loc)) {}

}  // namespace nsim

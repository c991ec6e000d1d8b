#pragma once
/// Errors: every user-facing failure is an nsim::Error with a stable code (NSIM-Exxx, sim/errors.def).
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace nsim {

/// Where in the user's kernel an instruction or diagnostic comes from.
struct SourceLoc {
  std::string file;
  int line = 0;
  std::string function;
  /// The call stack above this line, outermost first, up to nsim's own machinery:
  /// "kernel (file.py:12) > helper (file.py:30)" (the callers of `function`; "" when the line is in the
  /// kernel function itself). kernel.json interns these strings in a top-level "stacks" table.
  std::string stack;
  std::string str() const;  ///< "file:line (function)" or "" when unknown
  bool operator==(const SourceLoc&) const = default;
};

/// Stable error codes, one per distinct failure, generated from sim/errors.def (the one table of
/// codes, families, meanings and fix hints; docs/errors.md is generated from it too).
enum class ErrorCode : uint16_t {
#define NSIM_ERROR(number, name, family, meaning, hint) k##name = number,
#include "sim/errors.def"
#undef NSIM_ERROR
};

/// Which exception family a code belongs to (the family column of sim/errors.def; the Python
/// exception class). Enumerators carry the table's spelling so that the table names them directly.
#define NSIM_ERROR_FAMILIES(X) X(config) X(access) X(operand) X(kernel) X(not_supported) X(internal)
enum class ErrorFamily : uint8_t {
#define NSIM_ERROR_FAMILY(f) f,
  NSIM_ERROR_FAMILIES(NSIM_ERROR_FAMILY)
#undef NSIM_ERROR_FAMILY
};

/// One row of sim/errors.def.
struct ErrorInfo {
  ErrorCode code;
  std::string_view name;     ///< "SbufOverflow" (C++ ErrorCode::kSbufOverflow; the Python name)
  ErrorFamily family;
  std::string_view meaning;  ///< one line: when the error is raised
  std::string_view hint;     ///< one line: what usually fixes it
};

/// Every row of sim/errors.def, in table order.
std::span<const ErrorInfo> error_table();
/// The row of a code.
const ErrorInfo& error_info(ErrorCode code);
/// "config", "access", "operand", "kernel", "not_supported", "internal".
std::string_view error_family_name(ErrorFamily family);

/// The code string ("NSIM-" + "E" + number) of a code.
std::string error_code_str(ErrorCode code);

/// The one exception type of nsim. what() = the code string, ": ", the message and " [at file:line]".
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message, SourceLoc loc = {});
  ErrorCode code() const { return code_; }
  std::string code_str() const { return error_code_str(code_); }
  const std::string& message() const { return message_; }
  const SourceLoc& loc() const { return loc_; }

 private:
  ErrorCode code_;
  std::string message_;
  SourceLoc loc_;
};

}  // namespace nsim

#pragma once
/// Errors: every user-facing failure is an nsim::Error with a stable code (NSIM-E...).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace nsim {

/// Where in the user's kernel an instruction or diagnostic comes from.
struct SourceLoc {
  std::string file;
  int line = 0;
  std::string function;
  std::string str() const;  ///< "file:line (function)" or "" when unknown
  bool operator==(const SourceLoc&) const = default;
};

/// Stable error codes. Ranges: E1xx config, E2xx memory/access, E3xx ISA operands, E4xx kernel IR,
/// E9xx internal. Codes never change meaning once published (docs/errors.md lists them all).
enum class ErrorCode : uint16_t {
  kConfigUnknownKey = 101,
  kConfigBadValue = 102,
  kConfigMissingKey = 103,
  kConfigPresetNotFound = 104,
  kConfigParse = 105,
  kConfigBadOverride = 106,
  kConfigPresetCycle = 107,

  kOutOfBounds = 201,
  kTooManyPartitions = 202,
  kPsumBankOverflow = 203,
  kSbufOverflow = 204,
  kHbmOverflow = 205,
  kPsumOverflow = 206,
  kBadAccessPattern = 207,
  kUnknownTensor = 208,
  kManualOverlap = 209,  ///< compiler.strict: a manual placement overlaps a tile live at the same time
  kHostMemory = 210,          ///< the host cannot hold what the simulation needs (HBM tensor storage)

  kBadBuffer = 301,
  kBadDtype = 302,
  kPartitionMismatch = 303,
  kElementCountMismatch = 304,
  kMissingOperand = 305,
  kBadEngine = 306,
  kBadImmediate = 307,
  kMatmulLimit = 308,
  kUnknownOpcode = 309,
  kShapeMismatch = 310,

  kJsonSyntax = 401,          ///< kernel.json is not valid JSON
  kSchemaVersion = 402,       ///< missing or unsupported "nsim_kernel" version
  kMissingField = 403,        ///< a required field is absent
  kWrongType = 404,           ///< a field has the wrong JSON type or an invalid value
  kUnknownOp = 405,           ///< an op name that is not in the ISA table (or nc_matmul)
  kUnknownName = 406,         ///< a tensor, loop variable or enum name that does not exist
  kBadIndex = 407,            ///< an index expression that does not parse or is not affine
  kIndexOutOfBounds = 408,    ///< an index range leaves its tensor for some loop iteration
  kOutputNotWritten = 409,    ///< an output tensor that no op writes
  kAffineWriteConflict = 410, ///< affine_range iterations write the same location
  kBadLoop = 411,             ///< step 0, negative or absurd trip counts, nesting too deep
  kDuplicateName = 412,       ///< two tensors or nested loop variables with one name
  kBadInput = 413,            ///< an input file (.npy/.npz) that does not fit the kernel
  kUsage = 414,               ///< bad command-line usage
  kScheduleCycle = 415,       ///< with_schedule edges that contradict the kernel's data dependencies
  kResourceLimit = 416,       ///< --max-instructions, --max-sim-time, a tracing loop-trip cap exceeded
  kInterrupted = 417,         ///< SIGINT/SIGTERM stopped a run (partial results were written)

  kInternal = 901,
};

/// "NSIM-E201" for kOutOfBounds.
std::string error_code_str(ErrorCode code);

/// The one exception type of nsim. what() = "NSIM-Exxx: message [at file:line]".
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

#pragma once
/// Dtypes of nsim and their conversions. Engines compute in fp32; narrower floats are produced by
/// round-to-nearest-even with ml_dtypes' overflow/NaN rules (see docs/dtypes.md).
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string_view>

namespace nsim {

enum class DType : uint8_t {
#define DTYPE(e, name, bytes, is_float, is_signed, values) e,
#include "isa/dtypes.def"
#undef DTYPE
};

inline constexpr int kNumDTypes = 0
#define DTYPE(e, name, bytes, is_float, is_signed, values) +1
#include "isa/dtypes.def"
#undef DTYPE
    ;

namespace detail {
inline constexpr int kDTypeBytes[] = {
#define DTYPE(e, name, bytes, is_float, is_signed, values) bytes,
#include "isa/dtypes.def"
#undef DTYPE
};
}  // namespace detail

/// Size of one element in bytes (0 for an out-of-range value). Inline: used on the hot path.
inline int dtype_bytes(DType t) {
  const auto i = static_cast<size_t>(t);
  return i < std::size(detail::kDTypeBytes) ? detail::kDTypeBytes[i] : 0;
}
/// Canonical name ("bfloat16"), as numpy/ml_dtypes spell it.
std::string_view dtype_name(DType t);
/// Parse a canonical name (also accepts "fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "bool_").
/// Also "fp8_e4m3fn" and "tf32". Case-sensitive; returns nullopt for unknown names.
std::optional<DType> dtype_from_name(std::string_view name);
bool dtype_is_float(DType t);
bool dtype_is_int(DType t);  ///< integer or bool
bool dtype_is_signed(DType t);
/// Values packed in one element (the `values` column of isa/dtypes.def): 4 for the MX x4 types, else 1.
int dtype_values(DType t);
/// An MX x4-packed type (float8_e5m2_x4, float8_e4m3fn_x4, float4_e2m1fn_x4): no cast path to or from it.
inline bool dtype_is_mx_x4(DType t) { return dtype_values(t) == 4; }
/// The fp32 value of one packed value of an x4 element (q = 0..3, value 0 in the low byte / low nibble):
/// float8_e5m2 / float8_e4m3fn bytes, float4_e2m1fn nibbles (nki-api.md 3.2).
float mx_x4_value(DType t, const uint8_t* element, int q);
uint8_t f32_to_f8e8m0fnu_bits(float v); ///< ml_dtypes float8_e8m0fnu: 2^(b-127), no sign/zero, 0xff NaN; ties round up
float f8e8m0fnu_bits_to_f32(uint8_t b);
float f4e2m1fn_bits_to_f32(uint8_t nibble);  ///< ml_dtypes float4_e2m1fn (max 6, no inf/NaN)

// ---- scalar conversions (bit-exact; RNE) ----
uint16_t f32_to_bf16_bits(float v);    ///< RNE; NaN stays NaN (quiet); overflow rounds to inf
float bf16_bits_to_f32(uint16_t b);
uint16_t f32_to_f16_bits(float v);     ///< IEEE binary16, RNE, overflow -> inf, subnormals kept
float f16_bits_to_f32(uint16_t b);
uint8_t f32_to_f8e4m3_bits(float v);   ///< ml_dtypes float8_e4m3 (IEEE-like: bias 7, max 240, has inf/NaN)
float f8e4m3_bits_to_f32(uint8_t b);
uint8_t f32_to_f8e4m3fn_bits(float v); ///< ml_dtypes float8_e4m3fn (bias 7, max 448, no inf, NaN=0x7f/0xff; overflow -> NaN)
float f8e4m3fn_bits_to_f32(uint8_t b);
uint8_t f32_to_f8e5m2_bits(float v);   ///< ml_dtypes float8_e5m2 (bias 15, max 57344, has inf/NaN)
float f8e5m2_bits_to_f32(uint8_t b);
float round_to_tf32(float v);          ///< keep 10 mantissa bits (RNE), stored as fp32

/// Float -> integer rule (nsim policy, spec 2.0): round toward zero, saturate to range, NaN -> 0.
/// bool: v != 0 (so NaN -> 1). A float int_type saturates to the int64 range.
int64_t f32_to_int_saturate(float v, DType int_type);

/// Values this thread has narrowed out of their destination's range since it started: an integer
/// saturated (or NaN stored as 0), an fp8/fp16 overflow to inf/NaN (the sanitizer's cast-out-of-range
/// check reads it around each instruction; counted only on those branches, so it costs nothing else).
uint64_t& cast_overflows();

/// Read one element at p and widen it to fp32 (integers convert exactly up to 2^24).
float load_f32(DType t, const uint8_t* p);
/// Narrow v to t (RNE for floats, saturate for integers, bool = v != 0) and write it at p.
void store_f32(DType t, uint8_t* p, float v);
/// Raw integer value of an integer/bool element (sign-extended for signed types).
int64_t load_int(DType t, const uint8_t* p);
/// Write an integer value with two's-complement wrap to the type's width.
void store_int(DType t, uint8_t* p, int64_t v);

/// Bulk: n elements from src (contiguous, type t) to fp32 dst, and back.
void load_f32_n(DType t, const uint8_t* src, float* dst, int64_t n);
void store_f32_n(DType t, uint8_t* dst, const float* src, int64_t n);

}  // namespace nsim

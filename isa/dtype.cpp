// Dtype tables and conversions. The float narrowing rules reproduce what numpy/ml_dtypes produce for
// `np.float32(x).astype(T)` bit for bit (verified exhaustively over all 2^32 fp32 patterns); see
// docs/dtypes.md for the rules in prose.
#include "isa/dtype.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace nsim {

static_assert(std::endian::native == std::endian::little,
              "nsim stores elements in little-endian byte order and assumes a little-endian host");

namespace {

// ---------------------------------------------------------------------------------------------
// Dtype property tables (generated from dtypes.def)

struct DTypeInfo {
  std::string_view name;
  int bytes;
  bool is_float;
  bool is_signed;
  int values;
};

constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
#define DTYPE(e, name, bytes, is_float, is_signed, values) {name, bytes, is_float != 0, is_signed != 0, values},
#include "isa/dtypes.def"
#undef DTYPE
}};

constexpr const DTypeInfo* info(DType t) {
  const auto i = static_cast<size_t>(t);
  return i < kInfo.size() ? &kInfo[i] : nullptr;
}

// ---------------------------------------------------------------------------------------------
// Raw little-endian element access (memcpy: no alignment or aliasing assumptions)

template <class T>
inline T rd(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <class T>
inline void wr(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

inline uint32_t f2u(float v) { return std::bit_cast<uint32_t>(v); }
inline constexpr float u2f(uint32_t u) { return std::bit_cast<float>(u); }

// ---------------------------------------------------------------------------------------------
// fp32 -> narrow float, round to nearest even.
//
// Format: E exponent bits, M mantissa bits, bias B = 2^(E-1) - 1.
// kHasInf: IEEE-like (exponent all-ones = inf/NaN); values rounding past max finite become inf.
// !kHasInf ("fn"): all-ones exponent is an ordinary binade except the all-ones pattern, which is
// NaN; values rounding past max finite (and +-inf) become NaN.
// NaN inputs map to the sign-preserving quiet NaN `sign | kQNaN` (ml_dtypes behaviour).

thread_local uint64_t g_cast_overflows = 0;

template <int E, int M, bool kHasInf, uint32_t kQNaN>
inline uint32_t narrow_f32(float v) {
  constexpr int B = (1 << (E - 1)) - 1;
  constexpr int kShift = 23 - M;
  constexpr uint32_t kSignBit = 1u << (E + M);
  constexpr uint32_t kInf = ((1u << E) - 1) << M;
  // Largest finite encoding (magnitude).
  constexpr uint32_t kMaxFinite = kHasInf ? kInf - 1 : (1u << (E + M)) - 2;

  const uint32_t u = f2u(v);
  const uint32_t sign = (u >> 31) ? kSignBit : 0u;
  const uint32_t a = u & 0x7fffffffu;

  if (a > 0x7f800000u) return sign | kQNaN;                       // NaN
  if (a == 0x7f800000u) {                                         // +-inf
    if (!kHasInf) ++g_cast_overflows;
    return sign | (kHasInf ? kInf : kQNaN);
  }

  const int e32 = static_cast<int>(a >> 23);  // biased fp32 exponent, 0..254
  uint32_t r;
  if (e32 - 127 + B >= 1) {
    // Result is normal (or overflows): rebias, then round the mantissa; a carry out of the mantissa
    // correctly bumps the exponent.
    const uint32_t rb = a - (static_cast<uint32_t>(127 - B) << 23);
    r = (rb + ((1u << (kShift - 1)) - 1) + ((rb >> kShift) & 1u)) >> kShift;
    if (r > kMaxFinite) {
      ++g_cast_overflows;
      return sign | (kHasInf ? kInf : kQNaN);
    }
  } else {
    // Result is subnormal (or zero, or rounds up to the smallest normal, which the integer
    // arithmetic encodes naturally as 1 << M).
    const uint32_t m = e32 ? ((a & 0x7fffffu) | 0x800000u) : a;  // significand, value m*2^(e-150)
    const int e_eff = e32 ? e32 : 1;
    const int s = 151 - B - M - e_eff;  // >= 24 - M
    if (s > 24) return sign;            // m < 2^24 <= half of one target ulp: rounds to zero
    r = (m + ((1u << (s - 1)) - 1) + ((m >> s) & 1u)) >> s;
  }
  return sign | r;
}

// Narrow float -> fp32 (exact). kQNaNOut: NaN encodings decode to sign | 0x7fc00000 (ml_dtypes);
// otherwise (numpy float16) the NaN payload is kept: sign | 0x7f800000 | mant << (23 - M).
template <int E, int M, bool kHasInf, bool kCanonicalNaN>
constexpr float widen_to_f32(uint32_t b) {
  constexpr int B = (1 << (E - 1)) - 1;
  constexpr uint32_t kExpMax = (1u << E) - 1;
  constexpr uint32_t kMantMask = (1u << M) - 1;
  const uint32_t sign = ((b >> (E + M)) & 1u) << 31;
  const uint32_t exp = (b >> M) & kExpMax;
  const uint32_t mant = b & kMantMask;

  if (exp == kExpMax) {
    if (kHasInf) {
      if (mant == 0) return u2f(sign | 0x7f800000u);
      return u2f(sign | (kCanonicalNaN ? 0x7fc00000u : (0x7f800000u | (mant << (23 - M)))));
    }
    if (mant == kMantMask) return u2f(sign | 0x7fc00000u);
  }
  if (exp == 0) {
    // Subnormal: mant * 2^(1 - B - M); the power of two is a normal fp32 for all formats here.
    constexpr float kScale = u2f(static_cast<uint32_t>(127 + 1 - B - M) << 23);
    const float mag = static_cast<float>(mant) * kScale;
    return sign ? -mag : mag;
  }
  return u2f(sign | ((exp - B + 127) << 23) | (mant << (23 - M)));
}

// ---- per-format helpers --------------------------------------------------------------------

inline uint16_t bf16_from_f32(float v) {
  const uint32_t u = f2u(v);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // RNE; overflow -> inf
  const uint32_t qnan = ((u >> 16) & 0x8000u) | 0x7fc0u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? qnan : rounded);
}

inline float bf16_to_f32(uint16_t b) { return u2f(static_cast<uint32_t>(b) << 16); }

// IEEE binary16. NaN follows numpy (npy_floatbits_to_halfbits): the top 10 payload bits are kept
// (not quieted), and a payload that would vanish becomes 1.
inline uint16_t f16_from_f32(float v) {
  const uint32_t u = f2u(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    uint32_t h = 0x7c00u | ((u & 0x7fffffu) >> 13);
    if (h == 0x7c00u) h = 0x7c01u;
    return static_cast<uint16_t>(((u >> 16) & 0x8000u) | h);
  }
  return static_cast<uint16_t>(narrow_f32<5, 10, true, 0x7e00u>(v));
}

inline float f16_to_f32(uint16_t b) { return widen_to_f32<5, 10, true, false>(b); }

inline uint8_t e4m3_from_f32(float v) { return static_cast<uint8_t>(narrow_f32<4, 3, true, 0x7cu>(v)); }
inline uint8_t e4m3fn_from_f32(float v) { return static_cast<uint8_t>(narrow_f32<4, 3, false, 0x7fu>(v)); }
inline uint8_t e5m2_from_f32(float v) { return static_cast<uint8_t>(narrow_f32<5, 2, true, 0x7eu>(v)); }

template <int E, int M, bool kHasInf>
constexpr std::array<float, 256> make_f8_table() {
  std::array<float, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) t[i] = widen_to_f32<E, M, kHasInf, true>(i);
  return t;
}

constexpr std::array<float, 256> kE4M3Table = make_f8_table<4, 3, true>();
constexpr std::array<float, 256> kE4M3FNTable = make_f8_table<4, 3, false>();
constexpr std::array<float, 256> kE5M2Table = make_f8_table<5, 2, true>();

inline float tf32_round(float v) {
  const uint32_t u = f2u(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return u2f((u & ~0x1fffu) | 0x400000u);  // quiet, keep sign
  return u2f((u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu);
}

// ---- integers --------------------------------------------------------------------------------

// Truncate toward zero, saturate to T's range, NaN -> 0. Both range ends are tested against
// powers of two (-2^k or 0, and 2^k = max + 1), which fp32 represents exactly, so no bound is
// rounded; in between the float -> T cast truncates and is always in range (no UB).
template <class T>
inline T sat_to(float v) {
  using L = std::numeric_limits<T>;
  constexpr float kLo = static_cast<float>(L::min());
  constexpr float kHiExcl = static_cast<float>(uint64_t{1} << L::digits);
  if (v != v) {
    ++g_cast_overflows;
    return 0;
  }
  if (v <= kLo) {
    if (std::trunc(v) < kLo) ++g_cast_overflows;  // truncation toward zero may still land on min
    return L::min();
  }
  if (v >= kHiExcl) {
    ++g_cast_overflows;
    return L::max();
  }
  return static_cast<T>(v);
}

// ---- bulk loop helpers (the dtype switch is outside the loop) ------------------------------

template <class Raw, class F>
inline void load_loop(const uint8_t* src, float* dst, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f(rd<Raw>(src + i * static_cast<int64_t>(sizeof(Raw))));
}

template <class Raw, class F>
inline void store_loop(uint8_t* dst, const float* src, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) wr<Raw>(dst + i * static_cast<int64_t>(sizeof(Raw)), f(src[i]));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Properties

std::string_view dtype_name(DType t) {
  const auto* i = info(t);
  return i ? i->name : std::string_view{};
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (size_t i = 0; i < kInfo.size(); ++i)
    if (kInfo[i].name == name) return static_cast<DType>(i);
  struct Alias {
    std::string_view name;
    DType t;
  };
  static constexpr Alias kAliases[] = {
      {"fp32", DType::kFloat32},          {"bf16", DType::kBFloat16},
      {"fp16", DType::kFloat16},          {"tf32", DType::kTFloat32},
      {"fp8_e4m3", DType::kFloat8E4M3},   {"fp8_e4m3fn", DType::kFloat8E4M3FN},
      {"fp8_e5m2", DType::kFloat8E5M2},   {"bool_", DType::kBool},
  };
  for (const auto& a : kAliases)
    if (a.name == name) return a.t;
  return std::nullopt;
}

bool dtype_is_float(DType t) {
  const auto* i = info(t);
  return i && i->is_float;
}

bool dtype_is_int(DType t) {
  const auto* i = info(t);
  return i && !i->is_float && i->values == 1;
}

int dtype_values(DType t) {
  const auto* i = info(t);
  return i ? i->values : 1;
}

uint8_t f32_to_f8e8m0fnu_bits(float v) {
  // No zero, no sign, no inf: those (and NaN) become the NaN byte 0xff; a mantissa >= 1.5 rounds up.
  if (!(v > 0.0f) || std::isinf(v)) return 0xff;
  int e = 0;
  const float m = std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  const int exp2 = (m >= 0.75f) ? e : e - 1;
  const int b = exp2 + 127;
  if (b < 0) return 0;
  return b > 254 ? 0xff : static_cast<uint8_t>(b);
}

float f8e8m0fnu_bits_to_f32(uint8_t b) {
  return b == 0xff ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, static_cast<int>(b) - 127);
}

float f4e2m1fn_bits_to_f32(uint8_t nibble) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMag[nibble & 7u];
  return (nibble & 8u) ? -m : m;
}

float mx_x4_value(DType t, const uint8_t* element, int q) {
  switch (t) {
    case DType::kFloat8E5M2X4: return kE5M2Table[element[q]];
    case DType::kFloat8E4M3FNX4: return kE4M3FNTable[element[q]];
    case DType::kFloat4E2M1FNX4: {
      const uint8_t byte = element[q / 2];
      return f4e2m1fn_bits_to_f32(static_cast<uint8_t>((q % 2) ? byte >> 4 : byte & 0x0f));
    }
    default: return std::numeric_limits<float>::quiet_NaN();
  }
}

bool dtype_is_signed(DType t) {
  const auto* i = info(t);
  return i && i->is_signed;
}

// ---------------------------------------------------------------------------------------------
// Scalar conversions

uint16_t f32_to_bf16_bits(float v) { return bf16_from_f32(v); }
float bf16_bits_to_f32(uint16_t b) { return bf16_to_f32(b); }
uint16_t f32_to_f16_bits(float v) { return f16_from_f32(v); }
float f16_bits_to_f32(uint16_t b) { return f16_to_f32(b); }
uint8_t f32_to_f8e4m3_bits(float v) { return e4m3_from_f32(v); }
float f8e4m3_bits_to_f32(uint8_t b) { return kE4M3Table[b]; }
uint8_t f32_to_f8e4m3fn_bits(float v) { return e4m3fn_from_f32(v); }
float f8e4m3fn_bits_to_f32(uint8_t b) { return kE4M3FNTable[b]; }
uint8_t f32_to_f8e5m2_bits(float v) { return e5m2_from_f32(v); }
float f8e5m2_bits_to_f32(uint8_t b) { return kE5M2Table[b]; }
float round_to_tf32(float v) { return tf32_round(v); }

uint64_t& cast_overflows() { return g_cast_overflows; }

int64_t f32_to_int_saturate(float v, DType int_type) {
  switch (int_type) {
    case DType::kInt8: return sat_to<int8_t>(v);
    case DType::kInt16: return sat_to<int16_t>(v);
    case DType::kInt32: return sat_to<int32_t>(v);
    case DType::kUInt8: return sat_to<uint8_t>(v);
    case DType::kUInt16: return sat_to<uint16_t>(v);
    case DType::kUInt32: return sat_to<uint32_t>(v);
    case DType::kBool: return v != 0.0f ? 1 : 0;  // NaN != 0, so NaN -> 1
    default: return sat_to<int64_t>(v);          // float types: saturate to int64
  }
}

// ---------------------------------------------------------------------------------------------
// Element access

float load_f32(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kFloat32:
    case DType::kTFloat32: return rd<float>(p);
    case DType::kBFloat16: return bf16_to_f32(rd<uint16_t>(p));
    case DType::kFloat16: return f16_to_f32(rd<uint16_t>(p));
    case DType::kFloat8E4M3: return kE4M3Table[p[0]];
    case DType::kFloat8E4M3FN: return kE4M3FNTable[p[0]];
    case DType::kFloat8E5M2: return kE5M2Table[p[0]];
    case DType::kInt8: return static_cast<float>(rd<int8_t>(p));
    case DType::kInt16: return static_cast<float>(rd<int16_t>(p));
    case DType::kInt32: return static_cast<float>(rd<int32_t>(p));
    case DType::kUInt8: return static_cast<float>(p[0]);
    case DType::kUInt16: return static_cast<float>(rd<uint16_t>(p));
    case DType::kUInt32: return static_cast<float>(rd<uint32_t>(p));
    case DType::kBool: return p[0] != 0 ? 1.0f : 0.0f;
    case DType::kFloat8E8M0FNU: return f8e8m0fnu_bits_to_f32(p[0]);
    case DType::kFloat8E5M2X4:     // x4 types have no cast path: isa::verify rejects them before semantics
    case DType::kFloat8E4M3FNX4:
    case DType::kFloat4E2M1FNX4: return std::numeric_limits<float>::quiet_NaN();
  }
  return 0.0f;
}

void store_f32(DType t, uint8_t* p, float v) {
  switch (t) {
    case DType::kFloat32: wr<float>(p, v); return;
    case DType::kTFloat32: wr<float>(p, tf32_round(v)); return;
    case DType::kBFloat16: wr<uint16_t>(p, bf16_from_f32(v)); return;
    case DType::kFloat16: wr<uint16_t>(p, f16_from_f32(v)); return;
    case DType::kFloat8E4M3: p[0] = e4m3_from_f32(v); return;
    case DType::kFloat8E4M3FN: p[0] = e4m3fn_from_f32(v); return;
    case DType::kFloat8E5M2: p[0] = e5m2_from_f32(v); return;
    case DType::kInt8: wr<int8_t>(p, sat_to<int8_t>(v)); return;
    case DType::kInt16: wr<int16_t>(p, sat_to<int16_t>(v)); return;
    case DType::kInt32: wr<int32_t>(p, sat_to<int32_t>(v)); return;
    case DType::kUInt8: wr<uint8_t>(p, sat_to<uint8_t>(v)); return;
    case DType::kUInt16: wr<uint16_t>(p, sat_to<uint16_t>(v)); return;
    case DType::kUInt32: wr<uint32_t>(p, sat_to<uint32_t>(v)); return;
    case DType::kBool: p[0] = v != 0.0f ? 1 : 0; return;
    case DType::kFloat8E8M0FNU: p[0] = f32_to_f8e8m0fnu_bits(v); return;
    case DType::kFloat8E5M2X4:  // no cast path (isa::verify rejects x4 operands outside the MX ops)
    case DType::kFloat8E4M3FNX4:
    case DType::kFloat4E2M1FNX4: return;
  }
}

int64_t load_int(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kInt8: return rd<int8_t>(p);
    case DType::kInt16: return rd<int16_t>(p);
    case DType::kInt32: return rd<int32_t>(p);
    case DType::kUInt8: return p[0];
    case DType::kUInt16: return rd<uint16_t>(p);
    case DType::kUInt32: return rd<uint32_t>(p);
    case DType::kBool: return p[0] != 0 ? 1 : 0;
    default: break;
  }
  // Float types: the value truncated toward zero, saturated to int64, NaN -> 0.
  return sat_to<int64_t>(load_f32(t, p));
}

void store_int(DType t, uint8_t* p, int64_t v) {
  // Conversions of out-of-range values to unsigned types are modular (well defined); the
  // signed types are then produced from the unsigned bit pattern via memcpy.
  const auto u = static_cast<uint64_t>(v);
  switch (t) {
    case DType::kInt8:
    case DType::kUInt8: p[0] = static_cast<uint8_t>(u); return;
    case DType::kInt16:
    case DType::kUInt16: wr<uint16_t>(p, static_cast<uint16_t>(u)); return;
    case DType::kInt32:
    case DType::kUInt32: wr<uint32_t>(p, static_cast<uint32_t>(u)); return;
    case DType::kBool: p[0] = v != 0 ? 1 : 0; return;
    default: break;
  }
  // Float types: convert the value (int64 -> fp32 rounds to nearest), then narrow as store_f32.
  store_f32(t, p, static_cast<float>(v));
}

// ---------------------------------------------------------------------------------------------
// Bulk

// The bulk conversions are built for AVX2 as well as the baseline (the loops vectorise twice as wide).
#if defined(__x86_64__) && defined(__GNUC__)
#define NSIM_BULK_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define NSIM_BULK_CLONES
#endif

NSIM_BULK_CLONES void load_f32_n(DType t, const uint8_t* src, float* dst, int64_t n) {
  if (n <= 0) return;
  switch (t) {
    case DType::kFloat32:
    case DType::kTFloat32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case DType::kBFloat16:
      load_loop<uint16_t>(src, dst, n, [](uint16_t b) { return bf16_to_f32(b); });
      return;
    case DType::kFloat16:
      load_loop<uint16_t>(src, dst, n, [](uint16_t b) { return f16_to_f32(b); });
      return;
    case DType::kFloat8E4M3:
      load_loop<uint8_t>(src, dst, n, [](uint8_t b) { return kE4M3Table[b]; });
      return;
    case DType::kFloat8E4M3FN:
      load_loop<uint8_t>(src, dst, n, [](uint8_t b) { return kE4M3FNTable[b]; });
      return;
    case DType::kFloat8E5M2:
      load_loop<uint8_t>(src, dst, n, [](uint8_t b) { return kE5M2Table[b]; });
      return;
    case DType::kInt8:
      load_loop<int8_t>(src, dst, n, [](int8_t b) { return static_cast<float>(b); });
      return;
    case DType::kInt16:
      load_loop<int16_t>(src, dst, n, [](int16_t b) { return static_cast<float>(b); });
      return;
    case DType::kInt32:
      load_loop<int32_t>(src, dst, n, [](int32_t b) { return static_cast<float>(b); });
      return;
    case DType::kUInt8:
      load_loop<uint8_t>(src, dst, n, [](uint8_t b) { return static_cast<float>(b); });
      return;
    case DType::kUInt16:
      load_loop<uint16_t>(src, dst, n, [](uint16_t b) { return static_cast<float>(b); });
      return;
    case DType::kUInt32:
      load_loop<uint32_t>(src, dst, n, [](uint32_t b) { return static_cast<float>(b); });
      return;
    case DType::kBool:
      load_loop<uint8_t>(src, dst, n, [](uint8_t b) { return b != 0 ? 1.0f : 0.0f; });
      return;
    case DType::kFloat8E8M0FNU:
      load_loop<uint8_t>(src, dst, n, [](uint8_t b) { return f8e8m0fnu_bits_to_f32(b); });
      return;
    case DType::kFloat8E5M2X4:  // no cast path (isa::verify rejects x4 operands outside the MX ops)
    case DType::kFloat8E4M3FNX4:
    case DType::kFloat4E2M1FNX4:
      for (int64_t i = 0; i < n; ++i) dst[i] = std::numeric_limits<float>::quiet_NaN();
      return;
  }
}

NSIM_BULK_CLONES void store_f32_n(DType t, uint8_t* dst, const float* src, int64_t n) {
  if (n <= 0) return;
  switch (t) {
    case DType::kFloat32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case DType::kTFloat32: store_loop<float>(dst, src, n, [](float v) { return tf32_round(v); }); return;
    case DType::kBFloat16:
      store_loop<uint16_t>(dst, src, n, [](float v) { return bf16_from_f32(v); });
      return;
    case DType::kFloat16:
      store_loop<uint16_t>(dst, src, n, [](float v) { return f16_from_f32(v); });
      return;
    case DType::kFloat8E4M3:
      store_loop<uint8_t>(dst, src, n, [](float v) { return e4m3_from_f32(v); });
      return;
    case DType::kFloat8E4M3FN:
      store_loop<uint8_t>(dst, src, n, [](float v) { return e4m3fn_from_f32(v); });
      return;
    case DType::kFloat8E5M2:
      store_loop<uint8_t>(dst, src, n, [](float v) { return e5m2_from_f32(v); });
      return;
    case DType::kInt8: store_loop<int8_t>(dst, src, n, [](float v) { return sat_to<int8_t>(v); }); return;
    case DType::kInt16: store_loop<int16_t>(dst, src, n, [](float v) { return sat_to<int16_t>(v); }); return;
    case DType::kInt32: store_loop<int32_t>(dst, src, n, [](float v) { return sat_to<int32_t>(v); }); return;
    case DType::kUInt8: store_loop<uint8_t>(dst, src, n, [](float v) { return sat_to<uint8_t>(v); }); return;
    case DType::kUInt16: store_loop<uint16_t>(dst, src, n, [](float v) { return sat_to<uint16_t>(v); }); return;
    case DType::kUInt32: store_loop<uint32_t>(dst, src, n, [](float v) { return sat_to<uint32_t>(v); }); return;
    case DType::kBool:
      store_loop<uint8_t>(dst, src, n, [](float v) -> uint8_t { return v != 0.0f ? 1 : 0; });
      return;
    case DType::kFloat8E8M0FNU:
      store_loop<uint8_t>(dst, src, n, [](float v) { return f32_to_f8e8m0fnu_bits(v); });
      return;
    case DType::kFloat8E5M2X4:  // no cast path (isa::verify rejects x4 operands outside the MX ops)
    case DType::kFloat8E4M3FNX4:
    case DType::kFloat4E2M1FNX4: return;
  }
}

}  // namespace nsim

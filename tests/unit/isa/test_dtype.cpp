// Unit tests for isa/dtype: bit-exact fp32 <-> narrow-float conversions (reference values produced
// by numpy 2.4 + ml_dtypes 0.6: `np.float32(x).astype(T)`), integer policies and bulk paths.
#include <catch2/catch.hpp>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "isa/dtype.h"

using namespace nsim;

namespace {

float f_of(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t u_of(float f) { return std::bit_cast<uint32_t>(f); }

// Same value, or both NaN.
bool same_or_nan(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return u_of(a) == u_of(b);
}

struct RefRow {
  uint32_t f32;
  uint16_t bf16, f16;
  uint8_t e4m3, e4m3fn, e5m2;
};

// Reference rows: input fp32 bit pattern and the numpy/ml_dtypes result for each type.
// Generated once with Python (np.float32 -> bfloat16 / float16 / float8_e4m3 / float8_e4m3fn /
// float8_e5m2) and hard-coded so this test needs no Python.
const RefRow kRef[] = {
    {0x00000000u, 0x0000, 0x0000, 0x00, 0x00, 0x00},  // 0
    {0x80000000u, 0x8000, 0x8000, 0x80, 0x80, 0x80},  // -0
    {0x3F800000u, 0x3F80, 0x3C00, 0x38, 0x38, 0x3C},  // 1
    {0xBF800000u, 0xBF80, 0xBC00, 0xB8, 0xB8, 0xBC},  // -1
    {0x3F000000u, 0x3F00, 0x3800, 0x30, 0x30, 0x38},  // 0.5
    {0x3FC00000u, 0x3FC0, 0x3E00, 0x3C, 0x3C, 0x3E},  // 1.5
    {0x40000000u, 0x4000, 0x4000, 0x40, 0x40, 0x40},  // 2
    {0x40400000u, 0x4040, 0x4200, 0x44, 0x44, 0x42},  // 3
    {0x3DCCCCCDu, 0x3DCD, 0x2E66, 0x1D, 0x1D, 0x2E},  // 0.100000001
    {0xBDCCCCCDu, 0xBDCD, 0xAE66, 0x9D, 0x9D, 0xAE},  // -0.100000001
    {0x3EAAAAABu, 0x3EAB, 0x3555, 0x2B, 0x2B, 0x35},  // 0.333333343
    {0x40490FDBu, 0x4049, 0x4248, 0x45, 0x45, 0x42},  // 3.14159274
    {0xC02DF84Du, 0xC02E, 0xC170, 0xC3, 0xC3, 0xC1},  // -2.71828008
    {0x42C80000u, 0x42C8, 0x5640, 0x6C, 0x6C, 0x56},  // 100
    {0x447A0000u, 0x447A, 0x63D0, 0x78, 0x7F, 0x64},  // 1000
    {0x461C4000u, 0x461C, 0x70E2, 0x78, 0x7F, 0x71},  // 10000
    {0x477FE000u, 0x4780, 0x7BFF, 0x78, 0x7F, 0x7C},  // 65504
    {0x477FEFFDu, 0x4780, 0x7BFF, 0x78, 0x7F, 0x7C},  // 65519.9883
    {0x477FF000u, 0x4780, 0x7C00, 0x78, 0x7F, 0x7C},  // 65520
    {0x43700000u, 0x4370, 0x5B80, 0x77, 0x77, 0x5C},  // 240
    {0x4377FD71u, 0x4378, 0x5BC0, 0x77, 0x77, 0x5C},  // 247.990005
    {0x43780000u, 0x4378, 0x5BC0, 0x78, 0x78, 0x5C},  // 248
    {0x43800000u, 0x4380, 0x5C00, 0x78, 0x78, 0x5C},  // 256
    {0x43E00000u, 0x43E0, 0x5F00, 0x78, 0x7E, 0x5F},  // 448
    {0x43E7FEB8u, 0x43E8, 0x5F40, 0x78, 0x7E, 0x5F},  // 463.98999
    {0x43E80000u, 0x43E8, 0x5F40, 0x78, 0x7E, 0x5F},  // 464
    {0x43F00000u, 0x43F0, 0x5F80, 0x78, 0x7F, 0x60},  // 480
    {0x43FA0000u, 0x43FA, 0x5FD0, 0x78, 0x7F, 0x60},  // 500
    {0x47600000u, 0x4760, 0x7B00, 0x78, 0x7F, 0x7B},  // 57344
    {0x476FFF00u, 0x4770, 0x7B80, 0x78, 0x7F, 0x7B},  // 61439
    {0x47700000u, 0x4770, 0x7B80, 0x78, 0x7F, 0x7C},  // 61440
    {0x49742400u, 0x4974, 0x7C00, 0x78, 0x7F, 0x7C},  // 1000000
    {0x7149F2CAu, 0x714A, 0x7C00, 0x78, 0x7F, 0x7C},  // 1.00000002e+30
    {0xF149F2CAu, 0xF14A, 0xFC00, 0xF8, 0xFF, 0xFC},  // -1.00000002e+30
    {0x7F7FFFFFu, 0x7F80, 0x7C00, 0x78, 0x7F, 0x7C},  // 3.40282347e+38
    {0x3C800000u, 0x3C80, 0x2400, 0x08, 0x08, 0x24},  // 0.015625
    {0x3C000000u, 0x3C00, 0x2000, 0x04, 0x04, 0x20},  // 0.0078125
    {0x3B000000u, 0x3B00, 0x1800, 0x01, 0x01, 0x18},  // 0.001953125
    {0x3A800000u, 0x3A80, 0x1400, 0x00, 0x00, 0x14},  // 0.0009765625
    {0x3A000000u, 0x3A00, 0x1000, 0x00, 0x00, 0x10},  // 0.00048828125
    {0x3AC00000u, 0x3AC0, 0x1600, 0x01, 0x01, 0x16},  // 0.00146484375
    {0x38800000u, 0x3880, 0x0400, 0x00, 0x00, 0x04},  // 6.10351562e-05
    {0x38000000u, 0x3800, 0x0200, 0x00, 0x00, 0x02},  // 3.05175781e-05
    {0x37800000u, 0x3780, 0x0100, 0x00, 0x00, 0x01},  // 1.52587891e-05
    {0x37000000u, 0x3700, 0x0080, 0x00, 0x00, 0x00},  // 7.62939453e-06
    {0x37400000u, 0x3740, 0x00C0, 0x00, 0x00, 0x01},  // 1.14440918e-05
    {0x33800000u, 0x3380, 0x0001, 0x00, 0x00, 0x00},  // 5.96046448e-08
    {0x33000000u, 0x3300, 0x0000, 0x00, 0x00, 0x00},  // 2.98023224e-08
    {0x33400000u, 0x3340, 0x0001, 0x00, 0x00, 0x00},  // 4.47034836e-08
    {0x32800000u, 0x3280, 0x0000, 0x00, 0x00, 0x00},  // 1.49011612e-08
    {0x00800000u, 0x0080, 0x0000, 0x00, 0x00, 0x00},  // 1.17549435e-38
    {0x00010000u, 0x0001, 0x0000, 0x00, 0x00, 0x00},  // 9.18354962e-41
    {0x00000001u, 0x0000, 0x0000, 0x00, 0x00, 0x00},  // 1.40129846e-45
    {0x7F800000u, 0x7F80, 0x7C00, 0x78, 0x7F, 0x7C},  // inf
    {0xFF800000u, 0xFF80, 0xFC00, 0xF8, 0xFF, 0xFC},  // -inf
    {0x7FC00000u, 0x7FC0, 0x7E00, 0x7C, 0x7F, 0x7E},  // nan
    {0xBE243B9Fu, 0xBE24, 0xB122, 0xA2, 0xA2, 0xB1},  // -0.160383686
    {0x42803328u, 0x4280, 0x5402, 0x68, 0x68, 0x54},  // 64.0999146
    {0x42942DA2u, 0x4294, 0x54A1, 0x69, 0x69, 0x55},  // 74.0891266
    {0x44BEC624u, 0x44BF, 0x65F6, 0x78, 0x7F, 0x66},  // 1526.19189
    {0x3710E985u, 0x3711, 0x0091, 0x00, 0x00, 0x01},  // 8.63743935e-06
    {0x32FA3BBBu, 0x32FA, 0x0000, 0x00, 0x00, 0x00},  // 2.91309927e-08
    {0xBAC1D514u, 0xBAC2, 0x960F, 0x81, 0x81, 0x96},  // -0.00147882337
    {0x3DC1A203u, 0x3DC2, 0x2E0D, 0x1C, 0x1C, 0x2E},  // 0.0945472941
    {0xC1854A74u, 0xC185, 0xCC2A, 0xD8, 0xD8, 0xCC},  // -16.6613541
    {0x3EAFFF4Au, 0x3EB0, 0x3580, 0x2B, 0x2B, 0x35},  // 0.343744576
    {0xC24CFA3Cu, 0xC24D, 0xD268, 0xE5, 0xE5, 0xD2},  // -51.2443695
    {0x375E1704u, 0x375E, 0x00DE, 0x00, 0x00, 0x01},  // 1.32375899e-05
    {0xB3B8BE67u, 0xB3B9, 0x8001, 0x80, 0x80, 0x80},  // -8.60280167e-08
    {0x3BAA3A40u, 0x3BAA, 0x1D52, 0x03, 0x03, 0x1D},  // 0.00519493222
    {0xB7544182u, 0xB754, 0x80D4, 0x80, 0x80, 0x81},  // -1.26514369e-05
    {0xBE5D1889u, 0xBE5D, 0xB2E9, 0xA6, 0xA6, 0xB3},  // -0.215913907
    {0x3EDE9573u, 0x3EDF, 0x36F5, 0x2E, 0x2E, 0x37},  // 0.434733957
    {0x4829443Cu, 0x4829, 0x7C00, 0x78, 0x7F, 0x7C},  // 173328.938
    {0x44020896u, 0x4402, 0x6010, 0x78, 0x7F, 0x60},  // 520.134155
    {0xB22C2BB8u, 0xB22C, 0x8000, 0x80, 0x80, 0x80},  // -1.00216582e-08
    {0x3E896496u, 0x3E89, 0x344B, 0x29, 0x29, 0x34},  // 0.268345535
    {0x354DEFD8u, 0x354E, 0x000D, 0x00, 0x00, 0x00},  // 7.67174697e-07
    {0x3A9C2475u, 0x3A9C, 0x14E1, 0x01, 0x01, 0x15},  // 0.00119127205
    {0xB7422E6Au, 0xB742, 0x80C2, 0x80, 0x80, 0x81},  // -1.15741077e-05
    {0x31EF3D62u, 0x31EF, 0x0000, 0x00, 0x00, 0x00},  // 6.9627939e-09
    {0x38136189u, 0x3813, 0x024E, 0x00, 0x00, 0x02},  // 3.51383678e-05
    {0xC04F74DFu, 0xC04F, 0xC27C, 0xC5, 0xC5, 0xC2},  // -3.24150825
    {0x2F10EED9u, 0x2F11, 0x0000, 0x00, 0x00, 0x00},  // 1.31815794e-10
    {0xC784AA80u, 0xC785, 0xFC00, 0xF8, 0xFF, 0xFC},  // -67925
    {0xB882228Fu, 0xB882, 0x8411, 0x80, 0x80, 0x84},  // -6.2053201e-05
    {0x43051F15u, 0x4305, 0x5829, 0x70, 0x70, 0x58},  // 133.121414
    {0x348AF67Fu, 0x348B, 0x0004, 0x00, 0x00, 0x00},  // 2.58838526e-07
    {0xB34ECBB7u, 0xB34F, 0x8001, 0x80, 0x80, 0x80},  // -4.81483902e-08
    {0xC51BBCA2u, 0xC51C, 0xE8DE, 0xF8, 0xFF, 0xE9},  // -2491.78955
    {0xBDB38530u, 0xBDB4, 0xAD9C, 0x9B, 0x9B, 0xAE},  // -0.0876563787
    {0xBF01690Cu, 0xBF01, 0xB80B, 0xB0, 0xB0, 0xB8},  // -0.505509138
    {0xBAA82EACu, 0xBAA8, 0x9541, 0x81, 0x81, 0x95},  // -0.00128312921
    {0xB40ED7CAu, 0xB40F, 0x8002, 0x80, 0x80, 0x80},  // -1.33032842e-07
    {0x320DE78Au, 0x320E, 0x0000, 0x00, 0x00, 0x00},  // 8.25992608e-09
    {0xB625E737u, 0xB626, 0x8029, 0x80, 0x80, 0x80},  // -2.47215007e-06
    {0xB436812Au, 0xB437, 0x8003, 0x80, 0x80, 0x80},  // -1.69970605e-07
    {0xC1559FDDu, 0xC156, 0xCAAD, 0xD5, 0xD5, 0xCB},  // -13.3515291
    {0xB7FB5AF6u, 0xB7FB, 0x81F7, 0x80, 0x80, 0x82},  // -2.99638887e-05
    {0x33EF6728u, 0x33EF, 0x0002, 0x00, 0x00, 0x00},  // 1.11480688e-07
    {0xBC76CF5Eu, 0xBC77, 0xA3B6, 0x88, 0x88, 0xA4},  // -0.0150640886
    {0x481B48CDu, 0x481B, 0x7C00, 0x78, 0x7F, 0x7C},  // 159011.203
    {0xB3514DF8u, 0xB351, 0x8001, 0x80, 0x80, 0x80},  // -4.87325167e-08
    {0xB437BA6Bu, 0xB438, 0x8003, 0x80, 0x80, 0x80},  // -1.71110216e-07
    {0x440045C6u, 0x4400, 0x6002, 0x78, 0x7F, 0x60},  // 513.09021
    {0x44B3A2F1u, 0x44B4, 0x659D, 0x78, 0x7F, 0x66},  // 1437.09192
    {0xB1186C31u, 0xB118, 0x8000, 0x80, 0x80, 0x80},  // -2.21804108e-09
    {0x3BD49AACu, 0x3BD5, 0x1EA5, 0x03, 0x03, 0x1F},  // 0.00648816489
    {0xC6F85A3Du, 0xC6F8, 0xF7C3, 0xF8, 0xFF, 0xF8},  // -31789.1191
    {0xB59358FFu, 0xB593, 0x8012, 0x80, 0x80, 0x80},  // -1.09782547e-06
    {0x43268AAAu, 0x4327, 0x5934, 0x72, 0x72, 0x59},  // 166.541656
    {0x371649BCu, 0x3716, 0x0096, 0x00, 0x00, 0x01},  // 8.95786434e-06
    {0xC7EAE20Fu, 0xC7EB, 0xFC00, 0xF8, 0xFF, 0xFC},  // -120260.117
    {0x46DAB88Bu, 0x46DB, 0x76D6, 0x78, 0x7F, 0x77},  // 27996.2715
    {0xBDD12418u, 0xBDD1, 0xAE89, 0x9D, 0x9D, 0xAF},  // -0.102119625
    {0x3A5E537Fu, 0x3A5E, 0x12F3, 0x00, 0x00, 0x13},  // 0.000848106982
    {0x3F808000u, 0x3F80, 0x3C04, 0x38, 0x38, 0x3C},  // 1.00390625
    {0x3F818000u, 0x3F82, 0x3C0C, 0x38, 0x38, 0x3C},  // 1.01171875
    {0x3F807FFFu, 0x3F80, 0x3C04, 0x38, 0x38, 0x3C},  // 1.00390613
    {0x3F808001u, 0x3F81, 0x3C04, 0x38, 0x38, 0x3C},  // 1.00390637
    {0x7F7FFFFFu, 0x7F80, 0x7C00, 0x78, 0x7F, 0x7C},  // 3.40282347e+38
    {0x00000001u, 0x0000, 0x0000, 0x00, 0x00, 0x00},  // 1.40129846e-45
    {0x00008000u, 0x0000, 0x0000, 0x00, 0x00, 0x00},  // 4.59177481e-41
    {0x00018000u, 0x0002, 0x0000, 0x00, 0x00, 0x00},  // 1.37753244e-40
    {0x807FFFFFu, 0x8080, 0x8000, 0x80, 0x80, 0x80},  // -1.17549421e-38
    {0x3F801000u, 0x3F80, 0x3C00, 0x38, 0x38, 0x3C},  // 1.00048828
    {0x3F803000u, 0x3F80, 0x3C02, 0x38, 0x38, 0x3C},  // 1.00146484
    {0xE94102F0u, 0xE941, 0xFC00, 0xF8, 0xFF, 0xFC},  // -1.45835347e+25
    {0x138B6021u, 0x138B, 0x0000, 0x00, 0x00, 0x00},  // 3.51833235e-27
    {0x30904F4Du, 0x3090, 0x0000, 0x00, 0x00, 0x00},  // 1.04999176e-09
    {0x08A790E6u, 0x08A8, 0x0000, 0x00, 0x00, 0x00},  // 1.00850124e-33
    {0x63BB68D1u, 0x63BB, 0x7C00, 0x78, 0x7F, 0x7C},  // 6.91418792e+21
    {0x762C4A6Au, 0x762C, 0x7C00, 0x78, 0x7F, 0x7C},  // 8.73617535e+32
    {0xD30CA612u, 0xD30D, 0xFC00, 0xF8, 0xFF, 0xFC},  // -6.04081619e+11
    {0xDFB2ED55u, 0xDFB3, 0xFC00, 0xF8, 0xFF, 0xFC},  // -2.57861095e+19
    {0x98AFEB8Eu, 0x98B0, 0x8000, 0x80, 0x80, 0x80},  // -4.54742892e-24
    {0x59C18B29u, 0x59C2, 0x7C00, 0x78, 0x7F, 0x7C},  // 6.80970984e+15
    {0xE61DBFD5u, 0xE61E, 0xFC00, 0xF8, 0xFF, 0xFC},  // -1.86237554e+23
    {0xD2D23E2Cu, 0xD2D2, 0xFC00, 0xF8, 0xFF, 0xFC},  // -4.51493102e+11
    {0x3558FA5Bu, 0x3559, 0x000E, 0x00, 0x00, 0x00},  // 8.08305856e-07
    {0xF27BA377u, 0xF27C, 0xFC00, 0xF8, 0xFF, 0xFC},  // -4.98421468e+30
    {0x7A5288C6u, 0x7A53, 0x7C00, 0x78, 0x7F, 0x7C},  // 2.73289109e+35
    {0x11299478u, 0x112A, 0x0000, 0x00, 0x00, 0x00},  // 1.33774998e-28
    {0xA508A070u, 0xA509, 0x8000, 0x80, 0x80, 0x80},  // -1.1850478e-16
    {0x4C3F3F88u, 0x4C3F, 0x7C00, 0x78, 0x7F, 0x7C},  // 50134560
    {0x4166A635u, 0x4167, 0x4B35, 0x56, 0x56, 0x4B},  // 14.4155779
    {0x9E81561Cu, 0x9E81, 0x8000, 0x80, 0x80, 0x80},  // -1.36940203e-20
    {0x8B30DAFDu, 0x8B31, 0x8000, 0x80, 0x80, 0x80},  // -3.40611155e-32
    {0x4D3FF993u, 0x4D40, 0x7C00, 0x78, 0x7F, 0x7C},  // 201300272
    {0x67640B53u, 0x6764, 0x7C00, 0x78, 0x7F, 0x7C},  // 1.07690845e+24
    {0x2CC2BCADu, 0x2CC3, 0x0000, 0x00, 0x00, 0x00},  // 5.53475885e-12
    {0x753842DCu, 0x7538, 0x7C00, 0x78, 0x7F, 0x7C},  // 2.33578782e+32
    {0x7ED96DB0u, 0x7ED9, 0x7C00, 0x78, 0x7F, 0x7C},  // 1.44506003e+38
    {0x72C4E6B3u, 0x72C5, 0x7C00, 0x78, 0x7F, 0x7C},  // 7.8000589e+30
    {0xC2B4BDE3u, 0xC2B5, 0xD5A6, 0xEB, 0xEB, 0xD6},  // -90.3708725
    {0x52521C94u, 0x5252, 0x7C00, 0x78, 0x7F, 0x7C},  // 2.25605648e+11
    {0xAFF05FEDu, 0xAFF0, 0x8000, 0x80, 0x80, 0x80},  // -4.37239051e-10
    {0x31AFAF8Au, 0x31B0, 0x0000, 0x00, 0x00, 0x00},  // 5.11312681e-09
    {0x3F871256u, 0x3F87, 0x3C39, 0x38, 0x38, 0x3C},  // 1.05524707
    {0x7A128C38u, 0x7A13, 0x7C00, 0x78, 0x7F, 0x7C},  // 1.90229829e+35
    {0x9F3E7213u, 0x9F3E, 0x8000, 0x80, 0x80, 0x80},  // -4.0328425e-20
    {0xB1E39E68u, 0xB1E4, 0x8000, 0x80, 0x80, 0x80},  // -6.62457822e-09
    {0x50CECFB4u, 0x50CF, 0x7C00, 0x78, 0x7F, 0x7C},  // 2.77577482e+10
    {0xD30285EFu, 0xD303, 0xFC00, 0xF8, 0xFF, 0xFC},  // -5.60592781e+11
    {0x46F7A7B5u, 0x46F8, 0x77BD, 0x78, 0x7F, 0x78},  // 31699.8535
    {0x0DCCB283u, 0x0DCD, 0x0000, 0x00, 0x00, 0x00},  // 1.26154458e-30
    {0xEE0BA57Eu, 0xEE0C, 0xFC00, 0xF8, 0xFF, 0xFC},  // -1.0804621e+28
};

}  // namespace

TEST_CASE("dtype table: names, sizes, kinds", "[dtype]") {
  CHECK(kNumDTypes == 18);
  CHECK(dtype_bytes(DType::kFloat32) == 4);
  CHECK(dtype_bytes(DType::kBFloat16) == 2);
  CHECK(dtype_bytes(DType::kFloat16) == 2);
  CHECK(dtype_bytes(DType::kTFloat32) == 4);
  CHECK(dtype_bytes(DType::kFloat8E4M3) == 1);
  CHECK(dtype_bytes(DType::kFloat8E4M3FN) == 1);
  CHECK(dtype_bytes(DType::kFloat8E5M2) == 1);
  CHECK(dtype_bytes(DType::kInt32) == 4);
  CHECK(dtype_bytes(DType::kUInt16) == 2);
  CHECK(dtype_bytes(DType::kBool) == 1);
  CHECK(dtype_name(DType::kBFloat16) == "bfloat16");
  CHECK(dtype_name(DType::kFloat8E4M3FN) == "float8_e4m3fn");
  CHECK(dtype_name(DType::kBool) == "bool");
  CHECK(dtype_is_float(DType::kFloat8E5M2));
  CHECK_FALSE(dtype_is_int(DType::kFloat8E5M2));
  CHECK(dtype_is_int(DType::kUInt8));
  CHECK(dtype_is_int(DType::kBool));
  CHECK_FALSE(dtype_is_float(DType::kBool));
  CHECK(dtype_is_signed(DType::kInt16));
  CHECK_FALSE(dtype_is_signed(DType::kUInt32));
  CHECK_FALSE(dtype_is_signed(DType::kBool));
  CHECK(dtype_is_signed(DType::kBFloat16));

  // Every canonical name round-trips.
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto t = static_cast<DType>(i);
    const auto parsed = dtype_from_name(dtype_name(t));
    REQUIRE(parsed.has_value());
    CHECK(*parsed == t);
  }
}

TEST_CASE("MX dtypes: e8m0fnu scale and the x4-packed types", "[dtype]") {
  CHECK(dtype_bytes(DType::kFloat8E5M2X4) == 4);
  CHECK(dtype_bytes(DType::kFloat8E4M3FNX4) == 4);
  CHECK(dtype_bytes(DType::kFloat4E2M1FNX4) == 2);
  for (DType t : {DType::kFloat8E5M2X4, DType::kFloat8E4M3FNX4, DType::kFloat4E2M1FNX4}) {
    CHECK(dtype_values(t) == 4);
    CHECK(dtype_is_mx_x4(t));
    CHECK_FALSE(dtype_is_float(t));
    CHECK_FALSE(dtype_is_int(t));  // neither: no cast path
  }
  CHECK(dtype_values(DType::kFloat8E8M0FNU) == 1);
  CHECK_FALSE(dtype_is_mx_x4(DType::kUInt32));
  // float8_e8m0fnu: np.float32(x).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8) (ml_dtypes 0.6)
  const std::pair<float, uint8_t> narrow[] = {{1.0f, 127}, {1.4f, 127}, {1.5f, 128}, {3.0f, 129}, {0.75f, 127},
                                              {0.0f, 255}, {-1.0f, 255}, {1e-40f, 0}, {0x1p127f, 254},
                                              {INFINITY, 255}, {NAN, 255}, {0x1p-127f, 0}};
  for (auto [x, b] : narrow) {
    INFO(x);
    CHECK(f32_to_f8e8m0fnu_bits(x) == b);
  }
  CHECK(f8e8m0fnu_bits_to_f32(0) == 0x1p-127f);
  CHECK(f8e8m0fnu_bits_to_f32(127) == 1.0f);
  CHECK(f8e8m0fnu_bits_to_f32(254) == 0x1p127f);
  CHECK(std::isnan(f8e8m0fnu_bits_to_f32(255)));
  uint8_t e = 0;
  store_f32(DType::kFloat8E8M0FNU, &e, 4.0f);
  CHECK(e == 129);
  CHECK(load_f32(DType::kFloat8E8M0FNU, &e) == 4.0f);
  // float4_e2m1fn nibbles, and the packed lanes of each x4 type (value 0 lowest)
  const float fp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (uint8_t n = 0; n < 16; ++n) CHECK(f4e2m1fn_bits_to_f32(n) == fp4[n]);
  const uint8_t w4[2] = {0x7A, 0x21};  // nibbles low first: 0xA, 0x7, 0x1, 0x2
  CHECK(mx_x4_value(DType::kFloat4E2M1FNX4, w4, 0) == -1.0f);
  CHECK(mx_x4_value(DType::kFloat4E2M1FNX4, w4, 1) == 6.0f);
  CHECK(mx_x4_value(DType::kFloat4E2M1FNX4, w4, 2) == 0.5f);
  CHECK(mx_x4_value(DType::kFloat4E2M1FNX4, w4, 3) == 1.0f);
  const uint8_t w8[4] = {0x38, 0xC0, 0x00, 0x7E};
  CHECK(mx_x4_value(DType::kFloat8E4M3FNX4, w8, 0) == 1.0f);   // e4m3fn 0x38 = 2^0
  CHECK(mx_x4_value(DType::kFloat8E4M3FNX4, w8, 1) == -2.0f);  // 0xC0 = -2^1
  CHECK(mx_x4_value(DType::kFloat8E5M2X4, w8, 0) == 0.5f);     // e5m2 0x38 = 2^-1
  CHECK(std::isnan(mx_x4_value(DType::kFloat8E5M2X4, w8, 3)));  // 0x7E is an e5m2 NaN
}

TEST_CASE("dtype_from_name aliases", "[dtype]") {
  CHECK(dtype_from_name("fp32") == DType::kFloat32);
  CHECK(dtype_from_name("bf16") == DType::kBFloat16);
  CHECK(dtype_from_name("fp16") == DType::kFloat16);
  CHECK(dtype_from_name("tf32") == DType::kTFloat32);
  CHECK(dtype_from_name("fp8_e4m3") == DType::kFloat8E4M3);
  CHECK(dtype_from_name("fp8_e4m3fn") == DType::kFloat8E4M3FN);
  CHECK(dtype_from_name("fp8_e5m2") == DType::kFloat8E5M2);
  CHECK(dtype_from_name("bool_") == DType::kBool);
  CHECK(dtype_from_name("bool") == DType::kBool);
  CHECK(dtype_from_name("float8_e4m3") == DType::kFloat8E4M3);
  CHECK_FALSE(dtype_from_name("float64").has_value());
  CHECK_FALSE(dtype_from_name("").has_value());
  CHECK_FALSE(dtype_from_name("BF16").has_value());
}

TEST_CASE("bfloat16 known patterns", "[dtype]") {
  CHECK(f32_to_bf16_bits(1.0f) == 0x3F80);
  CHECK(f32_to_bf16_bits(-2.0f) == 0xC000);
  CHECK(f32_to_bf16_bits(-0.0f) == 0x8000);
  CHECK(f32_to_bf16_bits(f_of(0x3F808000u)) == 0x3F80);  // tie, even stays
  CHECK(f32_to_bf16_bits(f_of(0x3F818000u)) == 0x3F82);  // tie, odd rounds up
  CHECK(f32_to_bf16_bits(f_of(0x3F808001u)) == 0x3F81);  // above tie
  CHECK(f32_to_bf16_bits(f_of(0x3F807FFFu)) == 0x3F80);  // below tie
  CHECK(f32_to_bf16_bits(FLT_MAX) == 0x7F80);            // rounds up to inf
  CHECK(f32_to_bf16_bits(-FLT_MAX) == 0xFF80);
  CHECK(f32_to_bf16_bits(INFINITY) == 0x7F80);
  CHECK(f32_to_bf16_bits(f_of(0x00018000u)) == 0x0002);  // subnormal tie rounds to even
  CHECK(f32_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()) == 0x7FC0);
  CHECK(f32_to_bf16_bits(f_of(0xFFC00000u)) == 0xFFC0);  // sign kept
  CHECK(f32_to_bf16_bits(f_of(0x7F800001u)) == 0x7FC0);  // signalling NaN: never becomes inf
  CHECK(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(f_of(0x7F800001u)))));
  CHECK(bf16_bits_to_f32(0x3F80) == 1.0f);
  CHECK(u_of(bf16_bits_to_f32(0x8000)) == 0x80000000u);
}

TEST_CASE("float16 known patterns", "[dtype]") {
  CHECK(f32_to_f16_bits(1.0f) == 0x3C00);
  CHECK(f32_to_f16_bits(65504.0f) == 0x7BFF);
  CHECK(f32_to_f16_bits(65519.99f) == 0x7BFF);
  CHECK(f32_to_f16_bits(65520.0f) == 0x7C00);          // tie above max rounds to inf
  CHECK(f32_to_f16_bits(-65520.0f) == 0xFC00);
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -25)) == 0x0000);  // tie -> even (zero)
  CHECK(f32_to_f16_bits(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(f32_to_f16_bits(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 ulp tie -> 2
  CHECK(f32_to_f16_bits(-std::ldexp(1.0f, -26)) == 0x8000);  // underflow keeps sign
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
  CHECK(f32_to_f16_bits(std::ldexp(1023.5f, -24)) == 0x0400);  // rounds up into the normals
  CHECK(f32_to_f16_bits(-0.0f) == 0x8000);
  CHECK(f32_to_f16_bits(std::numeric_limits<float>::quiet_NaN()) == 0x7E00);
  CHECK(f32_to_f16_bits(f_of(0xFFC00000u)) == 0xFE00);
  CHECK(f32_to_f16_bits(f_of(0x7F800001u)) == 0x7C01);  // numpy keeps NaN, payload lost -> 1
  CHECK(f16_bits_to_f32(0x7BFF) == 65504.0f);
  CHECK(f16_bits_to_f32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(std::isinf(f16_bits_to_f32(0x7C00)));
  CHECK(std::isnan(f16_bits_to_f32(0x7C01)));
}

TEST_CASE("float8_e4m3 (IEEE-like) known patterns", "[dtype]") {
  CHECK(f32_to_f8e4m3_bits(1.0f) == 0x38);
  CHECK(f32_to_f8e4m3_bits(240.0f) == 0x77);        // max finite
  CHECK(f32_to_f8e4m3_bits(247.99f) == 0x77);
  CHECK(f32_to_f8e4m3_bits(248.0f) == 0x78);        // tie above max: to even = inf
  CHECK(f32_to_f8e4m3_bits(1e6f) == 0x78);
  CHECK(f32_to_f8e4m3_bits(-1e6f) == 0xF8);
  CHECK(f32_to_f8e4m3_bits(INFINITY) == 0x78);
  CHECK(f32_to_f8e4m3_bits(std::ldexp(1.0f, -9)) == 0x01);  // smallest subnormal
  CHECK(f32_to_f8e4m3_bits(std::ldexp(1.0f, -10)) == 0x00); // tie -> 0
  CHECK(f32_to_f8e4m3_bits(-0.0f) == 0x80);
  CHECK(f32_to_f8e4m3_bits(std::numeric_limits<float>::quiet_NaN()) == 0x7C);
  CHECK(f32_to_f8e4m3_bits(f_of(0xFFC00000u)) == 0xFC);
  CHECK(f8e4m3_bits_to_f32(0x77) == 240.0f);
  CHECK(std::isinf(f8e4m3_bits_to_f32(0x78)));
  CHECK(std::isnan(f8e4m3_bits_to_f32(0x79)));
  CHECK(f8e4m3_bits_to_f32(0x01) == std::ldexp(1.0f, -9));
}

TEST_CASE("float8_e4m3fn known patterns", "[dtype]") {
  CHECK(f32_to_f8e4m3fn_bits(1.0f) == 0x38);
  CHECK(f32_to_f8e4m3fn_bits(448.0f) == 0x7E);      // max finite
  CHECK(f32_to_f8e4m3fn_bits(464.0f) == 0x7E);      // tie between 448 and "480": to even (448)
  CHECK(f32_to_f8e4m3fn_bits(480.0f) == 0x7F);      // overflow -> NaN
  CHECK(f32_to_f8e4m3fn_bits(500.0f) == 0x7F);
  CHECK(f32_to_f8e4m3fn_bits(-500.0f) == 0xFF);
  CHECK(f32_to_f8e4m3fn_bits(INFINITY) == 0x7F);    // no inf: NaN
  CHECK(f32_to_f8e4m3fn_bits(-INFINITY) == 0xFF);
  CHECK(f32_to_f8e4m3fn_bits(std::numeric_limits<float>::quiet_NaN()) == 0x7F);
  CHECK(f32_to_f8e4m3fn_bits(-0.0f) == 0x80);
  CHECK(f32_to_f8e4m3fn_bits(std::ldexp(1.0f, -9)) == 0x01);
  CHECK(f8e4m3fn_bits_to_f32(0x7E) == 448.0f);
  CHECK(f8e4m3fn_bits_to_f32(0x78) == 256.0f);      // exponent all-ones is an ordinary binade
  CHECK(std::isnan(f8e4m3fn_bits_to_f32(0x7F)));
  CHECK(std::isnan(f8e4m3fn_bits_to_f32(0xFF)));
}

TEST_CASE("float8_e5m2 known patterns", "[dtype]") {
  CHECK(f32_to_f8e5m2_bits(1.0f) == 0x3C);
  CHECK(f32_to_f8e5m2_bits(57344.0f) == 0x7B);      // max finite
  CHECK(f32_to_f8e5m2_bits(61439.0f) == 0x7B);
  CHECK(f32_to_f8e5m2_bits(61440.0f) == 0x7C);      // tie above max -> inf
  CHECK(f32_to_f8e5m2_bits(std::ldexp(1.0f, -16)) == 0x01);  // smallest subnormal
  CHECK(f32_to_f8e5m2_bits(std::ldexp(1.0f, -17)) == 0x00);  // tie -> 0
  CHECK(f32_to_f8e5m2_bits(-INFINITY) == 0xFC);
  CHECK(f32_to_f8e5m2_bits(std::numeric_limits<float>::quiet_NaN()) == 0x7E);
  CHECK(f8e5m2_bits_to_f32(0x7B) == 57344.0f);
  CHECK(f8e5m2_bits_to_f32(0x01) == std::ldexp(1.0f, -16));
  CHECK(std::isinf(f8e5m2_bits_to_f32(0x7C)));
  CHECK(std::isnan(f8e5m2_bits_to_f32(0x7D)));
}

TEST_CASE("reference table from numpy/ml_dtypes", "[dtype]") {
  for (const auto& r : kRef) {
    const float x = f_of(r.f32);
    INFO("fp32 bits 0x" << std::hex << r.f32);
    CHECK(f32_to_bf16_bits(x) == r.bf16);
    CHECK(f32_to_f16_bits(x) == r.f16);
    CHECK(int(f32_to_f8e4m3_bits(x)) == int(r.e4m3));
    CHECK(int(f32_to_f8e4m3fn_bits(x)) == int(r.e4m3fn));
    CHECK(int(f32_to_f8e5m2_bits(x)) == int(r.e5m2));
  }
}

TEST_CASE("fp8 round trips, all 256 patterns", "[dtype]") {
  for (uint32_t b = 0; b < 256; ++b) {
    const auto u8 = static_cast<uint8_t>(b);
    INFO("pattern 0x" << std::hex << b);
    {
      const float f = f8e4m3_bits_to_f32(u8);
      if (std::isnan(f)) {
        CHECK(same_or_nan(f8e4m3_bits_to_f32(f32_to_f8e4m3_bits(f)), f));
        CHECK(int(f32_to_f8e4m3_bits(f)) == int((b & 0x80) | 0x7C));  // canonical quiet NaN
        CHECK(std::signbit(f) == ((b & 0x80) != 0));
      } else {
        CHECK(int(f32_to_f8e4m3_bits(f)) == int(b));
      }
    }
    {
      const float f = f8e4m3fn_bits_to_f32(u8);
      if ((b & 0x7F) == 0x7F) {
        CHECK(std::isnan(f));
        CHECK(int(f32_to_f8e4m3fn_bits(f)) == int(b));  // NaN encoding, sign kept
      } else {
        CHECK(std::isfinite(f));
        CHECK(int(f32_to_f8e4m3fn_bits(f)) == int(b));
      }
    }
    {
      const float f = f8e5m2_bits_to_f32(u8);
      if (std::isnan(f)) {
        CHECK(same_or_nan(f8e5m2_bits_to_f32(f32_to_f8e5m2_bits(f)), f));
        CHECK(int(f32_to_f8e5m2_bits(f)) == int((b & 0x80) | 0x7E));  // canonical quiet NaN
      } else {
        CHECK(int(f32_to_f8e5m2_bits(f)) == int(b));
      }
    }
  }
}

TEST_CASE("bf16 and f16 round trips, all 65536 patterns", "[dtype]") {
  int bad_bf16 = 0, bad_f16 = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto u16 = static_cast<uint16_t>(b);
    const float fb = bf16_bits_to_f32(u16);
    if (std::isnan(fb)) {
      bad_bf16 += !same_or_nan(bf16_bits_to_f32(f32_to_bf16_bits(fb)), fb);  // NaN -> quiet NaN
      bad_bf16 += std::signbit(bf16_bits_to_f32(f32_to_bf16_bits(fb))) != std::signbit(fb);
    } else {
      bad_bf16 += f32_to_bf16_bits(fb) != u16;
    }
    // numpy keeps a float16 NaN's payload through fp32 and back, so every pattern round-trips.
    bad_f16 += f32_to_f16_bits(f16_bits_to_f32(u16)) != u16;
  }
  CHECK(bad_bf16 == 0);
  CHECK(bad_f16 == 0);
}

TEST_CASE("widening is exact and monotone", "[dtype]") {
  // Finite positive patterns of each format widen to strictly increasing fp32 values.
  float prev = -1.0f;
  for (uint32_t b = 0; b < 0x7C00; ++b) {
    const float f = f16_bits_to_f32(static_cast<uint16_t>(b));
    REQUIRE(f > prev);
    prev = f;
  }
  prev = -1.0f;
  for (uint32_t b = 0; b < 0x7F; ++b) {
    const float f = f8e4m3fn_bits_to_f32(static_cast<uint8_t>(b));
    REQUIRE(f > prev);
    prev = f;
  }
  CHECK(prev == 448.0f);
}

TEST_CASE("tfloat32 rounding", "[dtype]") {
  CHECK(u_of(round_to_tf32(1.0f)) == 0x3F800000u);
  CHECK(u_of(round_to_tf32(f_of(0x3F800FFFu))) == 0x3F800000u);  // below tie
  CHECK(u_of(round_to_tf32(f_of(0x3F801000u))) == 0x3F800000u);  // tie, even stays
  CHECK(u_of(round_to_tf32(f_of(0x3F801001u))) == 0x3F802000u);  // above tie
  CHECK(u_of(round_to_tf32(f_of(0x3F803000u))) == 0x3F804000u);  // tie, odd rounds up
  CHECK(u_of(round_to_tf32(f_of(0xBF801000u))) == 0xBF800000u);
  CHECK(u_of(round_to_tf32(f_of(0x00003000u))) == 0x00004000u);  // subnormal
  CHECK(u_of(round_to_tf32(FLT_MAX)) == 0x7F800000u);            // overflow -> inf
  CHECK(u_of(round_to_tf32(-0.0f)) == 0x80000000u);
  CHECK(std::isnan(round_to_tf32(f_of(0x7F800001u))));          // NaN never becomes inf
  CHECK(std::signbit(round_to_tf32(f_of(0xFF800001u))));
  CHECK(std::isinf(round_to_tf32(INFINITY)));
  // Stored as fp32: store_f32 rounds, load_f32 reads back the rounded value.
  uint8_t buf[4];
  store_f32(DType::kTFloat32, buf, f_of(0x3F803000u));
  CHECK(u_of(load_f32(DType::kTFloat32, buf)) == 0x3F804000u);
}

TEST_CASE("float -> int: truncate, saturate, NaN -> 0", "[dtype]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(f32_to_int_saturate(300.0f, DType::kInt8) == 127);
  CHECK(f32_to_int_saturate(-300.0f, DType::kInt8) == -128);
  CHECK(f32_to_int_saturate(-1.5f, DType::kUInt8) == 0);
  CHECK(f32_to_int_saturate(-0.5f, DType::kUInt8) == 0);
  CHECK(f32_to_int_saturate(2.9f, DType::kInt32) == 2);
  CHECK(f32_to_int_saturate(-2.9f, DType::kInt32) == -2);
  CHECK(f32_to_int_saturate(nan, DType::kInt32) == 0);
  CHECK(f32_to_int_saturate(nan, DType::kUInt16) == 0);
  CHECK(f32_to_int_saturate(3e9f, DType::kInt32) == 2147483647);
  CHECK(f32_to_int_saturate(-3e9f, DType::kInt32) == -2147483647 - 1);
  CHECK(f32_to_int_saturate(2147483648.0f, DType::kInt32) == 2147483647);
  CHECK(f32_to_int_saturate(2147483520.0f, DType::kInt32) == 2147483520);  // largest fp32 < 2^31
  CHECK(f32_to_int_saturate(5e9f, DType::kUInt32) == 4294967295LL);
  CHECK(f32_to_int_saturate(4294967040.0f, DType::kUInt32) == 4294967040LL);
  CHECK(f32_to_int_saturate(INFINITY, DType::kInt16) == 32767);
  CHECK(f32_to_int_saturate(-INFINITY, DType::kInt16) == -32768);
  CHECK(f32_to_int_saturate(65535.9f, DType::kUInt16) == 65535);
  CHECK(f32_to_int_saturate(255.99f, DType::kUInt8) == 255);
  CHECK(f32_to_int_saturate(-0.0f, DType::kInt8) == 0);
  // bool: v != 0 (so NaN -> 1)
  CHECK(f32_to_int_saturate(0.0f, DType::kBool) == 0);
  CHECK(f32_to_int_saturate(-0.0f, DType::kBool) == 0);
  CHECK(f32_to_int_saturate(0.25f, DType::kBool) == 1);
  CHECK(f32_to_int_saturate(-7.0f, DType::kBool) == 1);
  CHECK(f32_to_int_saturate(nan, DType::kBool) == 1);
}

TEST_CASE("float -> int matches a double-precision reference", "[dtype]") {
  const DType types[] = {DType::kInt8,  DType::kInt16,  DType::kInt32,
                         DType::kUInt8, DType::kUInt16, DType::kUInt32};
  const double lo[] = {-128.0, -32768.0, -2147483648.0, 0.0, 0.0, 0.0};
  const double hi[] = {127.0, 32767.0, 2147483647.0, 255.0, 65535.0, 4294967295.0};
  int bad = 0;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 0x10001) {  // ~65536 patterns, both signs
    const float v = f_of(static_cast<uint32_t>(u));
    for (int k = 0; k < 6; ++k) {
      double ref = 0.0;
      if (!std::isnan(v)) ref = std::fmin(std::fmax(std::trunc(static_cast<double>(v)), lo[k]), hi[k]);
      bad += f32_to_int_saturate(v, types[k]) != static_cast<int64_t>(ref);
    }
  }
  CHECK(bad == 0);
  // Non-integer dtypes saturate to int64.
  CHECK(f32_to_int_saturate(1e30f, DType::kFloat32) == std::numeric_limits<int64_t>::max());
  CHECK(f32_to_int_saturate(-1e30f, DType::kFloat32) == std::numeric_limits<int64_t>::min());
  CHECK(f32_to_int_saturate(-7.75f, DType::kBFloat16) == -7);
}

TEST_CASE("store_f32 / load_f32 on integer types", "[dtype]") {
  uint8_t buf[4] = {};
  store_f32(DType::kInt8, buf, 300.0f);
  CHECK(load_int(DType::kInt8, buf) == 127);
  store_f32(DType::kInt8, buf, -2.9f);
  CHECK(load_int(DType::kInt8, buf) == -2);
  CHECK(load_f32(DType::kInt8, buf) == -2.0f);
  store_f32(DType::kUInt8, buf, -1.5f);
  CHECK(load_int(DType::kUInt8, buf) == 0);
  store_f32(DType::kInt32, buf, 3e9f);
  CHECK(load_int(DType::kInt32, buf) == 2147483647);
  store_f32(DType::kInt32, buf, std::numeric_limits<float>::quiet_NaN());
  CHECK(load_int(DType::kInt32, buf) == 0);
  store_f32(DType::kUInt32, buf, 4e9f);
  CHECK(load_int(DType::kUInt32, buf) == 4000000000LL);
  store_f32(DType::kInt16, buf, -40000.0f);
  CHECK(load_int(DType::kInt16, buf) == -32768);
  store_f32(DType::kBool, buf, 0.5f);
  CHECK(buf[0] == 1);
  store_f32(DType::kBool, buf, std::numeric_limits<float>::quiet_NaN());
  CHECK(buf[0] == 1);
  store_f32(DType::kBool, buf, -0.0f);
  CHECK(buf[0] == 0);
  CHECK(load_f32(DType::kBool, buf) == 0.0f);
  buf[0] = 7;  // any non-zero byte reads as true
  CHECK(load_int(DType::kBool, buf) == 1);
  CHECK(load_f32(DType::kBool, buf) == 1.0f);
  // Integers widen exactly up to 2^24.
  store_int(DType::kInt32, buf, 16777216);
  CHECK(load_f32(DType::kInt32, buf) == 16777216.0f);
  store_int(DType::kInt32, buf, -16777215);
  CHECK(load_f32(DType::kInt32, buf) == -16777215.0f);
}

TEST_CASE("store_int wraps, load_int sign-extends", "[dtype]") {
  uint8_t buf[4] = {};
  store_int(DType::kInt8, buf, 200);
  CHECK(load_int(DType::kInt8, buf) == -56);
  CHECK(load_int(DType::kUInt8, buf) == 200);
  store_int(DType::kUInt8, buf, -1);
  CHECK(load_int(DType::kUInt8, buf) == 255);
  store_int(DType::kUInt8, buf, 256 + 5);
  CHECK(load_int(DType::kUInt8, buf) == 5);
  store_int(DType::kInt16, buf, 0x18000);
  CHECK(load_int(DType::kInt16, buf) == -32768);
  store_int(DType::kUInt16, buf, -2);
  CHECK(load_int(DType::kUInt16, buf) == 65534);
  store_int(DType::kInt32, buf, 0x180000005LL);
  CHECK(load_int(DType::kInt32, buf) == -2147483643LL);
  store_int(DType::kUInt32, buf, -1);
  CHECK(load_int(DType::kUInt32, buf) == 4294967295LL);
  CHECK(load_int(DType::kInt32, buf) == -1);
  store_int(DType::kInt32, buf, std::numeric_limits<int64_t>::min());
  CHECK(load_int(DType::kInt32, buf) == 0);
  // Little-endian layout.
  store_int(DType::kUInt32, buf, 0x11223344);
  CHECK(buf[0] == 0x44);
  CHECK(buf[3] == 0x11);
  store_int(DType::kBool, buf, 256);
  CHECK(buf[0] == 1);
  store_int(DType::kBool, buf, 0);
  CHECK(buf[0] == 0);
  // Float types: value conversion.
  store_int(DType::kBFloat16, buf, 3);
  CHECK(load_f32(DType::kBFloat16, buf) == 3.0f);
  CHECK(load_int(DType::kBFloat16, buf) == 3);
}

TEST_CASE("unaligned element access", "[dtype]") {
  uint8_t buf[9] = {};
  store_f32(DType::kFloat32, buf + 1, 1.25f);
  CHECK(load_f32(DType::kFloat32, buf + 1) == 1.25f);
  store_f32(DType::kFloat16, buf + 3, -2.5f);
  CHECK(load_f32(DType::kFloat16, buf + 3) == -2.5f);
  store_int(DType::kInt32, buf + 5, -123456);
  CHECK(load_int(DType::kInt32, buf + 5) == -123456);
}

TEST_CASE("bulk conversions agree with scalar ones", "[dtype]") {
  // Inputs: every reference row plus a sweep of values and specials.
  std::vector<float> in;
  for (const auto& r : kRef) in.push_back(f_of(r.f32));
  for (int i = -2000; i <= 2000; ++i) in.push_back(static_cast<float>(i) * 0.37f);
  for (uint32_t u = 0; u < 4096; ++u) in.push_back(f_of(u * 0x000FFFF1u));
  in.push_back(std::numeric_limits<float>::quiet_NaN());
  in.push_back(f_of(0xFF800001u));
  const auto n = static_cast<int64_t>(in.size());

  for (int ti = 0; ti < kNumDTypes; ++ti) {
    const auto t = static_cast<DType>(ti);
    const int sz = dtype_bytes(t);
    INFO("dtype " << std::string(dtype_name(t)));
    std::vector<uint8_t> bulk(static_cast<size_t>(n * sz)), scalar(static_cast<size_t>(n * sz));
    store_f32_n(t, bulk.data(), in.data(), n);
    for (int64_t i = 0; i < n; ++i) store_f32(t, scalar.data() + i * sz, in[static_cast<size_t>(i)]);
    CHECK(bulk == scalar);

    std::vector<float> back(static_cast<size_t>(n));
    load_f32_n(t, bulk.data(), back.data(), n);
    int mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float s = load_f32(t, bulk.data() + i * sz);
      mismatches += u_of(s) != u_of(back[static_cast<size_t>(i)]);
    }
    CHECK(mismatches == 0);
  }
  // n == 0 and negative n are no-ops.
  float dummy = 1.0f;
  uint8_t b = 0xAB;
  store_f32_n(DType::kInt8, &b, &dummy, 0);
  load_f32_n(DType::kInt8, &b, &dummy, -3);
  CHECK(b == 0xAB);
  CHECK(dummy == 1.0f);
}

TEST_CASE("bulk fp32 and bf16 paths", "[dtype]") {
  const float src[5] = {1.0f, f_of(0x3F818000u), -0.0f, FLT_MAX, std::numeric_limits<float>::quiet_NaN()};
  uint16_t out[5];
  store_f32_n(DType::kBFloat16, reinterpret_cast<uint8_t*>(out), src, 5);
  CHECK(out[0] == 0x3F80);
  CHECK(out[1] == 0x3F82);
  CHECK(out[2] == 0x8000);
  CHECK(out[3] == 0x7F80);
  CHECK(out[4] == 0x7FC0);
  float back[5];
  load_f32_n(DType::kBFloat16, reinterpret_cast<const uint8_t*>(out), back, 5);
  CHECK(back[0] == 1.0f);
  CHECK(u_of(back[1]) == 0x3F820000u);
  CHECK(std::isnan(back[4]));
  float f32[5];
  store_f32_n(DType::kFloat32, reinterpret_cast<uint8_t*>(f32), src, 5);
  for (int i = 0; i < 5; ++i) CHECK(u_of(f32[i]) == u_of(src[i]));
}

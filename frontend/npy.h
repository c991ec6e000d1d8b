#pragma once
/// .npy / .npz input and output for the CLI. Arrays are converted to and from a tensor's dtype.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "isa/dtype.h"

namespace nsim::frontend {

/// An array read from a file: its numpy descr, shape and raw little-endian bytes (C order).
struct NpyArray {
  std::string descr;  ///< "<f4", "<V2", "|b1", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

/// Parse .npy bytes. Throws nsim::Error(kBadInput) naming `what`.
NpyArray parse_npy(const std::vector<uint8_t>& bytes, const std::string& what);
/// Read every member "<name>.npy" of an .npz (zip, stored entries as written by np.savez).
std::map<std::string, NpyArray> read_npz(const std::string& path);
NpyArray read_npy(const std::string& path);

/// Convert `a` to `dt` (RNE for narrower floats) checking its shape equals `shape`. Void dtypes of
/// the right width (ml_dtypes bf16 saves as "<V2", fp8 as "<V1") are taken as raw bits of `dt`.
std::vector<uint8_t> to_dtype(const NpyArray& a, DType dt, const std::vector<int64_t>& shape, const std::string& what);

/// Write raw tensor bytes of dtype `dt` as .npy. bf16/fp8/tf32 have no numpy descr: they are written
/// as float32 (an exact widening) unless `raw` (then as "<V2"/"<V1" bits, view with ml_dtypes).
/// Streamed from `data` (`bytes` of them; nullptr: zeros), widened a block at a time: no copy of the tensor.
void write_npy(const std::string& path, const uint8_t* data, size_t bytes, DType dt, const std::vector<int64_t>& shape,
               bool raw = false);
inline void write_npy(const std::string& path, const std::vector<uint8_t>& data, DType dt,
                      const std::vector<int64_t>& shape, bool raw = false) {
  write_npy(path, data.data(), data.size(), dt, shape, raw);
}

}  // namespace nsim::frontend

#include "frontend/npy.h"

#include <algorithm>

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "sim/error.h"

namespace nsim::frontend {

namespace {

[[noreturn]] void bad(const std::string& what, const std::string& msg) {
  throw Error(ErrorCode::kBadInput, fmt::format("{}: {}", what, msg));
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) bad(path, "cannot open the file");
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

uint32_t u16(const uint8_t* p) { return static_cast<uint32_t>(p[0] | (p[1] << 8)); }
uint32_t u32(const uint8_t* p) { return u16(p) | (u16(p + 2) << 16); }
uint64_t u64(const uint8_t* p) { return u32(p) | (static_cast<uint64_t>(u32(p + 4)) << 32); }

// Value of key `key` in a numpy header dict, e.g. 'descr': '<f4'.
std::string header_field(const std::string& h, const std::string& key, const std::string& what) {
  const size_t k = h.find("'" + key + "'");
  if (k == std::string::npos) bad(what, fmt::format("npy header has no '{}'", key));
  size_t p = h.find(':', k);
  if (p == std::string::npos) bad(what, "malformed npy header");
  ++p;
  while (p < h.size() && h[p] == ' ') ++p;
  if (p >= h.size()) bad(what, "malformed npy header");
  if (h[p] == '\'') {
    const size_t e = h.find('\'', p + 1);
    if (e == std::string::npos) bad(what, "malformed npy header");
    return h.substr(p + 1, e - p - 1);
  }
  if (h[p] == '(') {
    const size_t e = h.find(')', p);
    if (e == std::string::npos) bad(what, "malformed npy header");
    return h.substr(p + 1, e - p - 1);
  }
  size_t e = p;
  while (e < h.size() && h[e] != ',' && h[e] != '}') ++e;
  return h.substr(p, e - p);
}

struct Descr {
  char kind = 0;  // f, i, u, b, V
  int bytes = 0;
};
Descr parse_descr(const std::string& d, const std::string& what) {
  if (d.size() < 3 || (d[0] != '<' && d[0] != '|' && d[0] != '='))
    bad(what, fmt::format("unsupported dtype '{}' (little-endian numeric arrays only)", d));
  Descr r;
  r.kind = d[1];
  try {
    r.bytes = std::stoi(d.substr(2));
  } catch (...) {
    bad(what, fmt::format("unsupported dtype '{}'", d));
  }
  if (std::string("fiubV").find(r.kind) == std::string::npos || r.bytes < 1 || r.bytes > 8)
    bad(what, fmt::format("unsupported dtype '{}'", d));
  return r;
}

}  // namespace

NpyArray parse_npy(const std::vector<uint8_t>& b, const std::string& what) {
  if (b.size() < 10 || std::memcmp(b.data(), "\x93NUMPY", 6) != 0) bad(what, "not an .npy file (bad magic)");
  const int major = b[6];
  size_t hlen, hstart;
  if (major == 1) {
    hlen = u16(&b[8]);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) bad(what, "truncated .npy header");
    hlen = u32(&b[8]);
    hstart = 12;
  } else {
    bad(what, fmt::format("unsupported .npy version {}", major));
  }
  if (hstart + hlen > b.size()) bad(what, "truncated .npy header");
  const std::string h(reinterpret_cast<const char*>(&b[hstart]), hlen);
  NpyArray a;
  a.descr = header_field(h, "descr", what);
  if (header_field(h, "fortran_order", what).find("True") != std::string::npos)
    bad(what, "Fortran-ordered arrays are not supported (use np.ascontiguousarray)");
  const std::string shape = header_field(h, "shape", what);
  size_t p = 0;
  int64_t n = 1;
  while (p < shape.size()) {
    while (p < shape.size() && (shape[p] == ' ' || shape[p] == ',')) ++p;
    if (p >= shape.size()) break;
    size_t e = p;
    while (e < shape.size() && isdigit(static_cast<unsigned char>(shape[e]))) ++e;
    if (e == p || e - p > 15) bad(what, fmt::format("bad shape '({})'", shape));
    const int64_t d = std::stoll(shape.substr(p, e - p));
    a.shape.push_back(d);
    if (d > 0 && n > (int64_t{1} << 40) / d) bad(what, "array too large");
    n *= d;
    p = e;
  }
  const Descr ds = parse_descr(a.descr, what);
  const size_t need = static_cast<size_t>(n) * static_cast<size_t>(ds.bytes);
  const size_t off = hstart + hlen;
  if (b.size() - off < need) bad(what, fmt::format("truncated data: {} bytes expected, {} present", need, b.size() - off));
  a.data.assign(b.begin() + static_cast<std::ptrdiff_t>(off), b.begin() + static_cast<std::ptrdiff_t>(off + need));
  return a;
}

NpyArray read_npy(const std::string& path) { return parse_npy(read_file(path), path); }

std::map<std::string, NpyArray> read_npz(const std::string& path) {
  const std::vector<uint8_t> z = read_file(path);
  // Find the end-of-central-directory record (and its zip64 form, which np.savez writes).
  if (z.size() < 22) bad(path, "not a zip file");
  size_t eocd = std::string::npos;
  for (size_t i = z.size() - 22 + 1; i-- > 0 && z.size() - i <= 22 + 65535;)
    if (u32(&z[i]) == 0x06054b50) {
      eocd = i;
      break;
    }
  if (eocd == std::string::npos) bad(path, "not a zip file (no end of central directory)");
  uint64_t entries = u16(&z[eocd + 10]);
  uint64_t cd_off = u32(&z[eocd + 16]);
  if ((cd_off == 0xFFFFFFFF || entries == 0xFFFF) && eocd >= 20 && u32(&z[eocd - 20]) == 0x07064b50) {
    const uint64_t z64 = u64(&z[eocd - 20 + 8]);
    if (z64 + 56 > z.size() || u32(&z[z64]) != 0x06064b50) bad(path, "bad zip64 directory");
    entries = u64(&z[z64 + 32]);
    cd_off = u64(&z[z64 + 48]);
  }
  std::map<std::string, NpyArray> out;
  size_t p = cd_off;
  for (uint64_t e = 0; e < entries; ++e) {
    if (p + 46 > z.size() || u32(&z[p]) != 0x02014b50) bad(path, "bad zip central directory");
    const uint32_t method = u16(&z[p + 10]);
    uint64_t csize = u32(&z[p + 20]), usize = u32(&z[p + 24]);
    const uint32_t nlen = u16(&z[p + 28]), xlen = u16(&z[p + 30]), clen = u16(&z[p + 32]);
    uint64_t loc = u32(&z[p + 42]);
    if (p + 46 + nlen + xlen > z.size()) bad(path, "bad zip central directory");
    const std::string name(reinterpret_cast<const char*>(&z[p + 46]), nlen);
    // zip64 extra field: the 0xFFFFFFFF fields follow in order usize, csize, offset.
    for (size_t x = p + 46 + nlen; x + 4 <= p + 46 + nlen + xlen;) {
      const uint32_t id = u16(&z[x]), sz = u16(&z[x + 2]);
      if (id == 1) {
        size_t q = x + 4;
        if (usize == 0xFFFFFFFF && q + 8 <= x + 4 + sz) usize = u64(&z[q]), q += 8;
        if (csize == 0xFFFFFFFF && q + 8 <= x + 4 + sz) csize = u64(&z[q]), q += 8;
        if (loc == 0xFFFFFFFF && q + 8 <= x + 4 + sz) loc = u64(&z[q]);
      }
      x += 4 + sz;
    }
    if (method != 0)
      bad(path, fmt::format("member '{}' is compressed; save inputs with np.savez (not savez_compressed)", name));
    if (loc + 30 > z.size() || u32(&z[loc]) != 0x04034b50) bad(path, "bad zip local header");
    const uint64_t data = loc + 30 + u16(&z[loc + 26]) + u16(&z[loc + 28]);
    if (data + csize > z.size() || csize != usize) bad(path, "truncated zip member");
    std::string key = name;
    if (key.size() > 4 && key.substr(key.size() - 4) == ".npy") key.resize(key.size() - 4);
    out[key] = parse_npy(std::vector<uint8_t>(z.begin() + static_cast<std::ptrdiff_t>(data),
                                              z.begin() + static_cast<std::ptrdiff_t>(data + csize)),
                         path + ":" + name);
    p += 46 + nlen + xlen + clen;
  }
  return out;
}

std::vector<uint8_t> to_dtype(const NpyArray& a, DType dt, const std::vector<int64_t>& shape, const std::string& what) {
  if (a.shape != shape) {
    auto str = [](const std::vector<int64_t>& s) {
      std::string r;
      for (size_t i = 0; i < s.size(); ++i) r += fmt::format("{}{}", i ? ", " : "", s[i]);
      return "(" + r + ")";
    };
    bad(what, fmt::format("expected shape {}, found {}", str(shape), str(a.shape)));
  }
  const Descr ds = parse_descr(a.descr, what);
  const int eb = dtype_bytes(dt);
  const size_t n = a.data.size() / static_cast<size_t>(ds.bytes);
  std::vector<uint8_t> out(n * static_cast<size_t>(eb));
  if (ds.kind == 'V') {
    if (ds.bytes != eb) bad(what, fmt::format("raw dtype '{}' does not match {} ({} bytes)", a.descr, dtype_name(dt), eb));
    return a.data;
  }
  if (dtype_is_mx_x4(dt)) {  // no cast path: the packed bits of an unsigned array of the same item size
    if (ds.kind != 'u' || ds.bytes != eb)
      bad(what, fmt::format("an {} tensor takes its packed bits as a {}-byte unsigned (or raw) array, found '{}' (there "
                            "is no cast path to an MX x4 type)", dtype_name(dt), eb, a.descr));
    return a.data;
  }
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* src = &a.data[i * static_cast<size_t>(ds.bytes)];
    uint8_t* dst = &out[i * static_cast<size_t>(eb)];
    if (ds.kind == 'f') {
      float v = 0;
      if (ds.bytes == 4) v = load_f32(DType::kFloat32, src);
      else if (ds.bytes == 2) v = load_f32(DType::kFloat16, src);
      else if (ds.bytes == 8) {
        double d;
        std::memcpy(&d, src, 8);
        v = static_cast<float>(d);
      } else {
        bad(what, fmt::format("unsupported dtype '{}'", a.descr));
      }
      store_f32(dt, dst, v);
    } else {
      int64_t v = 0;
      if (ds.kind == 'b' || ds.kind == 'u') {
        uint64_t u = 0;
        std::memcpy(&u, src, static_cast<size_t>(ds.bytes));
        v = static_cast<int64_t>(u);
      } else {
        std::memcpy(&v, src, static_cast<size_t>(ds.bytes));
        const int shift = 64 - 8 * ds.bytes;
        v = shift ? (v << shift) >> shift : v;
      }
      if (dtype_is_float(dt)) store_f32(dt, dst, static_cast<float>(v));
      else store_int(dt, dst, v);
    }
  }
  return out;
}

void write_npy(const std::string& path, const uint8_t* data, size_t bytes, DType dt, const std::vector<int64_t>& shape,
               bool raw) {
  std::string descr;
  bool widen = false;
  switch (dt) {
    case DType::kFloat32: descr = "<f4"; break;
    case DType::kFloat16: descr = "<f2"; break;
    case DType::kInt8: descr = "|i1"; break;
    case DType::kInt16: descr = "<i2"; break;
    case DType::kInt32: descr = "<i4"; break;
    case DType::kUInt8: descr = "|u1"; break;
    case DType::kUInt16: descr = "<u2"; break;
    case DType::kUInt32: descr = "<u4"; break;
    case DType::kBool: descr = "|b1"; break;
    case DType::kFloat8E5M2X4:  // MX x4: the packed bits (no cast path)
    case DType::kFloat8E4M3FNX4: descr = "<u4"; break;
    case DType::kFloat4E2M1FNX4: descr = "<u2"; break;
    default:
      if (raw) {
        descr = fmt::format("|V{}", dtype_bytes(dt));
      } else {  // bf16, fp8, tf32: widen exactly to float32
        widen = true;
        descr = "<f4";
      }
  }
  std::string sh;
  for (int64_t d : shape) sh += fmt::format("{}, ", d);
  if (shape.size() > 1) sh.resize(sh.size() - 2);
  else if (shape.size() == 1) sh.resize(sh.size() - 1);
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, sh);
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorCode::kCannotWrite, fmt::format("{}: cannot open for writing", path));
  const uint16_t hl = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  const char hlb[2] = {static_cast<char>(hl & 0xff), static_cast<char>(hl >> 8)};
  f.write(hlb, 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  // The body a block at a time (widened, or zeros without data), else straight from `data`.
  const auto eb = static_cast<size_t>(dtype_bytes(dt));
  if (data != nullptr && !widen) {
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  } else {
    constexpr size_t kBlock = 16384;  // elements
    std::vector<uint8_t> block(kBlock * 4);
    const size_t n = bytes / eb, out_eb = widen ? 4 : eb;
    for (size_t i = 0; i < n; i += kBlock) {
      const size_t m = std::min(kBlock, n - i);
      if (data == nullptr) std::fill(block.begin(), block.begin() + static_cast<std::ptrdiff_t>(m * out_eb), uint8_t{0});
      else
        for (size_t j = 0; j < m; ++j) store_f32(DType::kFloat32, &block[j * 4], load_f32(dt, data + (i + j) * eb));
      f.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(m * out_eb));
    }
  }
  if (!f) throw Error(ErrorCode::kCannotWrite, fmt::format("{}: cannot write", path));
}

}  // namespace nsim::frontend

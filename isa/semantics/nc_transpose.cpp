// nc_transpose: data [P, F] (free dims flattened) -> dst [F partitions, P elements]:
// dst[f][p] = data[p][f]. Bit-exact when dtypes are equal, else via fp32. gen2 TensorE is modelled
// literally as an fp32 matmul with an identity moving tile, so NaN/Inf spread along their output
// row as on hardware.
#include <cstring>

#include <fmt/format.h>

#include "isa/semantics/internal.h"

namespace nsim::isa {

namespace {
// row[p] = raw[p][f] for a P x F matrix of T (raw bytes, no alignment assumed).
template <class T>
void column(const uint8_t* raw, int64_t P, int64_t F, int64_t f, uint8_t* row) {
  for (int64_t p = 0; p < P; ++p) {
    T x;
    std::memcpy(&x, raw + (p * F + f) * static_cast<int64_t>(sizeof(T)), sizeof(T));
    std::memcpy(row + p * static_cast<int64_t>(sizeof(T)), &x, sizeof(T));
  }
}
}  // namespace

void exec_kNcTranspose(const Instr& in, const Views& v, ArchState& st) {
  using namespace sem;
  const TileView& dst = v[0];
  const TileView& data = v[1];
  require(in, dst, "dst");
  require(in, data, "data");
  const int64_t P = data.partitions, F = data.elems();
  if (dst.partitions != F || dst.elems() != P)
    fail(ErrorCode::kShapeMismatch, in,
         fmt::format("data is [{}, {}] so dst must be [{}, {}], got [{}, {}]", P, F, F, P, dst.partitions, dst.elems()));
  if (P == 0 || F == 0) return;

  if (st.generation <= 2 && in.engine == Engine::kTensor) {
    using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    RowMat d(static_cast<Eigen::Index>(P), static_cast<Eigen::Index>(F));
    for (int64_t p = 0; p < P; ++p) read_row(data, static_cast<uint32_t>(p), d.data() + p * F);
    const Eigen::MatrixXf eye = Eigen::MatrixXf::Identity(static_cast<Eigen::Index>(P), static_cast<Eigen::Index>(P));
    RowMat r(static_cast<Eigen::Index>(F), static_cast<Eigen::Index>(P));
    r.noalias() = d.transpose() * eye;
    for (int64_t f = 0; f < F; ++f) write_row(dst, static_cast<uint32_t>(f), r.data() + f * P);
    return;
  }

  const int ses = esz(data);
  uint8_t* raw = bscratch(0, P * F * ses);
  for (int64_t p = 0; p < P; ++p) gather_bytes(data, static_cast<uint32_t>(p), raw + p * F * ses);
  if (data.dtype == dst.dtype) {
    uint8_t* row = bscratch(1, P * ses);
    for (int64_t f = 0; f < F; ++f) {
      switch (ses) {  // element copies by width: a memcpy call per element was most of the time
        case 1: column<uint8_t>(raw, P, F, f, row); break;
        case 2: column<uint16_t>(raw, P, F, f, row); break;
        case 4: column<uint32_t>(raw, P, F, f, row); break;
        default:
          for (int64_t p = 0; p < P; ++p)
            std::memcpy(row + p * ses, raw + (p * F + f) * ses, static_cast<size_t>(ses));
      }
      scatter_bytes(dst, static_cast<uint32_t>(f), row);
    }
    return;
  }
  float* row = fscratch(0, P);
  for (int64_t f = 0; f < F; ++f) {
    for (int64_t p = 0; p < P; ++p) row[p] = load_f32(data.dtype, raw + (p * F + f) * ses);
    write_row(dst, static_cast<uint32_t>(f), row);
  }
}

}  // namespace nsim::isa

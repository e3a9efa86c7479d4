// MACE's coupling tables from the nonzeros of M. See
// include/crucible/models/mace/sparse_coupling.h.

#include "crucible/models/mace/sparse_coupling.h"
#include "../../simd_clones.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace crucible::mace {
namespace {

/// Edges side by side in the loops: one AVX-512 float32 vector.
constexpr int64_t kLanes = 16;

/// The next block's rows of Y (gY): the edges of a chunk are in pair
/// order, so their rows are scattered over Y, and the loads of a block
/// otherwise wait on the memory one by one (38 % of the loop's samples in
/// perf without this, 2048 Cu atoms).
template <class T>
CRUCIBLE_INLINE_IN_CLONES void prefetch_rows(const T* rows, const int64_t* edges, int64_t e0, int64_t Ec,
                                             int64_t Dsh) {
  const int64_t e1 = std::min(e0 + kLanes, Ec);
  for (int64_t e = e0; e < e1; ++e) {
    const char* p = reinterpret_cast<const char*>(rows + edges[e] * Dsh);
    for (int64_t byte = 0; byte < Dsh * static_cast<int64_t>(sizeof(T)); byte += 64) __builtin_prefetch(p + byte);
  }
}

/// Y's rows of 16 edges, transposed ([Dsh][16]); each column of T is then
/// a sum of a few of those 16-wide rows; the tile is transposed back.
template <class T>
CRUCIBLE_INLINE_IN_CLONES void tables_loop(const int64_t* start, const int64_t* row, const T* value, int64_t cols,
                                      int64_t Dsh, const T* Y, const int64_t* edges, int64_t Ec, T* out, T* yt,
                                      T* tt) {
  for (int64_t e0 = 0; e0 < Ec; e0 += kLanes) {
    const int64_t nb = std::min(kLanes, Ec - e0);
    prefetch_rows(Y, edges, e0 + kLanes, Ec, Dsh);
    for (int64_t b = 0; b < kLanes; ++b) {
      const T* y = b < nb ? Y + edges[e0 + b] * Dsh : nullptr;
      for (int64_t k = 0; k < Dsh; ++k) yt[k * kLanes + b] = y ? y[k] : T(0);
    }
    for (int64_t j = 0; j < cols; ++j) {
      T* acc = tt + j * kLanes;
#pragma omp simd
      for (int64_t b = 0; b < kLanes; ++b) acc[b] = T(0);
      for (int64_t n = start[j]; n < start[j + 1]; ++n) {
        const T v = value[n];
        const T* yk = yt + row[n] * kLanes;
#pragma omp simd
        for (int64_t b = 0; b < kLanes; ++b) acc[b] += v * yk[b];
      }
    }
    for (int64_t b = 0; b < nb; ++b) {
      T* o = out + (e0 + b) * cols;
      for (int64_t j = 0; j < cols; ++j) o[j] = tt[j * kLanes + b];
    }
  }
}

template <class T>
CRUCIBLE_INLINE_IN_CLONES void tables_backward_loop(const int64_t* start, const int64_t* row, const T* value,
                                               int64_t cols, int64_t Dsh, const T* gT, const int64_t* edges,
                                               int64_t Ec, T* gY, T* gyt, T* gtt) {
  for (int64_t e0 = 0; e0 < Ec; e0 += kLanes) {
    const int64_t nb = std::min(kLanes, Ec - e0);
    prefetch_rows(gY, edges, e0 + kLanes, Ec, Dsh);
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t b = 0; b < kLanes; ++b) gtt[j * kLanes + b] = b < nb ? gT[(e0 + b) * cols + j] : T(0);
    std::fill(gyt, gyt + Dsh * kLanes, T(0));
    for (int64_t j = 0; j < cols; ++j) {
      const T* g = gtt + j * kLanes;
      for (int64_t n = start[j]; n < start[j + 1]; ++n) {
        const T v = value[n];
        T* acc = gyt + row[n] * kLanes;
#pragma omp simd
        for (int64_t b = 0; b < kLanes; ++b) acc[b] += v * g[b];
      }
    }
    for (int64_t b = 0; b < nb; ++b) {
      T* y = gY + edges[e0 + b] * Dsh;
      for (int64_t k = 0; k < Dsh; ++k) y[k] += gyt[k * kLanes + b];
    }
  }
}

// One ISA-cloned entry per loop and dtype (GCC clones plain functions; the
// templates above are inlined into each clone).
#define CRUCIBLE_SPARSE_COUPLING_ENTRY(name, loop, T)                                                        \
  CRUCIBLE_SIMD_CLONES void name(const int64_t* start, const int64_t* row, const T* value, int64_t cols,        \
                                 int64_t Dsh, const T* in, const int64_t* edges, int64_t Ec, T* out, T* t1, T* t2) { \
    loop<T>(start, row, value, cols, Dsh, in, edges, Ec, out, t1, t2);                                           \
  }
CRUCIBLE_SPARSE_COUPLING_ENTRY(tables_f32, tables_loop, float)
CRUCIBLE_SPARSE_COUPLING_ENTRY(tables_f64, tables_loop, double)
CRUCIBLE_SPARSE_COUPLING_ENTRY(tables_backward_f32, tables_backward_loop, float)
CRUCIBLE_SPARSE_COUPLING_ENTRY(tables_backward_f64, tables_backward_loop, double)
#undef CRUCIBLE_SPARSE_COUPLING_ENTRY

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("SparseCoupling: " + what);
}

void check_pair(const at::Tensor& rows, const at::Tensor& edges, const at::Tensor& per_edge, int64_t Dsh,
                int64_t cols) {
  check(rows.defined() && per_edge.defined() && edges.defined(), "undefined tensor");
  check(rows.device().is_cpu() && per_edge.device().is_cpu() && edges.device().is_cpu(), "CPU tensors expected");
  check(rows.scalar_type() == per_edge.scalar_type() &&
            (rows.scalar_type() == at::kFloat || rows.scalar_type() == at::kDouble),
        "Y (gY) and T (gT) must share float32 or float64");
  check(edges.scalar_type() == at::kLong && edges.dim() == 1, "edges must be [Ec] int64");
  check(rows.dim() == 2 && rows.size(1) == Dsh, "Y (gY) must be [E, " + std::to_string(Dsh) + "]");
  check(per_edge.dim() == 2 && per_edge.size(0) == edges.size(0) && per_edge.size(1) == cols,
        "T (gT) must be [Ec, " + std::to_string(cols) + "]");
  check(rows.is_contiguous() && per_edge.is_contiguous() && edges.is_contiguous(), "contiguous tensors expected");
}

}  // namespace

SparseCoupling::SparseCoupling(const at::Tensor& M) {
  check(M.defined() && M.dim() == 2 && at::isFloatingType(M.scalar_type()), "M must be a 2-D floating tensor");
  const at::Tensor m = M.to(at::kCPU, at::kDouble).contiguous();
  harmonics_ = m.size(0);
  cols_ = m.size(1);
  const double* p = m.data_ptr<double>();
  start_.push_back(0);
  for (int64_t j = 0; j < cols_; ++j) {
    for (int64_t k = 0; k < harmonics_; ++k) {
      const double v = p[k * cols_ + j];
      if (v == 0.0) continue;
      row_.push_back(k);
      value_d_.push_back(v);
      value_f_.push_back(static_cast<float>(v));
    }
    start_.push_back(static_cast<int64_t>(row_.size()));
  }
}

void SparseCoupling::tables(const at::Tensor& Y, const at::Tensor& edges, at::Tensor& T) const {
  check_pair(Y, edges, T, harmonics_, cols_);
  std::vector<double> tiles(static_cast<size_t>((harmonics_ + cols_) * kLanes));  // room for float64
  if (Y.scalar_type() == at::kFloat) {
    auto* t = reinterpret_cast<float*>(tiles.data());
    tables_f32(start_.data(), row_.data(), value_f_.data(), cols_, harmonics_, Y.data_ptr<float>(),
                       edges.data_ptr<int64_t>(), edges.size(0), T.data_ptr<float>(), t, t + harmonics_ * kLanes);
  } else {
    double* t = tiles.data();
    tables_f64(start_.data(), row_.data(), value_d_.data(), cols_, harmonics_, Y.data_ptr<double>(),
                        edges.data_ptr<int64_t>(), edges.size(0), T.data_ptr<double>(), t, t + harmonics_ * kLanes);
  }
}

void SparseCoupling::tables_backward(const at::Tensor& gT, const at::Tensor& edges, at::Tensor& gY) const {
  check_pair(gY, edges, gT, harmonics_, cols_);
  std::vector<double> tiles(static_cast<size_t>((harmonics_ + cols_) * kLanes));
  if (gY.scalar_type() == at::kFloat) {
    auto* t = reinterpret_cast<float*>(tiles.data());
    tables_backward_f32(start_.data(), row_.data(), value_f_.data(), cols_, harmonics_, gT.data_ptr<float>(),
                                edges.data_ptr<int64_t>(), edges.size(0), gY.data_ptr<float>(), t,
                                t + harmonics_ * kLanes);
  } else {
    double* t = tiles.data();
    tables_backward_f64(start_.data(), row_.data(), value_d_.data(), cols_, harmonics_,
                                 gT.data_ptr<double>(), edges.data_ptr<int64_t>(), edges.size(0),
                                 gY.data_ptr<double>(), t, t + harmonics_ * kLanes);
  }
}

}  // namespace crucible::mace

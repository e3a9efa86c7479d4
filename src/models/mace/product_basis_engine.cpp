// The inference engine's product basis: see
// include/crucible/models/mace/product_basis_engine.h.

#include "crucible/models/mace/product_basis_engine.h"
#include "../../simd_clones.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

namespace crucible::mace {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

/// Channels per block: a node's monomials for one block (494 × 32 numbers
/// at l ≤ 3, ν ≤ 3: 63 KB in float32) stay in the core's L2 cache, and
/// every inner loop is 32 lanes (two AVX-512 float32 vectors; 16 lanes
/// measured 12 % slower in the product basis, AMD EPYC, 32 channels).
constexpr int64_t kBlock = 32;

/// The plan in the compute dtype with the weights' offsets resolved: what
/// the node loops read.
template <class T>
struct Flat {
  int max_nu = 0;
  std::vector<int64_t> mono_offset;  ///< per ν: first row of M_ν in a node's monomial buffer.
  int64_t mono_rows = 0;
  const ProductBasisPlan* plan = nullptr;
  std::vector<std::vector<T>> value;         ///< per ν: P_ν's nonzeros in T.
  std::vector<std::vector<int64_t>> w_base;  ///< per ν, row: offset of W[z = 0, k, 0] in its w_of data.
  std::vector<std::vector<int64_t>> w_zstride;  ///< per ν, row: K · C_padded.
  std::vector<T> packed;  ///< the weights with C padded to a block, when C is not a multiple of one.
  std::vector<const T*> w_of;  ///< per row of every degree in turn: the weights' data (packed or the tensor's).
  std::vector<size_t> first_row;  ///< per ν: the index of its first row in w_of.
};

int64_t padded(int64_t C) { return (C + kBlock - 1) / kBlock * kBlock; }

template <class T>
Flat<T> flatten(const ProductBasisPlan& plan, const std::vector<std::vector<at::Tensor>>& weights, int64_t C) {
  Flat<T> f;
  f.plan = &plan;
  f.max_nu = plan.max_nu;
  for (int v = 0; v < plan.max_nu; ++v) {
    f.mono_offset.push_back(f.mono_rows);
    f.mono_rows += plan.num_mono[static_cast<size_t>(v)];
  }
  const int64_t Cp = padded(C);
  const bool pack = Cp != C;
  // Offsets of every (o, ν) weight block in the packed buffer.
  std::vector<std::vector<int64_t>> block_offset(weights.size());
  if (pack) {
    int64_t total = 0;
    for (size_t o = 0; o < weights.size(); ++o) {
      for (const auto& W : weights[o]) {
        block_offset[o].push_back(total);
        if (W.defined()) total += W.size(0) * W.size(1) * Cp;
      }
    }
    f.packed.assign(static_cast<size_t>(total), T(0));
    for (size_t o = 0; o < weights.size(); ++o) {
      for (size_t v = 0; v < weights[o].size(); ++v) {
        const at::Tensor& W = weights[o][v];
        if (!W.defined()) continue;
        const at::Tensor Wc = W.contiguous();
        const T* src = Wc.data_ptr<T>();
        const int64_t rows = W.size(0) * W.size(1);
        for (int64_t r = 0; r < rows; ++r) {
          std::memcpy(f.packed.data() + block_offset[o][v] + r * Cp, src + r * C, sizeof(T) * static_cast<size_t>(C));
        }
      }
    }
  }
  f.value.resize(static_cast<size_t>(plan.max_nu));
  f.w_base.resize(static_cast<size_t>(plan.max_nu));
  f.w_zstride.resize(static_cast<size_t>(plan.max_nu));
  std::vector<std::vector<const T*>> data(static_cast<size_t>(plan.max_nu));
  for (int v = 0; v < plan.max_nu; ++v) {
    const auto& deg = plan.degrees[static_cast<size_t>(v)];
    const size_t vs = static_cast<size_t>(v);
    f.value[vs].assign(deg.value.begin(), deg.value.end());
    for (size_t r = 0; r < deg.out_row.size(); ++r) {
      const size_t o = static_cast<size_t>(deg.out_irrep[r]);
      const at::Tensor& W = weights[o][vs];
      const int64_t K = W.size(1);
      f.w_zstride[vs].push_back(K * Cp);
      f.w_base[vs].push_back((pack ? block_offset[o][vs] : 0) + deg.basis[r] * Cp);
      data[vs].push_back(pack ? f.packed.data() : W.data_ptr<T>());
    }
  }
  for (auto& d : data) {
    f.first_row.push_back(f.w_of.size());
    f.w_of.insert(f.w_of.end(), d.begin(), d.end());
  }
  return f;
}

/// Loads rows [rows] × [c0, c0 + w) of a [*, C] node slab into a [rows, kBlock]
/// buffer, zero beyond w.
template <class T>
CRUCIBLE_INLINE_IN_CLONES void load_block(const T* src, int64_t rows, int64_t C, int64_t c0, int64_t w, T* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < w; ++c) dst[r * kBlock + c] = src[r * C + c0 + c];
    for (int64_t c = w; c < kBlock; ++c) dst[r * kBlock + c] = T(0);
  }
}

/// M_ν of one node and channel block into mono (degrees below `upto`).
template <class T>
CRUCIBLE_INLINE_IN_CLONES void monomials(const Flat<T>& f, const T* __restrict xl, T* __restrict mono, int upto) {
  const ProductBasisPlan& plan = *f.plan;
  for (size_t m = 0; m < plan.first.size(); ++m) {
    const T* __restrict src = xl + plan.first[m] * kBlock;
    T* __restrict dst = mono + static_cast<int64_t>(m) * kBlock;
    #pragma omp simd
    for (int64_t c = 0; c < kBlock; ++c) dst[c] = src[c];
  }
  for (int v = 1; v < upto; ++v) {
    const size_t vs = static_cast<size_t>(v);
    const T* __restrict prev = mono + f.mono_offset[vs - 1] * kBlock;
    T* __restrict cur = mono + f.mono_offset[vs] * kBlock;
    const int32_t* par = plan.parent[vs].data();
    const int32_t* last = plan.last[vs].data();
    for (int64_t m = 0; m < plan.num_mono[vs]; ++m) {
      const T* __restrict a = prev + par[m] * kBlock;
      const T* __restrict b = xl + last[m] * kBlock;
      T* __restrict d = cur + m * kBlock;
      #pragma omp simd
      for (int64_t c = 0; c < kBlock; ++c) d[c] = a[c] * b[c];
    }
  }
}

/// The weight row of row r of degree vs + 1 for element z, channel block c0.
template <class T>
CRUCIBLE_INLINE_IN_CLONES const T* weight_row(const Flat<T>& f, size_t vs, size_t r, int64_t z, int64_t c0) {
  return f.w_of[f.first_row[vs] + r] + f.w_base[vs][r] + z * f.w_zstride[vs][r] + c0;
}

template <class T>
CRUCIBLE_INLINE_IN_CLONES void forward_nodes(const Flat<T>& f, const T* x, const int64_t* elem, T* y, int64_t n0,
                                             int64_t n1, int64_t D, int64_t C, int64_t O) {
  const ProductBasisPlan& plan = *f.plan;
  std::vector<T> xl(static_cast<size_t>(D * kBlock)), mono(static_cast<size_t>(f.mono_rows * kBlock)),
      yl(static_cast<size_t>(O * kBlock));
  T b[kBlock];
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t z = elem[n];
    for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
      const int64_t w = std::min(kBlock, C - c0);
      load_block(x + n * D * C, D, C, c0, w, xl.data());
      monomials(f, xl.data(), mono.data(), f.max_nu);
      std::fill(yl.begin(), yl.end(), T(0));
      for (int v = 0; v < f.max_nu; ++v) {
        const size_t vs = static_cast<size_t>(v);
        const auto& deg = plan.degrees[vs];
        const T* __restrict mv = mono.data() + f.mono_offset[vs] * kBlock;
        const T* val = f.value[vs].data();
        for (size_t r = 0; r + 1 < deg.row_first.size(); ++r) {
          #pragma omp simd
          for (int64_t c = 0; c < kBlock; ++c) b[c] = T(0);
          for (int64_t q = deg.row_first[r]; q < deg.row_first[r + 1]; ++q) {
            const T a = val[q];
            const T* __restrict mr = mv + deg.column[static_cast<size_t>(q)] * kBlock;
            #pragma omp simd
            for (int64_t c = 0; c < kBlock; ++c) b[c] += a * mr[c];
          }
          const T* __restrict wr = weight_row(f, vs, r, z, c0);
          T* __restrict yr = yl.data() + deg.out_row[r] * kBlock;
          #pragma omp simd
          for (int64_t c = 0; c < kBlock; ++c) yr[c] += b[c] * wr[c];
        }
      }
      T* out = y + n * O * C;
      for (int64_t i = 0; i < O; ++i)
        for (int64_t c = 0; c < w; ++c) out[i * C + c0 + c] = yl[static_cast<size_t>(i * kBlock + c)];
    }
  }
}

template <class T>
CRUCIBLE_INLINE_IN_CLONES void vjp_nodes(const Flat<T>& f, const T* x, const int64_t* elem, const T* gy, T* gx,
                                         int64_t n0, int64_t n1, int64_t D, int64_t C, int64_t O) {
  const ProductBasisPlan& plan = *f.plan;
  std::vector<T> xl(static_cast<size_t>(D * kBlock)), gxl(static_cast<size_t>(D * kBlock)),
      gyl(static_cast<size_t>(O * kBlock)), mono(static_cast<size_t>(f.mono_rows * kBlock)),
      gmono(static_cast<size_t>(f.mono_rows * kBlock));
  T gb[kBlock];
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t z = elem[n];
    for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
      const int64_t w = std::min(kBlock, C - c0);
      load_block(x + n * D * C, D, C, c0, w, xl.data());
      load_block(gy + n * O * C, O, C, c0, w, gyl.data());
      monomials(f, xl.data(), mono.data(), f.max_nu - 1);  // the top degree's are never read
      std::fill(gmono.begin(), gmono.end(), T(0));
      std::fill(gxl.begin(), gxl.end(), T(0));
      for (int v = f.max_nu - 1; v >= 0; --v) {
        const size_t vs = static_cast<size_t>(v);
        const auto& deg = plan.degrees[vs];
        T* __restrict g = gmono.data() + f.mono_offset[vs] * kBlock;
        const T* val = f.value[vs].data();
        // gM_ν += P_νᵀ (gy ⊙ W), row by row of P_ν.
        for (size_t r = 0; r + 1 < deg.row_first.size(); ++r) {
          const T* __restrict wr = weight_row(f, vs, r, z, c0);
          const T* __restrict gr = gyl.data() + deg.out_row[r] * kBlock;
          #pragma omp simd
          for (int64_t c = 0; c < kBlock; ++c) gb[c] = gr[c] * wr[c];
          for (int64_t q = deg.row_first[r]; q < deg.row_first[r + 1]; ++q) {
            const T a = val[q];
            T* __restrict gm = g + deg.column[static_cast<size_t>(q)] * kBlock;
            #pragma omp simd
            for (int64_t c = 0; c < kBlock; ++c) gm[c] += a * gb[c];
          }
        }
        if (v == 0) {
          for (size_t m = 0; m < plan.first.size(); ++m) {
            T* __restrict d = gxl.data() + plan.first[m] * kBlock;
            const T* __restrict s = g + static_cast<int64_t>(m) * kBlock;
            #pragma omp simd
            for (int64_t c = 0; c < kBlock; ++c) d[c] += s[c];
          }
          continue;
        }
        // Down the tree: M_ν[m] = M_{ν-1}[p] ⊙ x[q].
        T* __restrict gp = gmono.data() + f.mono_offset[vs - 1] * kBlock;
        const T* __restrict prev = mono.data() + f.mono_offset[vs - 1] * kBlock;
        const int32_t* par = plan.parent[vs].data();
        const int32_t* last = plan.last[vs].data();
        // Monomials sharing a parent come in runs (M_{ν-1}[p] · x[q] for
        // q ≥ p's last factor): their ∂/∂ of the parent is summed in `run`
        // and stored once per run. Read-modify-writes of one parent row in
        // successive iterations were a store-to-load chain, most of this
        // loop's time in perf (AMD EPYC with avx512_bf16, 128 channels).
        T run[kBlock];
        for (int64_t m0 = 0, M = plan.num_mono[vs]; m0 < M;) {
          const int32_t p = par[m0];
          const T* __restrict pm = prev + p * kBlock;
          #pragma omp simd
          for (int64_t c = 0; c < kBlock; ++c) run[c] = T(0);
          int64_t m = m0;
          for (; m < M && par[m] == p; ++m) {
            const T* __restrict gm = g + m * kBlock;
            const T* __restrict xq = xl.data() + last[m] * kBlock;
            T* __restrict gxq = gxl.data() + last[m] * kBlock;
            #pragma omp simd
            for (int64_t c = 0; c < kBlock; ++c) {
              run[c] += gm[c] * xq[c];
              gxq[c] += gm[c] * pm[c];
            }
          }
          T* __restrict gpm = gp + p * kBlock;
          #pragma omp simd
          for (int64_t c = 0; c < kBlock; ++c) gpm[c] += run[c];
          m0 = m;
        }
      }
      T* out = gx + n * D * C;
      for (int64_t i = 0; i < D; ++i)
        for (int64_t c = 0; c < w; ++c) out[i * C + c0 + c] = gxl[static_cast<size_t>(i * kBlock + c)];
    }
  }
}

#define CRUCIBLE_PRODUCT_BASIS_INSTANCE(T, NAME)                                                               \
  CRUCIBLE_SIMD_CLONES void forward_##NAME(const Flat<T>& f, const T* x, const int64_t* elem, T* y, int64_t n0, \
                                           int64_t n1, int64_t D, int64_t C, int64_t O) {                     \
    forward_nodes<T>(f, x, elem, y, n0, n1, D, C, O);                                                         \
  }                                                                                                           \
  CRUCIBLE_SIMD_CLONES void vjp_##NAME(const Flat<T>& f, const T* x, const int64_t* elem, const T* gy, T* gx,   \
                                       int64_t n0, int64_t n1, int64_t D, int64_t C, int64_t O) {             \
    vjp_nodes<T>(f, x, elem, gy, gx, n0, n1, D, C, O);                                                        \
  }                                                                                                           \
  inline void forward_any(const Flat<T>& f, const T* x, const int64_t* elem, T* y, int64_t n0, int64_t n1,    \
                          int64_t D, int64_t C, int64_t O) {                                                  \
    forward_##NAME(f, x, elem, y, n0, n1, D, C, O);                                                           \
  }                                                                                                           \
  inline void vjp_any(const Flat<T>& f, const T* x, const int64_t* elem, const T* gy, T* gx, int64_t n0,       \
                      int64_t n1, int64_t D, int64_t C, int64_t O) {                                          \
    vjp_##NAME(f, x, elem, gy, gx, n0, n1, D, C, O);                                                          \
  }
CRUCIBLE_PRODUCT_BASIS_INSTANCE(float, f)
CRUCIBLE_PRODUCT_BASIS_INSTANCE(double, d)
#undef CRUCIBLE_PRODUCT_BASIS_INSTANCE

/// Nodes per parallel task: enough work (≥ 2 MFLOP at 32 channels) that
/// the task overhead is negligible.
constexpr int64_t kNodesPerTask = 16;

void check_inputs(const at::Tensor& A, const at::Tensor& elem, const std::vector<std::vector<at::Tensor>>& weights,
                  const ProductBasisPlan& plan) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("product_basis_engine: " + what); };
  if (!A.device().is_cpu() || (A.scalar_type() != at::kFloat && A.scalar_type() != at::kDouble) || A.dim() != 3) {
    fail("expected A [N, D, C] float32 or float64 on the CPU");
  }
  if (A.size(1) < plan.D) fail("A has " + std::to_string(A.size(1)) + " components, the plan reads " + std::to_string(plan.D));
  if (elem.dim() != 1 || elem.size(0) != A.size(0) || elem.scalar_type() != at::kLong || !elem.device().is_cpu()) {
    fail("expected elem [N] int64 on the CPU");
  }
  for (int v = 0; v < plan.max_nu; ++v) {
    for (int32_t o : plan.degrees[static_cast<size_t>(v)].out_irrep) {
      const size_t os = static_cast<size_t>(o);
      if (os >= weights.size() || weights[os].size() <= static_cast<size_t>(v) ||
          !weights[os][static_cast<size_t>(v)].defined()) {
        fail("no weights for output " + std::to_string(o) + " at degree " + std::to_string(v + 1));
      }
      const at::Tensor& W = weights[os][static_cast<size_t>(v)];
      if (W.dim() != 3 || W.size(2) != A.size(2) || W.scalar_type() != A.scalar_type() || !W.is_contiguous()) {
        fail("weights must be contiguous [Z, K, C] in A's dtype");
      }
    }
  }
  if (elem.numel() > 0) {
    const int64_t lo = elem.min().item<int64_t>(), hi = elem.max().item<int64_t>();
    for (const auto& per : weights)
      for (const auto& W : per)
        if (W.defined() && (lo < 0 || hi >= W.size(0))) fail("element index out of the weights' rows");
  }
}

struct PlanHolder : torch::CustomClassHolder {
  std::shared_ptr<const ProductBasisPlan> plan;
  std::vector<std::vector<at::Tensor>> weights;
  at::Tensor elem;
};

struct ProductBasisEngine : public Function<ProductBasisEngine> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& A, c10::intrusive_ptr<PlanHolder> holder) {
    ctx->save_for_backward({A});
    ctx->saved_data["holder"] = c10::IValue::make_capsule(holder);
    const ProductBasisPlan& plan = *holder->plan;
    const at::Tensor x = A.detach().contiguous();
    const int64_t N = x.size(0), D = x.size(1), C = x.size(2), O = plan.out_rows;
    at::Tensor y = at::empty({N, O, C}, x.options());
    const int64_t* el = holder->elem.data_ptr<int64_t>();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "product_basis_engine", [&] {
      const Flat<scalar_t> f = flatten<scalar_t>(plan, holder->weights, C);
      const scalar_t* xp = x.data_ptr<scalar_t>();
      scalar_t* yp = y.data_ptr<scalar_t>();
      at::parallel_for(0, N, kNodesPerTask,
                       [&](int64_t n0, int64_t n1) { forward_any(f, xp, el, yp, n0, n1, D, C, O); });
    });
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) {
      throw std::runtime_error("inference path: no differentiable backward (create_graph); use ComputeOptions::training");
    }
    const at::Tensor A = ctx->get_saved_variables()[0];
    auto holder = c10::static_intrusive_pointer_cast<PlanHolder>(ctx->saved_data["holder"].toCapsule());
    return {product_basis_engine_vjp(A, holder->elem, holder->weights, *holder->plan, grads[0]), at::Tensor()};
  }
};

}  // namespace

ProductBasisPlan product_basis_plan(const MonomialTable& table) {
  if (table.max_nu < 1 || table.monomials.empty()) throw std::invalid_argument("product_basis_plan: empty table");
  ProductBasisPlan plan;
  plan.max_nu = table.max_nu;
  const at::Tensor m1 = table.monomials[0].to(at::kLong).contiguous();
  for (int64_t m = 0; m < m1.size(0); ++m) {
    plan.first.push_back(static_cast<int32_t>(m1[m][0].item<int64_t>()));
    plan.D = std::max<int64_t>(plan.D, plan.first.back() + 1);
  }
  plan.parent.resize(static_cast<size_t>(table.max_nu));
  plan.last.resize(static_cast<size_t>(table.max_nu));
  plan.degrees.resize(static_cast<size_t>(table.max_nu));
  for (int64_t o : table.out_dims[0]) plan.out_rows += o;
  for (int v = 0; v < table.max_nu; ++v) {
    const size_t vs = static_cast<size_t>(v);
    plan.num_mono.push_back(table.monomials[vs].size(0));
    if (v >= 1) {
      const at::Tensor par = table.parents[vs].to(at::kLong).contiguous();
      const int64_t* p = par.data_ptr<int64_t>();
      for (int64_t m = 0; m < par.size(0); ++m) {
        plan.parent[vs].push_back(static_cast<int32_t>(p[2 * m]));
        plan.last[vs].push_back(static_cast<int32_t>(p[2 * m + 1]));
      }
    }
    auto& deg = plan.degrees[vs];
    deg.row_first.push_back(0);
    int64_t out_offset = 0;
    for (size_t o = 0; o < table.coefficients[vs].size(); ++o) {
      const int64_t O = table.out_dims[vs][o], K = table.num_basis[vs][o];
      const at::Tensor& P = table.coefficients[vs][o];
      if (K > 0 && P.defined()) {
        const at::Tensor Pd = P.to(at::kDouble).contiguous();  // [O·K, M_ν], row i·K + k
        const double* pp = Pd.data_ptr<double>();
        const int64_t M = Pd.size(1);
        for (int64_t i = 0; i < O; ++i) {
          for (int64_t k = 0; k < K; ++k) {
            const double* row = pp + (i * K + k) * M;
            int64_t count = 0;
            for (int64_t m = 0; m < M; ++m) {
              if (row[m] == 0.0) continue;
              deg.column.push_back(static_cast<int32_t>(m));
              deg.value.push_back(row[m]);
              ++count;
            }
            if (count == 0) continue;  // an unused basis function adds nothing
            deg.row_first.push_back(static_cast<int64_t>(deg.column.size()));
            deg.out_row.push_back(static_cast<int32_t>(out_offset + i));
            deg.out_irrep.push_back(static_cast<int32_t>(o));
            deg.basis.push_back(static_cast<int32_t>(k));
          }
        }
      }
      out_offset += O;
    }
  }
  return plan;
}

at::Tensor product_basis_engine(const at::Tensor& A, const at::Tensor& elem,
                                const std::vector<std::vector<at::Tensor>>& weights,
                                std::shared_ptr<const ProductBasisPlan> plan) {
  check_inputs(A, elem, weights, *plan);
  auto holder = c10::make_intrusive<PlanHolder>();
  holder->plan = std::move(plan);
  for (const auto& per : weights) {
    holder->weights.emplace_back();
    for (const auto& W : per) holder->weights.back().push_back(W.defined() ? W.detach() : W);
  }
  holder->elem = elem.contiguous();
  return ProductBasisEngine::apply(A, holder);
}

at::Tensor product_basis_engine_vjp(const at::Tensor& A, const at::Tensor& elem,
                                    const std::vector<std::vector<at::Tensor>>& weights, const ProductBasisPlan& plan,
                                    const at::Tensor& gy) {
  check_inputs(A, elem, weights, plan);
  const at::Tensor x = A.detach().contiguous();
  const int64_t N = x.size(0), D = x.size(1), C = x.size(2), O = plan.out_rows;
  if (gy.dim() != 3 || gy.size(0) != N || gy.size(1) != O || gy.size(2) != C) {
    std::ostringstream msg;
    msg << "product_basis_engine_vjp: expected gy [" << N << ", " << O << ", " << C << "], got " << gy.sizes();
    throw std::invalid_argument(msg.str());
  }
  const at::Tensor g = gy.detach().to(x.scalar_type()).contiguous();
  const at::Tensor el = elem.contiguous();
  at::Tensor gx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "product_basis_engine_vjp", [&] {
    std::vector<std::vector<at::Tensor>> w;
    for (const auto& per : weights) {
      w.emplace_back();
      for (const auto& W : per) w.back().push_back(W.defined() ? W.detach() : W);
    }
    const Flat<scalar_t> f = flatten<scalar_t>(plan, w, C);
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* gp = g.data_ptr<scalar_t>();
    scalar_t* op = gx.data_ptr<scalar_t>();
    const int64_t* ep = el.data_ptr<int64_t>();
    at::parallel_for(0, N, kNodesPerTask,
                     [&](int64_t n0, int64_t n1) { vjp_any(f, xp, ep, gp, op, n0, n1, D, C, O); });
  });
  return gx;
}

}  // namespace crucible::mace

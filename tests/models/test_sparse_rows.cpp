// sparse_row_combination (issue 48): values against at::mm (the dense
// product it replaces in MACE's symmetric contraction) in float64 and
// float32, first and second derivatives against autograd's through at::mm,
// column counts around its 2048-element blocks, and refused shapes.

#include "crucible/models/sparse_rows.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <stdexcept>
#include <vector>

namespace crucible {
namespace {

double max_abs(const at::Tensor& x) { return x.abs().max().item<double>(); }

/// [R, M] float64 with about `density` of its entries nonzero, and one zero row.
at::Tensor sparse_matrix(int64_t R, int64_t M, double density, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor a = at::randn({R, M}, at::kDouble) * (at::rand({R, M}, at::kDouble) < density).to(at::kDouble);
  a[R / 2].zero_();
  return a;
}

TEST(SparseRows, EqualsTheDenseProduct) {
  for (const int64_t K : {1, 7, 2048, 2049, 5000}) {
    const at::Tensor a = sparse_matrix(13, 40, 0.1, static_cast<uint64_t>(K));
    const at::Tensor x = at::randn({40, K}, at::kDouble);
    const at::Tensor got = sparse_row_combination(a, x);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{13, K}));
    EXPECT_LT(max_abs(got - at::mm(a, x)), 1e-13) << "K " << K;
    EXPECT_EQ(max_abs(got[6]), 0.0);  // the zero row
    const at::Tensor got32 = sparse_row_combination(a.to(at::kFloat), x.to(at::kFloat));
    ASSERT_EQ(got32.scalar_type(), at::kFloat);
    EXPECT_LT(max_abs(got32.to(at::kDouble) - at::mm(a, x)), 2e-5) << "K " << K;
  }
}

TEST(SparseRows, NonContiguousInputAndAnotherDtypeForTheCoefficients) {
  const at::Tensor a = sparse_matrix(5, 9, 0.3, 2);
  const at::Tensor x = at::randn({30, 9}, at::kDouble).t();  // [9, 30], not contiguous
  ASSERT_FALSE(x.is_contiguous());
  EXPECT_LT(max_abs(sparse_row_combination(a.to(at::kFloat), x) - at::mm(a.to(at::kFloat).to(at::kDouble), x)),
            1e-13);
}

TEST(SparseRows, FirstAndSecondDerivativesEqualTheDenseProducts) {
  const at::Tensor a = sparse_matrix(11, 23, 0.15, 5);
  const at::Tensor x0 = at::randn({23, 300}, at::kDouble);
  const at::Tensor w = at::randn({11, 300}, at::kDouble);
  auto grads = [&](bool sparse) {
    const at::Tensor x = x0.clone().requires_grad_(true);
    const at::Tensor y = sparse ? sparse_row_combination(a, x) : at::mm(a, x);
    // A non-linear function of y, so the second derivative is not zero.
    const at::Tensor e = (y * w).sum() + y.pow(2).sum();
    const at::Tensor g = torch::autograd::grad({e}, {x}, {}, true, true)[0];
    const at::Tensor gg = torch::autograd::grad({(g * g).sum()}, {x})[0];
    return std::make_pair(g.detach(), gg);
  };
  const auto [g_sparse, gg_sparse] = grads(true);
  const auto [g_dense, gg_dense] = grads(false);
  EXPECT_LT(max_abs(g_sparse - g_dense), 1e-11);
  EXPECT_LT(max_abs(gg_sparse - gg_dense), 1e-9 * std::max(1.0, max_abs(gg_dense)));
  EXPECT_GT(max_abs(gg_dense), 0.0);
}

TEST(SparseRows, RefusesMismatchedShapes) {
  EXPECT_THROW(sparse_row_combination(at::zeros({3, 4}), at::zeros({5, 2})), std::invalid_argument);
  EXPECT_THROW(sparse_row_combination(at::zeros({3}), at::zeros({3, 2})), std::invalid_argument);
}

}  // namespace
}  // namespace crucible

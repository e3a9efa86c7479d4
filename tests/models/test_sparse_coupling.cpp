// The engine's coupling tables from the nonzeros of M (issue 48) against
// the dense product they replace: T = Y[edges] · M and its reverse
// gY[edges] += gT · Mᵀ, with MACE's own coupling matrices and a random one.

#include "crucible/models/mace/irreps.h"
#include "crucible/models/mace/sparse_coupling.h"
#include "crucible/models/mace/tensor_product.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace crucible {
namespace {

using mace::SparseCoupling;

void expect_equals_dense(const at::Tensor& M, at::ScalarType dt, const char* what) {
  at::manual_seed(11);
  const int64_t E = 90, Dsh = M.size(0), cols = M.size(1);
  const at::Tensor Y = at::randn({E, Dsh}, at::kDouble).to(dt);
  // 37 edges: two full blocks of 16 and a tail; distinct rows in any order.
  const at::Tensor edges = at::randperm(E, at::kLong).narrow(0, 0, 37).contiguous();
  const SparseCoupling s(M);
  EXPECT_EQ(s.cols(), cols);
  EXPECT_EQ(s.nonzeros(), M.ne(0).sum().item<int64_t>());
  const at::Tensor Md = M.to(dt);
  const double tol = dt == at::kDouble ? 1e-13 : 2e-5;

  at::Tensor T = at::full({37, cols}, 7.0, Y.options());  // written, not added to
  s.tables(Y, edges, T);
  const at::Tensor expect = at::mm(Y.index_select(0, edges), Md);
  EXPECT_LT((T - expect).abs().max().item<double>(), tol) << what;

  const at::Tensor gT = at::randn({37, cols}, at::kDouble).to(dt);
  const at::Tensor before = at::randn({E, Dsh}, at::kDouble).to(dt);
  at::Tensor gY = before.clone();
  s.tables_backward(gT, edges, gY);
  const at::Tensor expect_g = before.index_add(0, edges, at::mm(gT, Md.t()));
  EXPECT_LT((gY - expect_g).abs().max().item<double>(), tol) << what;
}

TEST(SparseCoupling, MaceCouplingTablesEqualTheDenseProduct) {
  // 32x0e + 32x1o node features to the harmonics l <= 3: the small MACE's second layer.
  const mace::Irreps node = mace::Irreps::parse("1x0e+1x1o");
  const mace::Irreps target = mace::Irreps::parse("1x0e+1x1o+1x2e+1x3o");
  const mace::ConvTensorProduct tp(node, 3, target);
  int checked = 0;
  for (size_t a = 0; a < node.size(); ++a) {
    const at::Tensor M = tp.term_coupling(a);
    ASSERT_TRUE(M.defined());
    EXPECT_LT(SparseCoupling(M).nonzeros(), M.numel() / 3);  // what makes the sparse form pay
    for (const at::ScalarType dt : {at::kDouble, at::kFloat}) expect_equals_dense(M, dt, "MACE coupling");
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

TEST(SparseCoupling, RandomMatrixWithZerosEqualsTheDenseProduct) {
  at::manual_seed(5);
  at::Tensor M = at::randn({9, 23}, at::kDouble);
  M = M * (at::rand({9, 23}, at::kDouble) > 0.6).to(at::kDouble);
  M.select(1, 4).zero_();  // an empty column
  for (const at::ScalarType dt : {at::kDouble, at::kFloat}) expect_equals_dense(M, dt, "random");
}

TEST(SparseCoupling, BadInputsNameWhatWasExpected) {
  const SparseCoupling s(at::eye(4, at::kDouble));
  const at::Tensor edges = at::arange(3, at::kLong);
  at::Tensor T = at::empty({3, 4}, at::kDouble);
  EXPECT_THROW(s.tables(at::randn({5, 3}, at::kDouble), edges, T), std::invalid_argument);   // Dsh
  EXPECT_THROW(s.tables(at::randn({5, 4}, at::kFloat), edges, T), std::invalid_argument);    // dtype
  EXPECT_THROW(s.tables(at::randn({4, 5}, at::kDouble).t(), edges, T), std::invalid_argument);  // layout
  at::Tensor wrong = at::empty({2, 4}, at::kDouble);
  EXPECT_THROW(s.tables(at::randn({5, 4}, at::kDouble), edges, wrong), std::invalid_argument);
  EXPECT_THROW(SparseCoupling(at::ones({3}, at::kDouble)), std::invalid_argument);
}

}  // namespace
}  // namespace crucible

// Issue 48's engine: the fused product basis (product_basis_engine.h)
// against the dense symmetric contraction (symmetric_contraction_fast, itself
// held to the reference e3nn-style contraction in test_mace.cpp) and its
// derivative against autograd through that dense form.

#include "crucible/models/mace/product_basis_engine.h"
#include "crucible/models/mace/symmetric_contraction.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <memory>
#include <string>

namespace crucible {
namespace {

using mace::Irrep;
using mace::Irreps;

struct Case {
  std::string in;
  std::vector<Irrep> outs;
  int max_nu;
  int64_t C;
};

/// The dense form's arguments from a table, as MaceImpl passes them.
void dense_arguments(const mace::MonomialTable& table, std::vector<at::Tensor>& stacked,
                     std::vector<at::Tensor>& indices, at::ScalarType dtype) {
  for (int nu = 1; nu <= table.max_nu; ++nu) {
    std::vector<at::Tensor> rows;
    for (const auto& c : table.coefficients[static_cast<size_t>(nu - 1)])
      if (c.defined()) rows.push_back(c);
    stacked.push_back(rows.empty() ? at::Tensor() : at::cat(rows, 0).to(dtype));
    indices.push_back(nu == 1 ? table.monomials[0].select(1, 0).contiguous() : table.parents[static_cast<size_t>(nu - 1)]);
  }
}

void check_case(const Case& c, at::ScalarType dtype, double tol) {
  SCOPED_TRACE(c.in + " nu " + std::to_string(c.max_nu) + " C " + std::to_string(c.C) + " " +
               std::string(at::toString(dtype)));
  const Irreps in = Irreps::parse(c.in);
  const mace::MonomialTable table = mace::monomial_table(in, c.outs, c.max_nu);
  std::vector<at::Tensor> stacked, indices;
  dense_arguments(table, stacked, indices, dtype);
  const int64_t N = 70, Z = 3, C = c.C;  // more nodes than one parallel task (16) holds
  at::manual_seed(7);
  // Element weights [Z, K, C] and a node → element map using every element.
  std::vector<std::vector<at::Tensor>> wz(c.outs.size()), wn(c.outs.size());
  at::Tensor elem = at::randint(0, Z, {N}, at::kLong);
  elem.index_put_({0}, 2);
  for (size_t o = 0; o < c.outs.size(); ++o) {
    for (int nu = 1; nu <= c.max_nu; ++nu) {
      const int64_t K = table.num_basis[static_cast<size_t>(nu - 1)][o];
      const at::Tensor W = K == 0 ? at::Tensor() : at::randn({Z, K, C}, dtype);
      wz[o].push_back(W);
      wn[o].push_back(W.defined() ? W.index_select(0, elem) : W);
    }
  }
  const at::Tensor x0 = at::randn({N, in.dim(), C}, dtype);
  const at::Tensor x = x0.clone().requires_grad_(true);
  const std::vector<at::Tensor> y = mace::symmetric_contraction_fast(x, table, stacked, indices, wn);
  const at::Tensor want = at::cat(y, 1);
  auto plan = std::make_shared<const mace::ProductBasisPlan>(mace::product_basis_plan(table));
  const at::Tensor xe = x0.clone().requires_grad_(true);
  const at::Tensor got = mace::product_basis_engine(xe, elem, wz, plan);
  ASSERT_EQ(got.sizes(), want.sizes());
  const double scale = std::max(1.0, want.abs().max().item<double>());
  EXPECT_LT((got.detach() - want.detach()).abs().max().item<double>(), tol * scale);

  // ∂/∂x: the hand-written reverse against autograd through the dense form,
  // called directly and through autograd's backward of the engine's output.
  const at::Tensor gy = at::randn(want.sizes(), dtype);
  const at::Tensor g_want = torch::autograd::grad({(want * gy).sum()}, {x})[0];
  const at::Tensor g_direct = mace::product_basis_engine_vjp(x0, elem, wz, *plan, gy);
  const at::Tensor g_autograd = torch::autograd::grad({(got * gy).sum()}, {xe})[0];
  const double gscale = std::max(1.0, g_want.abs().max().item<double>());
  EXPECT_LT((g_direct - g_want).abs().max().item<double>(), tol * gscale);
  EXPECT_LT((g_autograd - g_want).abs().max().item<double>(), tol * gscale);
  EXPECT_GT(g_want.abs().max().item<double>(), 0.0);
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all{
      {"0e+1o+2e+3o", {Irrep{0, 1}, Irrep{1, -1}}, 3, 5},   // MACE's A features at l ≤ 3; C below a block
      {"0e+1o+2e+3o", {Irrep{0, 1}, Irrep{1, -1}}, 3, 32},  // one whole block
      {"0e+1o+2e+3o", {Irrep{0, 1}, Irrep{1, -1}}, 3, 64},  // two whole blocks
      {"0e+1o+2e", {Irrep{0, 1}, Irrep{1, -1}, Irrep{2, 1}}, 2, 40},  // a block and a tail
      {"0e+1o", {Irrep{0, 1}}, 1, 16},                                 // ν = 1: a linear map
      {"0e+1o+2e+3o", {Irrep{0, 1}}, 3, 17},                           // last layer: scalars only
  };
  return all;
}

TEST(ProductBasisEngine, EqualsTheDenseContractionAndItsAutogradDerivativeFloat64) {
  for (const Case& c : cases()) check_case(c, at::kDouble, 1e-12);
}

TEST(ProductBasisEngine, EqualsTheDenseContractionFloat32) {
  for (const Case& c : cases()) check_case(c, at::kFloat, 2e-5);
}

TEST(ProductBasisEngine, RefusesASecondDerivativeAndBadInputs) {
  const mace::MonomialTable table = mace::monomial_table(Irreps::parse("0e+1o"), {Irrep{0, 1}}, 2);
  auto plan = std::make_shared<const mace::ProductBasisPlan>(mace::product_basis_plan(table));
  std::vector<std::vector<at::Tensor>> w(1);
  for (int nu = 1; nu <= 2; ++nu) {
    const int64_t K = table.num_basis[static_cast<size_t>(nu - 1)][0];
    w[0].push_back(K == 0 ? at::Tensor() : at::randn({2, K, 4}, at::kDouble));
  }
  const at::Tensor elem = at::tensor({0, 1, 1}, at::kLong);
  const at::Tensor x = at::randn({3, 4, 4}, at::kDouble).requires_grad_(true);
  const at::Tensor y = mace::product_basis_engine(x, elem, w, plan);
  const at::Tensor g = torch::autograd::grad({y.pow(2).sum()}, {x}, {}, /*retain_graph=*/true)[0];
  EXPECT_GT(g.abs().max().item<double>(), 0.0);
  EXPECT_THROW(torch::autograd::grad({y.pow(2).sum()}, {x}, {}, true, /*create_graph=*/true), std::exception);

  auto message_of = [&](const at::Tensor& xx, const at::Tensor& ee) {
    try {
      mace::product_basis_engine(xx, ee, w, plan);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message_of(x.detach().to(at::kFloat), elem).find("in A's dtype"), std::string::npos);
  EXPECT_NE(message_of(x.detach(), at::tensor({0, 1, 2}, at::kLong)).find("element index"), std::string::npos);
  EXPECT_NE(message_of(x.detach(), at::tensor({0, 1}, at::kLong)).find("elem [N]"), std::string::npos);
  EXPECT_NE(message_of(x.detach().narrow(1, 0, 2), elem).find("components"), std::string::npos);
}

}  // namespace
}  // namespace crucible

// MACE (issue 16): the symmetric contraction's basis, the fast path against
// the autograd reference path, symmetries, finite differences, continuity at
// the cutoff and batching. All in float64.

#include "crucible/models/energy_model.h"
#include "crucible/models/mace/element_linear.h"
#include "crucible/models/mace/mace.h"
#include "crucible/models/mace/radial.h"
#include "crucible/models/mace/spherical_harmonics.h"
#include "crucible/models/mace/symmetric_contraction.h"

#include "models/helpers.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

namespace crucible {
namespace {

using mace::Irrep;
using mace::Irreps;
using testing::make_batch;
using testing::rel_err;

MaceOptions small_options() {
  MaceOptions o;
  o.hidden_irreps = "4x0e+4x1o";
  o.max_ell = 3;
  o.correlation = 3;
  o.num_interactions = 2;
  o.num_bessel = 6;
  o.radial_mlp = {8, 8};
  o.readout_mlp = 4;
  o.cutoff = 3.2;
  o.avg_num_neighbors = 6.0;
  o.atomic_numbers = {1, 6, 8, 13, 22};
  return o;
}

Mace make_model(MaceOptions o = small_options(), uint64_t seed = 7) {
  at::manual_seed(seed);
  Mace m(o);
  m->to(at::kDouble);
  at::Tensor e0 = at::zeros({119}, at::kDouble);
  e0[1] = -1.1;
  e0[6] = -3.2;
  e0[8] = -4.3;
  e0[13] = -2.5;
  e0[22] = -5.0;
  m->set_energy_normalization(e0, 0.8, -0.3);
  return m;
}

/// A random proper (det +1) or improper (det -1) orthogonal matrix.
at::Tensor random_orthogonal(uint64_t seed, bool proper) {
  at::manual_seed(seed);
  at::Tensor q = std::get<0>(at::linalg_qr(at::randn({3, 3}, at::kDouble)));
  q = q * at::linalg_det(q).sign();
  return proper ? q : -q;
}

/// Wigner D of the harmonics' irreps 0e+1o+...+max_ell for an orthogonal Q
/// (inversion included: Y_l(Q r) = D_l Y_l(r) with det Q = -1 adds (-1)^l,
/// which the harmonics carry themselves), by least squares.
std::vector<at::Tensor> wigner_d(const at::Tensor& q, int max_ell) {
  at::manual_seed(99);
  const at::Tensor v = at::randn({300, 3}, at::kDouble);
  const at::Tensor y = mace::spherical_harmonics(v, max_ell);
  const at::Tensor yr = mace::spherical_harmonics(at::matmul(v, q.t()), max_ell);
  std::vector<at::Tensor> d;
  for (int l = 0; l <= max_ell; ++l) {
    const at::Tensor a = y.narrow(1, l * l, 2 * l + 1), b = yr.narrow(1, l * l, 2 * l + 1);
    d.push_back(std::get<0>(at::linalg_lstsq(a, b)).t());
  }
  return d;
}

Structure rotated(const Structure& s, const at::Tensor& q) {
  Structure r = s;
  r.positions = at::matmul(s.positions, q.t());
  r.cell = at::matmul(s.cell, q.t());
  return r;
}

TEST(MaceRadial, BesselEnvelopeAndNormalisedSilu) {
  const at::Tensor r = at::tensor({0.5, 1.7, 3.1}, at::kDouble);
  const at::Tensor b = mace::bessel_basis(r, 4.0, 3);
  for (int64_t e = 0; e < 3; ++e)
    for (int64_t n = 1; n <= 3; ++n) {
      const double x = r[e].item<double>();
      EXPECT_NEAR(b[e][n - 1].item<double>(), std::sqrt(2.0 / 4.0) * std::sin(n * M_PI * x / 4.0) / x, 1e-14);
    }
  // Envelope p = 5: f(0) = 1, f(r_max) = f'(r_max) = f''(r_max) = 0.
  at::Tensor x = at::tensor({0.0, 4.0 - 1e-4, 4.0, 4.5}, at::kDouble).requires_grad_(true);
  const at::Tensor f = mace::polynomial_cutoff(x, 4.0, 5);
  EXPECT_NEAR(f[0].item<double>(), 1.0, 1e-15);
  // Near r_max the envelope vanishes as c·δ³ (x = 1 − δ), c = p(p+1)(p+2)/6 = 35.
  const double delta = 1e-4 / 4.0;
  EXPECT_NEAR(f[1].item<double>(), 35.0 * std::pow(delta, 3), 1e-3 * 35.0 * std::pow(delta, 3));
  EXPECT_EQ(f[2].item<double>(), 0.0);
  EXPECT_EQ(f[3].item<double>(), 0.0);
  const at::Tensor g = torch::autograd::grad({f.sum()}, {x}, {}, true, true)[0];
  EXPECT_NEAR(g[1].item<double>(), -3.0 * 35.0 * delta * delta / 4.0, 1e-3 * 105.0 * delta * delta / 4.0);
  const at::Tensor g2 = torch::autograd::grad({g.sum()}, {x})[0];
  EXPECT_NEAR(g2[1].item<double>(), 6.0 * 35.0 * delta / 16.0, 1e-3 * 210.0 * delta / 16.0);
  EXPECT_EQ(g[2].item<double>(), 0.0);
  // E[(c silu(z))^2] = 1 for z ~ N(0,1): Monte Carlo with 2e6 samples.
  at::manual_seed(1);
  const at::Tensor z = at::randn({2000000}, at::kDouble);
  const double c = mace::normalized_silu_factor();
  EXPECT_NEAR((at::silu(z) * c).pow(2).mean().item<double>(), 1.0, 5e-3);
}

// Dimensions counted by hand: quadratic invariants of 0e+1o+2e+3o are the
// four squared norms; the symmetric vector-valued quadratics are
// 0e·1o, 1o⊗2e → 1o and 2e⊗3o → 1o (1o×1o → 1o is antisymmetric).
TEST(MaceSymmetricContraction, BasisDimensionsEquivarianceAndSymmetry) {
  const Irreps in = Irreps::parse("0e+1o+2e+3o");
  EXPECT_EQ(mace::symmetric_basis(in, Irrep{0, 1}, 1).num_basis, 1);
  EXPECT_EQ(mace::symmetric_basis(in, Irrep{1, -1}, 1).num_basis, 1);
  EXPECT_EQ(mace::symmetric_basis(in, Irrep{0, 1}, 2).num_basis, 4);
  EXPECT_EQ(mace::symmetric_basis(in, Irrep{1, -1}, 2).num_basis, 3);
  EXPECT_EQ(mace::symmetric_basis(in, Irrep{0, -1}, 2).num_basis, 0);
  for (bool proper : {true, false}) {
    const at::Tensor q = random_orthogonal(proper ? 11 : 12, proper);
    const auto d = wigner_d(q, 3);
    const at::Tensor Dfull = at::block_diag({d[0], d[1], d[2], d[3]});  // [16, 16]
    for (const Irrep out : {Irrep{0, 1}, Irrep{1, -1}, Irrep{2, 1}}) {
      for (int nu = 1; nu <= 3; ++nu) {
        const auto& b = mace::symmetric_basis(in, out, nu);
        ASSERT_GT(b.num_basis, 0);
        at::manual_seed(nu);
        const at::Tensor x = at::randn({16}, at::kDouble);
        auto eval = [&](const at::Tensor& v) {
          at::Tensor u = b.dense;  // [O, 16^ν, K]
          at::Tensor m = v;
          for (int k = 1; k < nu; ++k) m = at::outer(m, v).reshape({-1});
          return at::einsum("oik,i->ok", {u, m});  // [O, K]
        };
        const at::Tensor lhs = eval(at::matmul(Dfull, x));
        const at::Tensor rhs = at::matmul(d[static_cast<size_t>(out.l)], eval(x));
        EXPECT_LT((lhs - rhs).abs().max().item<double>(), 1e-10) << out.to_string() << " nu=" << nu;
        // Orthonormal basis tensors.
        const at::Tensor flat = b.dense.permute({2, 0, 1}).reshape({b.num_basis, -1});
        EXPECT_LT((at::matmul(flat, flat.t()) - at::eye(b.num_basis, at::kDouble)).abs().max().item<double>(), 1e-10);
        // The monomial form equals the dense form.
        at::Tensor mono = at::ones({b.monomials.size(0)}, at::kDouble);
        for (int k = 0; k < nu; ++k) mono = mono * x.index_select(0, b.monomials.select(1, k));
        const at::Tensor via_mono = at::matmul(mono, b.coefficients).view({out.dim(), b.num_basis});
        EXPECT_LT((via_mono - eval(x)).abs().max().item<double>(), 1e-12);
      }
    }
  }
}

TEST(MaceOptions, BadHyperparametersNameTheOption) {
  auto expect_error = [](MaceOptions o, const std::string& text) {
    try {
      Mace m(o);
      ADD_FAILURE() << "no error for " << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  MaceOptions o = small_options();
  o.hidden_irreps = "4x0e+8x1o";
  expect_error(o, "one multiplicity");
  o.hidden_irreps = "4x1o";
  expect_error(o, "must contain scalars");
  o.hidden_irreps = "4x0e+4x3q";
  expect_error(o, "hidden_irreps");
  o = small_options();
  o.max_ell = 4;
  expect_error(o, "max_ell");
  o = small_options();
  o.atomic_numbers = {};
  expect_error(o, "atomic_numbers");
  // An element the model was not built for.
  Mace m = make_model();
  Structure s = testing::molecule();
  s.atomic_numbers[0] = 26;
  try {
    m->energy(make_batch({s}, 3.2));
    ADD_FAILURE() << "no error for Fe";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("26 not among the model's elements"), std::string::npos) << e.what();
  }
}

/// Energy, forces, stress and every parameter gradient of a force loss.
struct Outputs {
  at::Tensor energy, forces, stress;
  std::vector<at::Tensor> grads;
};

Outputs run(Mace& m, const Batch& b) {
  ComputeOptions co;
  co.forces = true;
  co.stress = true;
  co.training = true;
  ModelOutputs out = compute_outputs(*m, b, co);
  const at::Tensor loss = out.energy.pow(2).sum() + out.forces.pow(2).sum() + out.stress.pow(2).sum() * 100.0;
  std::vector<at::Tensor> params = m->parameters();
  auto g = torch::autograd::grad({loss}, params, {}, false, false, true);
  Outputs o{out.energy.detach(), out.forces.detach(), out.stress.detach(), {}};
  for (size_t k = 0; k < g.size(); ++k) o.grads.push_back(g[k].defined() ? g[k] : at::zeros_like(params[k]));
  return o;
}

std::vector<Structure> test_structures() {
  Structure a = testing::random_periodic(6, {22, 13}, 3, 1.5);
  Structure b = testing::molecule();
  return {a, b};
}

TEST(MaceFastPath, EqualsTheAutogradReferenceToE10) {
  // 18 channels: the fused loops' 16-lane main loop and its tail (edge_contraction.cpp).
  for (const char* hidden : {"4x0e+4x1o", "3x0e+3x1o+3x2e", "18x0e+18x1o"}) {
    MaceOptions o = small_options();
    o.hidden_irreps = hidden;
    Mace fast = make_model(o);
    Mace ref = make_model(o);
    ref->set_reference_autograd(true);
    const Batch b = make_batch(test_structures(), o.cutoff);
    const Outputs f = run(fast, b), r = run(ref, b);
    SCOPED_TRACE(hidden);
    EXPECT_LT(rel_err(f.energy, r.energy), 1e-10);
    EXPECT_LT(rel_err(f.forces, r.forces), 1e-10);
    EXPECT_LT(rel_err(f.stress, r.stress), 1e-10);
    ASSERT_EQ(f.grads.size(), r.grads.size());
    for (size_t k = 0; k < f.grads.size(); ++k) {
      EXPECT_GT(r.grads[k].abs().max().item<double>(), 0.0) << k;  // every parameter is used
      EXPECT_LT(rel_err(f.grads[k], r.grads[k]), 1e-10) << k;
    }
  }
}

// Issue 19: on structures of more than 16 × inference_edge_chunk() nodes the
// training path evaluates the product basis by checkpointed node chunks
// (checkpointed_rows_twice); forces, stress and a force loss's parameter
// gradients stay the reference's.
TEST(MaceFastPath, CheckpointedProductBasisEqualsTheAutogradReference) {
  MaceOptions o = small_options();
  o.hidden_irreps = "3x0e+3x1o+3x2e";
  Mace fast = make_model(o);
  Mace ref = make_model(o);
  ref->set_reference_autograd(true);
  std::vector<Structure> three;
  for (int k = 0; k < 3; ++k)
    for (const Structure& s : test_structures()) three.push_back(s);
  const Batch b = make_batch(three, o.cutoff);
  ASSERT_GT(b.positions.size(0), 32);
  const Outputs r = run(ref, b);
  // Chunks of 1 node (edge chunk 2: threshold 32 nodes) and the direct
  // path (edge chunk 32: threshold 512 nodes), on 1 and 2 threads.
  for (int64_t chunk : {2, 32}) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE("edge chunk " + std::to_string(chunk) + ", threads " + std::to_string(threads));
      set_inference_edge_chunk(chunk);
      const int before = at::get_num_threads();
      at::set_num_threads(threads);
      const Outputs f = run(fast, b);
      at::set_num_threads(before);
      set_inference_edge_chunk(0);
      EXPECT_LT(rel_err(f.energy, r.energy), 1e-10);
      EXPECT_LT(rel_err(f.forces, r.forces), 1e-10);
      EXPECT_LT(rel_err(f.stress, r.stress), 1e-10);
      for (size_t k = 0; k < f.grads.size(); ++k) EXPECT_LT(rel_err(f.grads[k], r.grads[k]), 1e-10) << k;
    }
  }
  // Which path ran shows in a third derivative (a differentiable parameter
  // gradient of a force loss), which only the checkpointed product basis
  // refuses.
  auto third_order = [&](int64_t chunk) {
    set_inference_edge_chunk(chunk);
    ComputeOptions co;
    co.training = true;
    ModelOutputs out = compute_outputs(*fast, b, co);
    const at::Tensor p = fast->parameters()[0];
    bool refused = false;
    try {  // a differentiable gradient of a force loss
      torch::autograd::grad({out.forces.pow(2).sum()}, {p}, {}, false, /*create_graph=*/true, true);
    } catch (const std::runtime_error& e) {
      refused = std::string(e.what()).find("no third derivative") != std::string::npos;
    }
    set_inference_edge_chunk(0);
    return refused;
  };
  EXPECT_TRUE(third_order(2));
  EXPECT_FALSE(third_order(1024));
}

TEST(MaceSymmetry, RotationsReflectionsTranslationsPermutations) {
  Mace m = make_model();
  for (const Structure& s : test_structures()) {
    const Batch b = make_batch({s}, 3.2);
    ComputeOptions co;
    co.stress = true;
    const ModelOutputs base = compute_outputs(*m, b, co);
    for (bool proper : {true, false}) {
      const at::Tensor q = random_orthogonal(proper ? 21 : 22, proper);
      const ModelOutputs rot = compute_outputs(*m, make_batch({rotated(s, q)}, 3.2), co);
      EXPECT_LT(rel_err(rot.energy, base.energy), 1e-10) << proper;
      EXPECT_LT(rel_err(rot.forces, at::matmul(base.forces, q.t())), 1e-10) << proper;
      const at::Tensor sr = at::matmul(at::matmul(q, base.stress[0]), q.t());
      if (s.periodic()) EXPECT_LT(rel_err(rot.stress[0], sr), 1e-10) << proper;
    }
    Structure t = s;
    t.positions = s.positions + at::tensor({0.31, -1.7, 2.9}, at::kDouble);
    EXPECT_LT(rel_err(compute_outputs(*m, make_batch({t}, 3.2), co).energy, base.energy), 1e-10);
    // Permutation of the atoms.
    const int64_t n = s.num_atoms();
    const at::Tensor perm = at::arange(n - 1, -1, -1, at::kLong);
    Structure p = s;
    p.positions = s.positions.index_select(0, perm);
    p.atomic_numbers = s.atomic_numbers.index_select(0, perm);
    const ModelOutputs po = compute_outputs(*m, make_batch({p}, 3.2), co);
    EXPECT_LT(rel_err(po.energy, base.energy), 1e-10);
    EXPECT_LT(rel_err(po.forces, base.forces.index_select(0, perm)), 1e-10);
  }
}

double energy_of(Mace& m, const Structure& s) {
  at::NoGradGuard ng;
  return m->energy(make_batch({s}, 3.2)).item<double>();
}

TEST(MaceDerivatives, ForcesAndStressEqualCentralFiniteDifferences) {
  Mace m = make_model();
  const double h = 1e-5;
  for (const Structure& s : test_structures()) {
    ComputeOptions co;
    co.stress = s.periodic();
    const ModelOutputs out = compute_outputs(*m, make_batch({s}, 3.2), co);
    at::Tensor fd = at::zeros_like(s.positions);
    for (int64_t a = 0; a < s.num_atoms(); ++a)
      for (int x = 0; x < 3; ++x) {
        Structure p = s, q = s;
        p.positions = s.positions.clone();
        q.positions = s.positions.clone();
        p.positions[a][x] += h;
        q.positions[a][x] -= h;
        fd[a][x] = -(energy_of(m, p) - energy_of(m, q)) / (2 * h);
      }
    EXPECT_LT(rel_err(out.forces, fd), 1e-7);
    if (!s.periodic()) continue;
    at::Tensor fds = at::zeros({3, 3}, at::kDouble);
    const double vol = std::abs(at::linalg_det(s.cell).item<double>());
    for (int x = 0; x < 3; ++x)
      for (int y = 0; y < 3; ++y) {
        auto strained = [&](double eps) {
          at::Tensor e = at::eye(3, at::kDouble);
          e[x][y] += eps * 0.5;
          e[y][x] += eps * 0.5;
          Structure t = s;
          t.positions = at::matmul(s.positions, e);
          t.cell = at::matmul(s.cell, e);
          return energy_of(m, t);
        };
        fds[x][y] = (strained(h) - strained(-h)) / (2 * h) / vol;
      }
    EXPECT_LT(rel_err(out.stress[0], fds), 1e-7);
  }
}

TEST(MaceCutoff, EnergyAndForcesAreContinuousAtTheCutoff) {
  Mace m = make_model();
  // A third atom moved across r_max from a dimer: the energy tends to the
  // dimer-plus-isolated-atom value and its force to zero.
  auto trimer = [](double d) {
    return testing::make_structure({0, 0, 0, 1.1, 0, 0, 0.5, d, 0}, {6, 8, 1}, std::vector<double>(9, 0.0),
                                   {false, false, false});
  };
  // Distance of atom 2 to atom 0 is √(0.25 + d²), to atom 1 √(0.36 + d²); both
  // must exceed 3.2 Å: d > √(3.2² − 0.25).
  const double d_out = std::sqrt(3.2 * 3.2 - 0.25) + 1e-9;
  const double e_far = energy_of(m, trimer(d_out + 0.5));
  double prev = 1e300;
  for (double delta : {1e-2, 1e-3, 1e-4}) {
    const double e = energy_of(m, trimer(d_out - delta));
    const double gap = std::abs(e - e_far);
    EXPECT_LT(gap, prev);
    prev = gap;
    const ModelOutputs o = compute_outputs(*m, make_batch({trimer(d_out - delta)}, 3.2), {});
    EXPECT_LT(o.forces[2].abs().max().item<double>(), 1e-2 * delta / 1e-2 + 1e-9) << delta;
  }
  EXPECT_LT(prev, 1e-9);
  EXPECT_EQ(energy_of(m, trimer(d_out + 1e-6)), e_far);
}

TEST(MaceBatching, AStructureHasTheSameEnergyAloneAndInABatch) {
  Mace m = make_model();
  const auto ss = test_structures();
  const Batch both = make_batch({ss[0], ss[1], ss[0]}, 3.2);
  const ModelOutputs ob = compute_outputs(*m, both, {});
  for (size_t k = 0; k < 2; ++k) {
    const ModelOutputs alone = compute_outputs(*m, make_batch({ss[k]}, 3.2), {});
    EXPECT_LT(std::abs(ob.energy[static_cast<int64_t>(k)].item<double>() - alone.energy[0].item<double>()),
              1e-12 * std::abs(alone.energy[0].item<double>()));
  }
  EXPECT_NEAR(ob.energy[2].item<double>(), ob.energy[0].item<double>(), 1e-12 * std::abs(ob.energy[0].item<double>()));
}

TEST(MaceClone, CloneIsADeepCopy) {
  Mace m = make_model();
  auto c = std::dynamic_pointer_cast<MaceImpl>(m->clone_model());
  ASSERT_TRUE(c);
  const Batch b = make_batch(test_structures(), 3.2);
  at::NoGradGuard ng;
  EXPECT_EQ((c->energy(b) - m->energy(b)).abs().max().item<double>(), 0.0);
  c->named_parameters()["embedding"].add_(1.0);
  EXPECT_GT((c->energy(b) - m->energy(b)).abs().max().item<double>(), 0.0);
}

}  // namespace
}  // namespace crucible

namespace crucible::mace {
namespace {

// Issue 48: the element-dependent linear map against a per-node oracle
// (einsum over the gathered weights), values and gradients in x and W,
// for 1, 5 (one GEMM and a gather) and 12 elements (grouped by element),
// with one and several elements present in shuffled order.
TEST(MaceElementLinear, EqualsThePerNodeProductForEveryElementCount) {
  at::manual_seed(5);
  for (int64_t nE : {1, 5, 12}) {
    for (bool mixed : {false, true}) {
      SCOPED_TRACE(std::to_string(nE) + (mixed ? " mixed" : " one element"));
      const int64_t N = 37, d = 3, C = 8, Co = 6;
      const auto opt = at::TensorOptions().dtype(at::kDouble);
      const at::Tensor elem = mixed ? at::randint(0, nE, {N}, at::kLong) : at::full({N}, nE - 1, at::kLong);
      at::Tensor x = at::randn({N, d, C}, opt).requires_grad_(true);
      at::Tensor W = at::randn({nE, C, Co}, opt).requires_grad_(true);
      const at::Tensor gy = at::randn({N, d, Co}, opt);
      const at::Tensor y = element_linear(x, W, elem);
      const auto g = torch::autograd::grad({(y * gy).sum()}, {x, W});
      at::Tensor x2 = x.detach().clone().requires_grad_(true), W2 = W.detach().clone().requires_grad_(true);
      const at::Tensor ref = at::einsum("ndc,nco->ndo", {x2, W2.index_select(0, elem)}) /
                             std::sqrt(static_cast<double>(nE * C));
      const auto g2 = torch::autograd::grad({(ref * gy).sum()}, {x2, W2});
      EXPECT_TRUE(at::allclose(y, ref, 1e-12, 1e-12));
      EXPECT_TRUE(at::allclose(g[0], g2[0], 1e-12, 1e-12));
      EXPECT_TRUE(at::allclose(g[1], g2[1], 1e-12, 1e-12));
      if (mixed && nE > 1) EXPECT_GT(std::get<0>(at::_unique(elem)).numel(), 1);
    }
  }
}

// The engine's merged form: x · (A · W[elem]) against the per-node einsum
// of the two maps in turn, values and the gradients in x, A and W.
TEST(MaceElementLinear, MergedWithThePrecedingLinearEqualsBothInTurn) {
  at::manual_seed(9);
  for (int64_t nE : {1, 5, 12}) {
    for (bool mixed : {false, true}) {
      SCOPED_TRACE(std::to_string(nE) + (mixed ? " mixed" : " one element"));
      const int64_t N = 29, d = 5, K = 10, C = 8, Co = 6;
      const auto opt = at::TensorOptions().dtype(at::kDouble);
      const at::Tensor elem = mixed ? at::randint(0, nE, {N}, at::kLong) : at::full({N}, nE - 1, at::kLong);
      at::Tensor x = at::randn({N, d, K}, opt).requires_grad_(true);
      at::Tensor A = at::randn({K, C}, opt).requires_grad_(true);
      at::Tensor W = at::randn({nE, C, Co}, opt).requires_grad_(true);
      const at::Tensor gy = at::randn({N, d, Co}, opt);
      const at::Tensor y = element_linear_after(x, A, W, elem);
      const auto g = torch::autograd::grad({(y * gy).sum()}, {x, A, W});
      at::Tensor x2 = x.detach().clone().requires_grad_(true), A2 = A.detach().clone().requires_grad_(true);
      at::Tensor W2 = W.detach().clone().requires_grad_(true);
      const at::Tensor ref = at::einsum("ndc,nco->ndo", {at::einsum("ndk,kc->ndc", {x2, A2}), W2.index_select(0, elem)}) /
                             std::sqrt(static_cast<double>(nE * C));
      const auto g2 = torch::autograd::grad({(ref * gy).sum()}, {x2, A2, W2});
      EXPECT_TRUE(at::allclose(y, ref, 1e-12, 1e-12));
      for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(at::allclose(g[k], g2[k], 1e-12, 1e-12)) << k;
    }
  }
  EXPECT_EQ(element_linear_after(at::zeros({0, 3, 4}, at::kDouble), at::ones({4, 2}, at::kDouble),
                                 at::ones({2, 2, 5}, at::kDouble), at::zeros({0}, at::kLong)).sizes(),
            (std::vector<int64_t>{0, 3, 5}));
}

}  // namespace
}  // namespace crucible::mace

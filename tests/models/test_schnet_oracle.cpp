// Cross-checks SchNet energy, forces and stress against an independent
// PyTorch + ASE implementation (tests/models/oracles/schnet_oracle.py) with
// the same weights, and runs the model on batches from the real data
// pipeline (read_extxyz → AtomicDataset → collate).

#include "common/python_oracle.h"
#include "crucible/data/dataset.h"
#include "crucible/data/extxyz.h"
#include "crucible/models/energy_model.h"
#include "crucible/models/schnet.h"
#include "models/helpers.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <string>

#include <unistd.h>

namespace crucible {
namespace {

using testing::python_has;
using testing::run_python;

using testing::make_batch;
using testing::molecule;
using testing::random_periodic;
using testing::rel_err;

constexpr double kOracleCutoff = 3.5;

void write_tensor(std::ostream& os, const std::string& name, const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU, at::kDouble).contiguous();
  os << "tensor " << name << " " << c.dim();
  for (int64_t d : c.sizes()) os << " " << d;
  os << "\n";
  const double* p = c.data_ptr<double>();
  for (int64_t k = 0; k < c.numel(); ++k) os << p[k] << (k + 1 == c.numel() ? "\n" : " ");
  if (c.numel() == 0) os << "\n";
}

void write_structure(std::ostream& os, const Structure& s) {
  os << "structure " << s.num_atoms() << " " << s.pbc[0] << " " << s.pbc[1] << " " << s.pbc[2] << "\n";
  for (const at::Tensor& t : {s.cell.flatten(), s.positions.flatten(), s.atomic_numbers.to(at::kDouble)}) {
    const at::Tensor c = t.contiguous();
    for (int64_t k = 0; k < c.numel(); ++k) os << c[k].item<double>() << " ";
    os << "\n";
  }
}


std::vector<double> read_record(std::istream& in, const std::string& key, int64_t count) {
  std::string word;
  in >> word;
  EXPECT_EQ(word, key);
  std::vector<double> v(count);
  for (auto& x : v) in >> x;
  return v;
}


TEST(SchNetOracle, MatchesIndependentPyTorchAseImplementation) {
  at::manual_seed(42);
  SchNetOptions o;
  o.hidden_channels = 16;
  o.num_filters = 12;
  o.num_interactions = 3;
  o.num_gaussians = 10;
  o.cutoff = kOracleCutoff;
  o.max_atomic_number = 20;
  SchNet model(o);
  model->to(at::kDouble);
  // Random (non-trivial) biases / normalisation so every term is exercised.
  {
    at::NoGradGuard g;
    for (auto& p : model->parameters()) p.add_(0.05 * at::randn_like(p));
  }
  model->set_energy_normalization(at::randn({21}, at::kDouble), 1.3, -0.2);

  std::vector<Structure> structures{random_periodic(6, {13, 8, 1}, 21), molecule()};
  Structure slab = random_periodic(5, {13, 8}, 22);
  slab.pbc = {true, false, true};
  structures.push_back(slab);

  const std::string dump = (std::filesystem::temp_directory_path() /
                            ("crucible_schnet_oracle_" + std::to_string(::getpid()) + ".txt"))
                               .string();
  {
    std::ofstream os(dump);
    os << std::setprecision(17);
    os << "option cutoff " << kOracleCutoff << "\noption num_interactions " << o.num_interactions << "\n";
    for (const auto& p : model->named_parameters()) write_tensor(os, p.key(), p.value());
    for (const auto& b : model->named_buffers()) write_tensor(os, b.key(), b.value());
    for (const auto& s : structures) write_structure(os, s);
  }
  const std::string out = run_python(std::string(CRUCIBLE_SOURCE_DIR) + "/tests/models/oracles/schnet_oracle.py " + dump);
  std::filesystem::remove(dump);
  if (out.empty()) {
    if (!python_has("torch, ase")) GTEST_SKIP() << "torch/ASE unavailable at " << CRUCIBLE_PYTHON;
    FAIL() << "python oracle failed";
  }

  std::istringstream in(out);
  for (const Structure& s : structures) {
    Batch b = make_batch({s}, kOracleCutoff);
    ComputeOptions opt;
    opt.stress = true;
    model->set_filter_spline(false);  // the exact filter network: to rounding
    ModelOutputs pred = compute_outputs(*model, b, opt);
    model->set_filter_spline(true);   // its splines (issue 48): to their error
    const ModelOutputs splined = compute_outputs(*model, b, opt);
    const auto e = read_record(in, "energy", 1);
    const auto f = read_record(in, "forces", 3 * s.num_atoms());
    const auto st = read_record(in, "stress", 9);
    EXPECT_NEAR(pred.energy.item<double>(), e[0], 1e-10 * std::max(1.0, std::abs(e[0])));
    EXPECT_LT(rel_err(pred.forces, at::tensor(f, at::kDouble).view({-1, 3})), 1e-10);
    EXPECT_NEAR(splined.energy.item<double>(), e[0], 1e-7 * std::max(1.0, std::abs(e[0])));
    EXPECT_LT(rel_err(splined.forces, at::tensor(f, at::kDouble).view({-1, 3})), 1e-6);
    const at::Tensor ref_stress = at::tensor(st, at::kDouble).view({3, 3});
    if (s.periodic()) {
      // ASE's finite-difference stress (d = 1e-5) vs. the analytic strain derivative.
      EXPECT_LT(rel_err(pred.stress[0], ref_stress), 1e-6) << pred.stress[0] << ref_stress;
    } else {
      EXPECT_TRUE(pred.stress.eq(0).all().item<bool>());
    }
  }
}

TEST(SchNetPipeline, DatasetBatchesMatchHandBuiltBatches) {
  const std::string path = std::string(CRUCIBLE_SOURCE_DIR) + "/data/alloy_TiAl/TiAl_tutorial.xyz";
  std::vector<Structure> all = read_extxyz(path);
  // A few small cells plus one of the 54-atom supercells.
  std::vector<Structure> subset{all[0], all[1], all[2], all[7]};
  for (const auto& s : all) {
    if (s.num_atoms() == 54) {
      subset.push_back(s);
      break;
    }
  }
  ASSERT_EQ(subset.size(), 5u);
  at::manual_seed(5);
  SchNetOptions o;
  o.hidden_channels = 16;
  o.num_filters = 16;
  o.num_interactions = 2;
  o.cutoff = 4.0;
  SchNet model(o);
  model->to(at::kDouble);
  model->set_energy_normalization(fit_reference_energies(subset), 1.0, 0.0);

  AtomicDataset dataset(subset, o.cutoff);
  Batch real = dataset.collate({0, 1, 2, 3, 4});
  Batch hand = make_batch(subset, o.cutoff);
  EXPECT_EQ(real.num_edges(), hand.num_edges());
  ComputeOptions opt;
  opt.stress = true;
  ModelOutputs a = compute_outputs(*model, real, opt);
  ModelOutputs b = compute_outputs(*model, hand, opt);
  EXPECT_LT(rel_err(a.energy, b.energy), 1e-12);
  EXPECT_LT(rel_err(a.forces, b.forces), 1e-10);
  EXPECT_LT(rel_err(a.stress, b.stress), 1e-10);
  // Batch::to(float32) runs through the float32 model.
  model->to(at::kFloat);
  ModelOutputs f = compute_outputs(*model, real.to(at::kCPU, at::kFloat), opt);
  EXPECT_EQ(f.energy.scalar_type(), at::kDouble);  // energies are summed in float64 (issue 48)
  EXPECT_EQ(f.forces.scalar_type(), at::kFloat);
  EXPECT_LT(rel_err(f.energy.to(at::kDouble), a.energy), 1e-5);
}

}  // namespace
}  // namespace crucible

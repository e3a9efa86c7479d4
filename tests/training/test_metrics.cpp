// Validation metrics (issue 4 deliverable 5): energy, forces and stress MAE
// and RMSE overall and per config_type equal a direct computation with
// python3-torch on the same predictions, including unlabelled structures
// (whose NaN predictions must not count) and several batches.

#include "common/python_oracle.h"
#include "crucible/training/metrics.h"
#include "toy_model.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace crucible {
namespace {

using testing::python_has;
using testing::run_python;
using testing::toy_structures;

TEST(Metrics, OverallAndPerConfigTypeMatchADirectPyTorchComputation) {
  if (!python_has("torch")) GTEST_SKIP() << "torch unavailable at " << CRUCIBLE_PYTHON;
  auto structures = toy_structures(9, 3);
  std::mt19937_64 rng(11);
  std::normal_distribution<double> noise(0.0, 0.05);
  const std::vector<std::string> types = {"bulk", "surface", "cluster"};
  for (size_t i = 0; i < structures.size(); ++i) {
    auto& s = structures[i];
    s.config_type = types[i % 3];
    if (i % 4 == 1) s.energy.reset();  // unlabelled energy
    if (i % 5 == 2) s.forces.reset();  // unlabelled forces
    if (i % 2 == 0) s.stress = at::randn({3, 3}, at::kDouble) * 0.01;
  }
  AtomicDataset ds(structures, 4.0);
  MetricsAccumulator acc;
  nlohmann::json dump;
  dump["structures"] = nlohmann::json::array();
  for (int64_t begin = 0; begin < 9; begin += 4) {  // batches of 4, 4, 1
    std::vector<int64_t> idx;
    for (int64_t k = begin; k < std::min<int64_t>(9, begin + 4); ++k) idx.push_back(k);
    Batch batch = ds.collate(idx);
    ModelOutputs pred;
    pred.energy = batch.energy.clone();
    pred.forces = batch.forces.clone();
    pred.stress = batch.stress.clone();
    // Noisy predictions; NaN where the label is missing (must not count).
    for (int64_t g = 0; g < batch.num_graphs(); ++g) {
      pred.energy[g] = batch.has_energy[g].item<bool>()
                           ? batch.energy[g].item<double>() + noise(rng)
                           : std::numeric_limits<double>::quiet_NaN();
      pred.stress[g] = batch.has_stress[g].item<bool>()
                           ? batch.stress[g] + 0.01 * at::randn({3, 3}, at::kDouble)
                           : at::full({3, 3}, std::numeric_limits<double>::quiet_NaN(),
                                      at::kDouble);
    }
    pred.forces = pred.forces + 0.05 * at::randn_like(pred.forces);
    const auto atom_has = batch.has_forces.index_select(0, batch.batch);
    pred.forces.index_put_({~atom_has}, std::numeric_limits<double>::quiet_NaN());
    acc.add(pred, batch);
    for (int64_t g = 0; g < batch.num_graphs(); ++g) {
      const auto atoms = (batch.batch == g).nonzero().squeeze(1);
      auto vec = [](const at::Tensor& t) {
        const at::Tensor c = t.contiguous().to(at::kDouble).flatten();
        return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
      };
      nlohmann::json s;
      s["config_type"] = batch.config_types[g];
      s["num_atoms"] = batch.num_atoms[g].item<int64_t>();
      s["energy"] = batch.has_energy[g].item<bool>()
                        ? nlohmann::json({pred.energy[g].item<double>(),
                                          batch.energy[g].item<double>()})
                        : nlohmann::json();
      s["forces"] = batch.has_forces[g].item<bool>()
                        ? nlohmann::json({vec(pred.forces.index_select(0, atoms)),
                                          vec(batch.forces.index_select(0, atoms))})
                        : nlohmann::json();
      s["stress"] = batch.has_stress[g].item<bool>()
                        ? nlohmann::json({vec(pred.stress[g]), vec(batch.stress[g])})
                        : nlohmann::json();
      dump["structures"].push_back(s);
    }
  }
  const std::string path = "/tmp/crucible_metrics_" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << std::setprecision(17) << dump.dump();
  const std::string out = run_python(std::string(CRUCIBLE_SOURCE_DIR) +
                                     "/tests/training/oracles/metrics_oracle.py " + path);
  std::remove(path.c_str());
  ASSERT_FALSE(out.empty()) << "oracle did not run";
  const auto want = nlohmann::json::parse(out);
  const ValidationSummary got = acc.summary();
  auto compare = [](const ErrorMetrics& m, const nlohmann::json& w, const std::string& group) {
    for (const auto& [key, value] : m.as_map()) {
      if (w.at(key).is_null()) {
        EXPECT_TRUE(std::isnan(value)) << group << " " << key;
      } else {
        const double x = w.at(key).get<double>();
        EXPECT_NEAR(value, x, 1e-10 * std::max(1.0, std::abs(x))) << group << " " << key;
      }
    }
    // Issue 47: the spread of the labels (not in as_map).
    if (!w.at("mean_energy_rmse").is_null()) {
      EXPECT_NEAR(m.mean_energy_rmse, w.at("mean_energy_rmse").get<double>(),
                  1e-6 * std::max(1.0, w.at("mean_energy_rmse").get<double>()))
          << group;
    }
    if (group == "all") EXPECT_GT(m.mean_energy_rmse, 1.0) << group;
  };
  compare(got, want.at("all"), "all");
  ASSERT_EQ(got.per_config_type.size(), 3u);
  for (const auto& t : types) compare(got.per_config_type.at(t), want.at(t), t);
  EXPECT_EQ(got.num_structures, 9);
  EXPECT_EQ(got.per_config_type.at("bulk").num_structures, 3);
  EXPECT_EQ(got.num_stresses, 9 * 5);  // structures 0, 2, 4, 6, 8
}

}  // namespace
}  // namespace crucible

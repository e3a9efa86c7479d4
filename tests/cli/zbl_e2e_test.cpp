// Issue 48, item 3, through the real binary: model.<type>.pair_repulsion
// trains SchNet and MACE with the ZBL term and saves it with the model, so
// that every deployment (evaluate, the calculator, the KIM model, which all
// load model.json + model.pt) carries it. Oracle: the loaded model's energy
// of a close Ti-Al dimer minus the same weights' energy with the ZBL
// amplitudes zeroed equals models/zbl.h's pair energy, which
// tests/models/test_zbl.cpp checks against the formula written out.

#include "crucible/run/model_io.h"
#include "crucible/data/batch.h"
#include "crucible/models/energy_model.h"
#include "crucible/models/zbl.h"
#include "crucible/neighbors/neighbor_list.h"

#include "cli/e2e_helpers.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace crucible {
namespace {

using namespace e2e;

double dimer_energy(EnergyModel& model, double r) {
  Structure s;
  s.positions = at::tensor(std::vector<double>{0, 0, 0, r, 0, 0}, at::kDouble).view({2, 3});
  s.atomic_numbers = at::tensor(std::vector<int64_t>{22, 13}, at::kLong);
  s.cell = at::zeros({3, 3}, at::kDouble);
  s.pbc = {false, false, false};
  const NeighborList nl = build_neighbor_list(s.positions, s.cell, s.pbc, model.cutoff());
  const at::ScalarType dtype = model.module().parameters().front().scalar_type();
  return compute_outputs(model, collate({&s}, {&nl}).to(at::kCPU, dtype), ComputeOptions{}).energy.item<double>();
}

TEST(ZblE2e, PairRepulsionIsTrainedSavedAndLoadedWithSchNetAndMace) {
  const fs::path dir = fs::temp_directory_path() / ("crucible_zbl_e2e_" + std::to_string(::getpid()));
  ASSERT_TRUE(make_tiny_tial_dir(dir));
  const std::vector<std::vector<std::string>> models = {
      {"model.type=schnet", "model.schnet.hidden_channels=8", "model.schnet.num_filters=8",
       "model.schnet.pair_repulsion=true"},
      {"model.type=mace", "model.mace.hidden_irreps=4x0e+4x1o", "model.mace.max_ell=2", "model.mace.num_bessel=4",
       "model.mace.radial_mlp=[8]", "model.mace.mlp_irreps=4x0e", "model.mace.pair_repulsion=true"}};
  for (const auto& m : models) {
    const std::string type = m[0].substr(std::string("model.type=").size());
    SCOPED_TRACE(type);
    const fs::path run = dir / type;
    std::vector<std::string> a{"train", "data.train_file=" + (dir / "tiny.xyz").string(),
                               "data.valid_file=" + (dir / "tiny_valid.xyz").string(), "training.num_steps=2",
                               "training.batch_size=4", "model.cutoff=4.5", "output.run_dir=" + run.string()};
    a.insert(a.end(), m.begin(), m.end());
    const Result r = run_crucible(dir, a);
    ASSERT_EQ(r.rc, 0) << r.out << r.err;
    const nlohmann::json j = nlohmann::json::parse(read_text(run / "model.json"));
    EXPECT_TRUE(j.at("hyperparameters").at("pair_repulsion").get<bool>()) << j.dump();
    LoadedModel loaded = load_model(run.string());
    auto& module = loaded.model->module();
    const auto buffers = module.named_buffers();
    ASSERT_TRUE(buffers.contains("zbl_c"));
    EXPECT_EQ(buffers["zbl_c"].scalar_type(), at::kDouble);  // kept float64 in a float64 run
    const double with = dimer_energy(*loaded.model, 0.8);
    {
      at::NoGradGuard no_grad;
      module.named_buffers()["zbl_c"].zero_();
    }
    const double without = dimer_energy(*loaded.model, 0.8);
    const at::Tensor rr = at::full({2}, 0.8, at::kDouble);
    const at::Tensor edges = at::tensor(std::vector<int64_t>{0, 1, 1, 0}, at::kLong).view({2, 2});
    const double zbl =
        zbl_node_energies(rr, at::tensor(std::vector<int64_t>{22, 13}, at::kLong), edges, 2, default_zbl_parameters(5))
            .sum()
            .item<double>();
    EXPECT_GT(zbl, 5.0);  // a Ti-Al pair at 0.8 Å: 8.7 eV
    EXPECT_NEAR(with - without, zbl, 1e-9 * zbl);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace crucible

// A model from its recipe and training data (crucible/run/model_from_data.h).

#include "crucible/run/model_from_data.h"

#include "crucible/common/dtype_names.h"
#include "crucible/common/error.h"
#include "crucible/models/energy_normalization.h"
#include "crucible/models/registry.h"
#include "crucible/precision/precision.h"
#include "crucible/run/e0s.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace crucible {

std::set<int64_t> elements_of(std::initializer_list<const std::vector<Structure>*> parts) {
  std::set<int64_t> elements;
  for (const auto* part : parts) {
    for (const auto& s : *part) {
      const auto z = s.atomic_numbers.to(at::kLong).contiguous();
      const int64_t* p = z.data_ptr<int64_t>();
      elements.insert(p, p + z.numel());
    }
  }
  return elements;
}

at::ScalarType run_dtype(const TrainingConfig& training) {
  if (training.precision) return *training.precision == "64-true" ? at::kDouble : at::kFloat;
  return dtype_from_name(training.dtype).value_or(at::kFloat);
}

std::shared_ptr<EnergyModel> create_model(const std::string& type, const TrainingConfig& training,
                                          const std::function<std::shared_ptr<EnergyModel>()>& make) {
  try {
    std::unique_ptr<PrecisionPlugin::DefaultDtypeGuard> init_dtype;
    if (training.precision) init_dtype = make_precision_plugin(*training.precision)->module_init_context();
    return make();
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    throw ConfigError(what.rfind("model.", 0) == 0 ? what : "model." + type + ": " + what);
  }
}

ModelMetadata model_metadata(const Config& config, const EnergyModel& model, at::ScalarType dtype,
                             const std::set<int64_t>& elements, const at::Tensor& e0,
                             const std::string& e0_source, double scale, double shift,
                             double min_pair_distance) {
  ModelMetadata meta;
  meta.model_type = config.model.type;
  meta.hyperparameters = model_factory(config.model.type).to_json(model);
  meta.dtype = dtype_name(dtype);
  meta.atomic_numbers.assign(elements.begin(), elements.end());
  for (int64_t z : elements) meta.e0[z] = e0[z].item<double>();
  meta.e0_source = e0_source;
  meta.scale = scale;
  meta.shift = shift;
  if (std::isfinite(min_pair_distance)) meta.min_distance = 0.5 * min_pair_distance;
  meta.data = config.data;
  return meta;
}

NeighborStats neighbor_stats(const AtomicDataset& dataset, int64_t count) {
  NeighborStats s;
  const int64_t n = count < 0 ? dataset.size() : std::min(count, dataset.size());
  for (int64_t k = 0; k < n; ++k) {
    const NeighborList& nl = dataset.neighbor_list(k);
    const Structure& st = dataset.structure(k);
    s.edges += nl.num_edges();
    s.atoms += st.num_atoms();
    if (nl.num_edges() == 0) continue;
    const at::Tensor pos = st.positions.to(at::kDouble);
    const at::Tensor r = pos.index_select(0, nl.edge_index[1]) - pos.index_select(0, nl.edge_index[0]) + nl.shift_vectors;
    s.min_pair_distance = std::min(s.min_pair_distance, r.norm(2, 1).min().item<double>());
  }
  s.avg_num_neighbors = s.atoms > 0 ? static_cast<double>(s.edges) / static_cast<double>(s.atoms) : 1.0;
  return s;
}

BuiltModel build_model_from_data(const Config& config, const AtomicDataset& train) {
  validate_config(config);
  const auto& tc = config.training;
  if (std::abs(train.cutoff() - config.model.cutoff) > 1e-12) {
    throw ConfigError(fmt::format("model.cutoff must be the training dataset's cutoff, {} Å, got {} Å "
                                  "(build the dataset with the model's cutoff)", train.cutoff(), config.model.cutoff));
  }
  if (config.model.init_from) {
    throw ConfigError("model.init_from: fine-tuning sources are built by a recipe run (crucible.train / "
                      "crucible train), not from parts; remove model.init_from");
  }
  const std::string& mode = config.data.e0s.mode;
  if (mode == "isolated" || mode == "foundation" || mode == "estimated") {
    throw ConfigError("data.e0s " + mode + " needs a recipe run (crucible.train / crucible train), which "
                      "reads isolated atoms or a source model; from parts use least_squares, zero, a map or a file");
  }
  const std::vector<Structure>& structures = train.structures();
  const std::set<int64_t> elements = elements_of({&structures});
  BuiltModel out;
  const E0Choice e0 = choose_e0s(config.data.e0s, structures, {}, elements);
  if (!e0.warning.empty()) out.warnings.push_back(e0.warning);
  const auto [scale, shift] = fit_energy_scale_shift(structures, e0.e0, parse_energy_scaling(config.model.scaling),
                                                     config.model.shift == "mean");
  const NeighborStats stats = neighbor_stats(train);
  if (stats.edges == 0) {
    throw ConfigError(fmt::format("model.cutoff {:g} Å leaves every atom of the {} training structures without a "
                                  "neighbor; MLIP cutoffs are usually 4-6 Å", config.model.cutoff, structures.size()));
  }
  ModelBuildContext mctx;
  mctx.type = config.model.type;
  mctx.params = &config.model.params;
  mctx.cutoff = config.model.cutoff;
  mctx.elements.assign(elements.begin(), elements.end());
  mctx.avg_num_neighbors = stats.avg_num_neighbors;
  const at::ScalarType dtype = run_dtype(tc);
  at::manual_seed(static_cast<uint64_t>(tc.seed));
  out.model = create_model(config.model.type, tc, [&] { return model_factory(config.model.type).create(mctx); });
  out.model->module().to(dtype);
  out.model->set_energy_normalization(e0.e0, scale, shift);
  out.meta = model_metadata(config, *out.model, dtype, elements, e0.e0, e0.source, scale, shift,
                            stats.min_pair_distance);
  return out;
}

}  // namespace crucible

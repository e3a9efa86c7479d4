// The header a training run prints (crucible/run/run_header.h).

#include "crucible/run/run_header.h"

#include "crucible/common/dtype_names.h"
#include "crucible/data/extxyz.h"
#include "crucible/models/registry.h"
#include "crucible/run/fine_tuning.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <string>
#include <variant>

namespace crucible {

namespace fs = std::filesystem;

namespace {

/// The learning-rate schedule in words ("cosine lr 0.01 → 0.0001 after 100
/// warmup steps from 0.001").
std::string schedule_text(const TrainingConfig& tc) {
  const auto& sc = tc.scheduler;
  const std::string warm =
      sc.warmup_steps > 0 && sc.name != "plateau"
          ? fmt::format(" after {} warmup steps from {}", sc.warmup_steps,
                        tc.optimizer.lr * sc.warmup_start_factor)
          : "";
  if (sc.name == "cosine") {
    return fmt::format("cosine lr {} → {}{}", tc.optimizer.lr,
                       tc.optimizer.lr * sc.final_lr_factor, warm);
  } else if (sc.name == "step") {
    return fmt::format("step lr ×{} every {} steps{}", sc.gamma, sc.step_size, warm);
  } else if (sc.name == "exponential") {
    return fmt::format("exponential lr ×{} per step{}", sc.gamma, warm);
  } else if (sc.name == "plateau") {
    return fmt::format("plateau lr ×{} after {} validations without {} improving",
                       sc.factor, sc.patience, sc.monitor);
  }
  return "constant lr" + warm;
}

/// The model line: type, its keys (or an imported source's), cutoff, parameters.
std::string model_text(const TrainingSetup& setup) {
  const Config& config = setup.config;
  if (is_imported_model(*setup.model)) {
    // Issue 46: the architecture is the imported source's, not the config's keys.
    nlohmann::json h = model_factory(config.model.type).to_json(*setup.model);
    h.erase("u_columns");
    h.erase("atomic_numbers");
    std::string keys;
    for (const auto& [k, v] : h.items()) keys += fmt::format("{}{} {}", keys.empty() ? "" : ", ", k, v.is_string() ? v.get<std::string>() : v.dump());
    return fmt::format("{} from model.init_from {}: {}; {} parameters", config.model.type,
                       *config.model.init_from, keys, setup.num_parameters);
  } else {
    // The model.type's own keys (issue 16), then the cutoff.
    std::string keys;
    for (const auto& k : model_factory(config.model.type).keys) {
      const ModelParamValue& v = config.model.params.at(config.model.type + "." + k.name);
      std::string text;
      if (const auto* b = std::get_if<bool>(&v)) text = *b ? "true" : "false";
      if (const auto* i = std::get_if<int64_t>(&v)) text = std::to_string(*i);
      if (const auto* d = std::get_if<double>(&v)) text = fmt::format("{}", *d);
      if (const auto* str = std::get_if<std::string>(&v)) text = *str;
      if (const auto* l = std::get_if<std::vector<int64_t>>(&v)) text = fmt::format("[{}]", fmt::join(*l, ", "));
      if (k.name == "avg_num_neighbors") {  // 0 = computed from the training set: print what the model uses
        const nlohmann::json h = model_factory(config.model.type).to_json(*setup.model);
        if (h.contains("avg_num_neighbors")) {
          text = fmt::format("{:.6g}{}", h.at("avg_num_neighbors").get<double>(), text == "0" ? " (training set)" : "");
        }
      }
      keys += fmt::format("{}{} {}", keys.empty() ? "" : ", ", k.name, text);
    }
    return fmt::format("{}: {}, cutoff {} Å; {} parameters", config.model.type, keys,
                       config.model.cutoff, setup.num_parameters);
  }
}

/// Spike skipping, EMA and stage two in words; "" when none is on.
std::string updates_text(const TrainingSetup& setup) {
  const TrainingConfig& tc = setup.config.training;
  std::string extras;
  if (setup.spike_hook) {
    extras += fmt::format("spike skipping k {} window {} min_history {}", tc.spike_skipping.k,
                          tc.spike_skipping.window, tc.spike_skipping.min_history);
  }
  if (setup.ema_hook) {
    extras += fmt::format("{}EMA decay {} every {} from step {}{}", extras.empty() ? "" : "; ",
                          tc.ema.decay, tc.ema.update_every, tc.ema.start_step,
                          tc.ema.use_for_validation ? " (validation and model.pt use it)" : "");
    if (tc.ema.warmup) extras += ", warmup min(decay, (1+k)/(10+k))";
  }
  if (setup.stage_two_start) {
    extras += fmt::format("{}stage two from epoch {} (counted from 0): lr {}, weights energy {} "
                          "forces {} stress {}",
                          extras.empty() ? "" : "; ", *setup.stage_two_start, tc.stage_two.lr,
                          tc.stage_two.energy_weight, tc.stage_two.forces_weight,
                          tc.stage_two.stress_weight);
  }
  return extras;
}

}  // namespace

void write_run_header(std::ostream& out, const TrainingSetup& setup, const fs::path& run_dir,
                      int64_t target_steps) {
  const Config& config = setup.config;
  const TrainingConfig& tc = config.training;
  const auto& train = setup.train;
  const auto& valid = setup.valid;
  const LabelCounts& tl = setup.train_labels;
  const LabelCounts& vl = setup.valid_labels;
  const auto& elements = setup.elements;
  const at::Tensor& e0 = setup.e0;
  const double scale = setup.scale, shift = setup.shift;
  const std::string& train_path = config.data.train_file;
  const std::string dtype_name = ::crucible::dtype_name(setup.dtype);
  const at::Device device = setup.device;
  std::string elem_text, e0_text;
  for (int64_t z : elements) {
    elem_text += (elem_text.empty() ? "" : " ") + chemical_symbol(z);
    e0_text += fmt::format("{}{} {:.6f}", e0_text.empty() ? "" : ", ", chemical_symbol(z),
                           e0[z].item<double>());
  }
  out << "crucible train\n";
  out << fmt::format("  data       {} ({})\n", train_path, setup.split_text);
  out << fmt::format("  train      {} structures, {} atoms (energy {}, forces {}, stress {})\n",
                     train.size(), tl.atoms, tl.energy, tl.forces, tl.stress);
  out << fmt::format("  validation {} structures, {} atoms (energy {}, forces {}, stress {})\n",
                     valid.size(), vl.atoms, vl.energy, vl.forces, vl.stress);
  out << fmt::format("  units      energy {}, forces {}, stress {} (converted to eV, eV/Å, eV/Å³)\n",
                     config.data.energy_unit.to_string(), config.data.forces_unit.to_string(),
                     config.data.stress_unit.to_string());
  out << fmt::format("  elements   {}\n", elem_text);
  out << fmt::format("  E0 (eV)    {} ({})\n", e0_text, setup.e0_source);
  out << fmt::format("  scale      {:.6g} eV, shift {:.6g} eV/atom ({})\n", scale, shift,
                     config.model.init_from ? std::string("the source model's")
                                            : fmt::format("model.scaling {}, model.shift {}",
                                                          config.model.scaling, config.model.shift));
  out << fmt::format("  model      {}\n", model_text(setup));
  out << fmt::format("  loss       {}\n", setup.loss_text);
  out << fmt::format("  optimizer  {} lr {} weight_decay {}; {}; {}\n", tc.optimizer.name,
                     tc.optimizer.lr, tc.optimizer.weight_decay, schedule_text(tc),
                     tc.clip_grad_norm > 0 ? fmt::format("clip_grad_norm {}", tc.clip_grad_norm)
                                           : std::string("no gradient clipping"));
  out << fmt::format("  schedule   {} steps ({} batches/epoch, batch_size {}{}{})\n", target_steps,
                     setup.loader->size(), tc.batch_size,
                     tc.gradient_accumulation_steps > 1
                         ? fmt::format(", {} batches/step", tc.gradient_accumulation_steps)
                         : "",
                     tc.num_epochs ? fmt::format(", {} epochs", *tc.num_epochs) : "");
  if (const std::string u = updates_text(setup); !u.empty()) out << fmt::format("  updates    {}\n", u);
  const std::optional<int64_t> stage_two_start = setup.stage_two_start;
  out << fmt::format("  model.pt   {}{}\n",
                     config.output.model_pt == "best"
                         ? fmt::format("the best validation by {}{} (the last weights in model_last.pt)",
                                       tc.early_stopping.monitor,
                                       stage_two_start ? " within stage two" : "")
                         : std::string("the last weights"),
                     tc.early_stopping.patience > 0
                         ? fmt::format("; early stopping after {} validations without improvement",
                                       tc.early_stopping.patience)
                         : std::string());
  out << fmt::format("  device     {}, {}, CPU threads: {}\n", device.str(),
                     tc.precision ? dtype_name + ", precision " + *tc.precision : tc.dtype,
                     setup.threads.describe());
  out << fmt::format("  memory     {}\n", setup.memory.describe(setup.memory_available));
  out << fmt::format("  run_dir    {}\n", run_dir.string());
}

}  // namespace crucible

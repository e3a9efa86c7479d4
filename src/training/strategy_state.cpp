// TrainingStrategy::state_files / restore_state_files: the run's state as
// named archives of tensors (issue 5).

#include "crucible/training/strategy.h"

#include "crucible/checkpoint/tensor_archive.h"
#include "crucible/training/rng_state.h"
#include "crucible/common/error.h"

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sstream>

namespace crucible {

namespace {

using TensorMap = std::map<std::string, at::Tensor>;

std::string to_bytes(const TensorMap& tensors) {
  torch::serialize::OutputArchive archive;
  for (const auto& [k, t] : tensors) archive.write(k, t.detach().cpu());
  std::ostringstream os;
  archive.save_to(os);
  return os.str();
}

TensorMap from_bytes(const std::map<std::string, std::string>& files, const std::string& name) {
  auto it = files.find(name);
  if (it == files.end()) throw DataError(name + ": the checkpoint must contain it, got no such file");
  TensorMap out;
  checkpoint::require_data_only_archive(it->second, name);  // nothing in it runs
  try {
    torch::serialize::InputArchive archive;
    std::istringstream is(it->second);
    archive.load_from(is);
    for (const auto& key : archive.keys()) {
      at::Tensor t;
      archive.read(key, t);
      out[key] = t;
    }
  } catch (const c10::Error& e) {
    throw DataError(name + ": must be a tensor archive, got unreadable data (" +
                    e.what_without_backtrace() + ")");
  }
  return out;
}

const at::Tensor& entry(const TensorMap& m, const std::string& file, const std::string& key) {
  auto it = m.find(key);
  if (it == m.end()) throw DataError(file + ": must contain '" + key + "', got no such entry");
  return it->second;
}

/// Copies `value` into `target` (no autograd), checking the shape.
void assign(at::Tensor target, const at::Tensor& value, const std::string& file,
            const std::string& key) {
  if (!target.sizes().equals(value.sizes())) {
    std::ostringstream os;
    os << file << ": '" << key << "' must have shape " << target.sizes() << ", got "
       << value.sizes();
    throw DataError(os.str());
  }
  at::NoGradGuard no_grad;
  target.copy_(value.to(target.device(), target.scalar_type()));
}

at::Tensor name_tensor(const std::string& name) {
  std::vector<uint8_t> bytes(name.begin(), name.end());
  return at::tensor(std::vector<int64_t>(bytes.begin(), bytes.end()), at::kLong);
}

std::string tensor_name(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  std::string out;
  for (int64_t i = 0; i < c.numel(); ++i) out.push_back(static_cast<char>(c.data_ptr<int64_t>()[i]));
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> TrainingStrategy::optimizer_state_files() {
  std::vector<std::pair<std::string, std::string>> files;
  // Gradients of parameters no optimizer owns never land in a checkpoint
  // (seed 002 clears them before each batch).
  const std::set<const void*> owned = optimizer_owned_parameters();
  for (auto& [name, m] : models_) {
    TensorMap grads;
    for (const auto& item : m->module().named_parameters(true)) {
      const bool kept = optimizers_.empty() || owned.count(item.value().unsafeGetTensorImpl()) > 0;
      if (item.value().grad().defined() && kept) grads[item.key()] = item.value().grad();
    }
    files.emplace_back("grads." + name + ".pt", to_bytes(grads));
  }
  for (size_t i = 0; i < optimizers_.size(); ++i) {
    torch::serialize::OutputArchive archive;
    optimizers_[i]->save(archive);
    std::ostringstream os;
    archive.save_to(os);
    files.emplace_back("optimizer." + std::to_string(i) + ".pt", os.str());
    TensorMap lrs;
    auto& groups = optimizers_[i]->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      lrs[std::to_string(g)] = at::scalar_tensor(groups[g].options().get_lr(), at::kDouble);
    }
    files.emplace_back("optimizer." + std::to_string(i) + ".lr.pt", to_bytes(lrs));
    if (schedulers_[i]) {
      TensorMap sched;
      for (const auto& [k, v] : schedulers_[i]->state_dict()) sched[k] = at::scalar_tensor(v, at::kDouble);
      files.emplace_back("scheduler." + std::to_string(i) + ".pt", to_bytes(sched));
    }
  }
  return files;
}

std::vector<std::pair<std::string, std::string>> TrainingStrategy::state_files() {
  std::vector<std::pair<std::string, std::string>> files;
  files.emplace_back("counters.pt", to_bytes({{"step_count", at::scalar_tensor(step_count, at::kLong)},
                                              {"global_step_count", at::scalar_tensor(global_step_count, at::kLong)},
                                              {"batch_count", at::scalar_tensor(batch_count, at::kLong)},
                                              {"epoch_count", at::scalar_tensor(epoch_count, at::kLong)},
                                              {"epoch_step_count", at::scalar_tensor(epoch_step_count, at::kLong)},
                                              {"world_size", at::scalar_tensor(int64_t{world_size}, at::kLong)},
                                              {"training_finished", at::scalar_tensor(int64_t{end_stage_done_}, at::kLong)},
                                              {"finished_early_at_step", at::scalar_tensor(finished_early_at_step_, at::kLong)}}));
  for (auto& [name, m] : models_) {
    TensorMap weights;
    for (const auto& item : m->module().named_parameters(true)) weights["param." + item.key()] = item.value();
    for (const auto& item : m->module().named_buffers(true)) weights["buffer." + item.key()] = item.value();
    files.emplace_back("model." + name + ".pt", to_bytes(weights));
  }
  for (auto& f : optimizer_state_files()) files.push_back(std::move(f));
  // Hooks with state, in registration order: "hook.<k>" = the hook's name
  // (bytes), "state.<k>.<key>" = its state.
  TensorMap hooks;
  int64_t k = 0;
  for (const auto& h : registered_hooks()) {
    const auto state = h->hook_state();
    if (state.empty()) continue;
    hooks["hook." + std::to_string(k)] = name_tensor(h->name());
    for (const auto& [key, t] : state) hooks["state." + std::to_string(k) + "." + key] = t;
    ++k;
  }
  files.emplace_back("hooks.pt", to_bytes(hooks));
  // The CPU generator ("cpu") and, in CUDA builds, each visible GPU's ("cuda:<i>").
  const TensorMap rngs = capture_rng_states();
  files.emplace_back("rng.pt", to_bytes(rngs));
  return files;
}

void TrainingStrategy::restore_state_files(const std::map<std::string, std::string>& files) {
  ensure_precision_hook();  // the hook set as run() will have it
  // Read and check everything first, then apply.
  const TensorMap counters = from_bytes(files, "counters.pt");
  std::map<std::string, TensorMap> weights;
  for (auto& [name, m] : models_) {
    const std::string file = "model." + name + ".pt";
    weights[name] = from_bytes(files, file);
    for (const auto& item : m->module().named_parameters(true)) entry(weights[name], file, "param." + item.key());
    for (const auto& item : m->module().named_buffers(true)) entry(weights[name], file, "buffer." + item.key());
  }
  // Each saved hook state goes to the next registered hook of that name
  // (registration order); registered hooks without a saved state keep theirs.
  const TensorMap hooks = from_bytes(files, "hooks.pt");
  const auto registered = registered_hooks();
  std::vector<std::pair<size_t, TensorMap>> hook_states;
  size_t next = 0;
  for (int64_t k = 0; hooks.count("hook." + std::to_string(k)) > 0; ++k) {
    const std::string saved = tensor_name(hooks.at("hook." + std::to_string(k)));
    while (next < registered.size() && registered[next]->name() != saved) ++next;
    if (next == registered.size()) {
      throw DataError("hooks.pt: holds the state of hook '" + saved +
                      "', which this run does not register (in this order); register the "
                      "same hooks as the checkpointed run");
    }
    TensorMap state;
    const std::string prefix = "state." + std::to_string(k) + ".";
    for (const auto& [key, t] : hooks) {
      if (key.rfind(prefix, 0) == 0) state[key.substr(prefix.size())] = t;
    }
    hook_states.emplace_back(next++, std::move(state));
  }
  const TensorMap rng = from_bytes(files, "rng.pt");
  check_optimizer_files(files);
  std::map<std::string, int64_t> saved;
  for (const char* key :
       {"step_count", "global_step_count", "batch_count", "epoch_count", "epoch_step_count"}) {
    saved[key] = entry(counters, "counters.pt", key).item<int64_t>();
    if (saved[key] < 0) {
      throw DataError(std::string("counters.pt: '") + key + "' must be >= 0, got " +
                      std::to_string(saved[key]));
    }
  }

  step_count = saved["step_count"];
  global_step_count = saved["global_step_count"];
  batch_count = saved["batch_count"];
  epoch_count = saved["epoch_count"];
  epoch_step_count = saved["epoch_step_count"];
  // Absent in checkpoints written before it existed: the end stage is pending.
  end_stage_done_ = counters.count("training_finished") && counters.at("training_finished").item<int64_t>() != 0;
  finished_early_at_step_ = counters.count("finished_early_at_step")
                                ? counters.at("finished_early_at_step").item<int64_t>()
                                : -1;
  // Another world size: run() re-bases the position in the epoch (issue 6).
  saved_world_size_.reset();
  if (counters.count("world_size")) {
    const int64_t saved = counters.at("world_size").item<int64_t>();
    if (saved != world_size) saved_world_size_ = saved;
  }
  // Seed 002 from_checkpoint_dict: a missing global count follows from the steps.
  if (global_step_count == 0 && step_count > 0) {
    global_step_count = step_count * saved_world_size_.value_or(world_size);
  }
  for (auto& [name, m] : models_) {
    const std::string file = "model." + name + ".pt";
    for (auto& item : m->module().named_parameters(true)) {
      assign(item.value(), weights[name].at("param." + item.key()), file, item.key());
    }
    for (auto& item : m->module().named_buffers(true)) {
      assign(item.value(), weights[name].at("buffer." + item.key()), file, item.key());
    }
  }
  for (const auto& [i, state] : hook_states) {
    try {
      registered[i]->load_hook_state(state);
    } catch (const std::invalid_argument& e) {
      throw DataError("hooks.pt: hook '" + registered[i]->name() + "': " + e.what());
    }
  }
  (void)entry(rng, "rng.pt", "cpu");  // required; CUDA states of GPUs this process lacks are skipped
  restore_rng_states(rng);
  // Optimizer, scheduler and gradient state wait for the optimizers.
  pending_state_.clear();
  for (const auto& [name, bytes] : files) {
    if (name.rfind("optimizer.", 0) == 0 || name.rfind("scheduler.", 0) == 0 ||
        name.rfind("grads.", 0) == 0) {
      pending_state_[name] = bytes;
    }
  }
  restored_ = true;
  if (!optimizers_.empty()) apply_pending_optimizer_state();
}

void TrainingStrategy::check_optimizer_files(const std::map<std::string, std::string>& files) const {
  // Seed 002 _restore_runtime_optimizers_from_loaded_state: as many optimizer
  // (and scheduler) states as the configuration builds, no more, no fewer.
  size_t saved_optimizers = 0;
  while (files.count("optimizer." + std::to_string(saved_optimizers) + ".pt") > 0) ++saved_optimizers;
  std::string configured;
  for (const auto& e : entries_) configured += (configured.empty() ? "" : ", ") + e.path;
  // Decode them now (not only when run() builds the optimizers), so a
  // checkpoint whose archive verifies but does not decode is refused while
  // an older one can still be restored (issue 15).
  for (size_t i = 0; i < saved_optimizers; ++i) {
    const std::string file = "optimizer." + std::to_string(i) + ".pt";
    checkpoint::require_data_only_archive(files.at(file), file);
    try {
      torch::serialize::InputArchive archive;
      std::istringstream is(files.at(file));
      archive.load_from(is);
    } catch (const c10::Error& e) {
      throw DataError(file + ": must be an optimizer state archive, got unreadable data (" +
                      e.what_without_backtrace() + ")");
    }
  }
  if (saved_optimizers != entries_.size()) {
    throw DataError("checkpoint: holds " + std::to_string(saved_optimizers) +
                    " optimizer state(s) (optimizer.<i>.pt), but the configuration builds " +
                    std::to_string(entries_.size()) + " (" + configured +
                    "); resume with the optimizer configuration of the checkpointed run");
  }
  for (const auto& [name, bytes] : files) {
    (void)bytes;
    if (name.rfind("scheduler.", 0) != 0) continue;
    const std::string index = name.substr(10, name.size() - 10 - 3);
    size_t i = 0;
    try {
      i = std::stoul(index);
    } catch (const std::exception&) {
      i = entries_.size();
    }
    if (i >= entries_.size() || !entries_[i].config.scheduler) {
      throw DataError(name + ": the checkpoint holds a scheduler state for optimizer " + index +
                      ", but the configuration has no scheduler there (" + configured +
                      "); resume with the scheduler configuration of the checkpointed run");
    }
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    const std::string file = "scheduler." + std::to_string(i) + ".pt";
    if (entries_[i].config.scheduler && files.count(file) == 0) {
      throw DataError(file + ": the configuration has a scheduler (" + entries_[i].scheduler_path +
                      "), but the checkpoint holds no state for it; resume with the scheduler "
                      "configuration of the checkpointed run");
    }
  }
}

void TrainingStrategy::apply_pending_optimizer_state() {
  if (pending_state_.empty()) return;
  const auto files = std::move(pending_state_);
  pending_state_.clear();
  for (size_t i = 0; i < optimizers_.size(); ++i) {
    const std::string file = "optimizer." + std::to_string(i) + ".pt";
    auto it = files.find(file);
    if (it == files.end()) throw DataError(file + ": the checkpoint must contain it, got no such file");
    checkpoint::require_data_only_archive(it->second, file);  // nothing in it runs
    try {
      torch::serialize::InputArchive archive;
      std::istringstream is(it->second);
      archive.load_from(is);
      optimizers_[i]->load(archive);
    } catch (const c10::Error& e) {
      throw DataError(file + ": must be this optimizer's state, got unreadable data (" +
                      e.what_without_backtrace() + ")");
    }
    const std::string lr_file = "optimizer." + std::to_string(i) + ".lr.pt";
    const TensorMap lrs = from_bytes(files, lr_file);
    auto& groups = optimizers_[i]->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      groups[g].options().set_lr(entry(lrs, lr_file, std::to_string(g)).item<double>());
    }
    if (schedulers_[i]) {
      const std::string sfile = "scheduler." + std::to_string(i) + ".pt";
      std::map<std::string, double> state;
      for (const auto& [k, t] : from_bytes(files, sfile)) state[k] = t.item<double>();
      try {
        schedulers_[i]->load_state_dict(state);
      } catch (const std::invalid_argument& e) {
        throw DataError(sfile + ": " + e.what());
      }
    }
  }
  for (auto& [name, m] : models_) {
    const std::string file = "grads." + name + ".pt";
    const TensorMap grads = from_bytes(files, file);
    for (auto& item : m->module().named_parameters(true)) {
      auto it = grads.find(item.key());
      if (it == grads.end()) {
        item.value().mutable_grad() = at::Tensor();
        continue;
      }
      if (!it->second.sizes().equals(item.value().sizes())) {
        throw DataError(file + ": '" + item.key() + "' must have the parameter's shape");
      }
      item.value().mutable_grad() = it->second.to(item.value().options()).clone();
    }
  }
}

}  // namespace crucible

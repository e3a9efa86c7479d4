#pragma once
// Precision plugins (seed 004's interface; Lightning's Precision classes) and
// the precision modes with the aliases of seed 000.

#include "crucible/data/batch.h"
#include "crucible/models/energy_model.h"
#include "crucible/precision/grad_scaler.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace crucible {

/// Precision modes (Lightning's names).
///  - k64True:  everything float64.
///  - k32True:  everything float32.
///  - kBf16Mixed: float32 weights, bfloat16 autocast in the forward.
///  - k16Mixed: float32 weights, float16 autocast + gradient scaler. Where the
///    backend has no fp16 autocast (CPU on LibTorch 1.13) the forward stays
///    float32, the scaler path still runs, and a warning says so once.
///  - kBf16True / k16True: weights and compute in bfloat16 / float16.
enum class PrecisionMode { k64True, k32True, kBf16Mixed, k16Mixed, kBf16True, k16True };

/// Parses a mode or alias (case-insensitive):
/// "64-true" | "64" | "fp64" | "float64" | "double" → k64True;
/// "32-true" | "32" | "fp32" | "float32" | "float" → k32True;
/// "bf16-mixed" | "bf16" | "bfloat16" → kBf16Mixed (seed 000's bf16);
/// "16-mixed" | "16" | "fp16" | "float16" | "half" → k16Mixed (seed 000's fp16);
/// "bf16-true" → kBf16True; "16-true" → k16True. A "torch." prefix is
/// accepted (seed 000 spells dtypes "torch.bfloat16").
/// @throws ConfigError "precision must be one of ..., got '<text>'".
PrecisionMode parse_precision(const std::string& text);

/// Canonical name ("bf16-mixed", ...).
std::string precision_name(PrecisionMode mode);

/// RAII autocast region on `device` with `dtype`: sets the dtype before
/// enabling, restores the previous state on exit and clears the autocast
/// cache when the outermost region ends. A no-op for dtype float32/float64.
class AutocastGuard {
 public:
  AutocastGuard(at::Device device, at::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  /// True if autocast is now active for this region.
  bool active() const { return active_; }

 private:
  bool active_ = false;
  at::DeviceType device_type_ = at::kCPU;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

/// True if this LibTorch can autocast to `dtype` on `device_type`
/// (CPU on 1.13: bfloat16 only).
bool autocast_supported(at::DeviceType device_type, at::ScalarType dtype);

/// loss.backward() into `parameters` only (their .grad accumulate; nothing
/// else does, and the engine runs only the nodes they need); empty: into
/// every leaf that requires grad. Denormals flush to zero during the call and
/// the caller's setting is restored after it (common/denormals.h).
/// @throws c10::Error if a listed tensor
/// does not require grad, or from the backward itself.
void backward_into(const at::Tensor& loss, const std::vector<at::Tensor>& parameters);

/// The precision-specific parts of training (seed 004): module / input /
/// output conversion, forward context, backward, optimizer step, state.
///
/// Float dtypes: `param_dtype()` is what convert_module casts parameters to;
/// `input_dtype()` is the float dtype of batches (positions, cell, shifts):
/// float64 under 64-true, float32 in every other mode, the *-true half modes
/// included (force-safe precision, issue 3 deliverable 4: models cast to
/// their layer dtype inside, see SchNet); outputs are converted to at least
/// float32 so losses reduce in float32 or float64.
class PrecisionPlugin {
 public:
  /// @throws ConfigError for invalid scaler options (16-mixed).
  explicit PrecisionPlugin(PrecisionMode mode, GradScalerOptions scaler_options = {});
  virtual ~PrecisionPlugin() = default;

  PrecisionMode mode() const { return mode_; }
  std::string name() const { return precision_name(mode_); }
  /// Float dtype of the parameters (convert_module, module_init_context).
  virtual at::ScalarType param_dtype() const;
  /// Float dtype of batches (positions, cell, shifts, force and stress
  /// labels): never below float32 (the loop casts a lower one back up, see
  /// convert_input). Energy labels stay float64 in every mode (issue 48).
  virtual at::ScalarType input_dtype() const;
  /// Autocast dtype of the forward, or nullopt when there is no autocast.
  /// A plugin with one gets a MixedPrecisionHook driving it.
  virtual std::optional<at::ScalarType> autocast_dtype() const;

  /// Casts the module's parameters and buffers to param_dtype().
  virtual void convert_module(torch::nn::Module& module) const;
  /// Casts the batch's float tensors to input_dtype() on `device`. The
  /// training loop calls it on every batch (validation too) and casts
  /// positions, cell and shifts that an override left below float32 back to
  /// float32 (forces and stress are derivatives w.r.t. them; one widely used
  /// framework casts every float input and loses them).
  virtual Batch convert_input(const Batch& batch, at::Device device) const;
  /// Casts forces and stress to at least float32 (float64 stays float64)
  /// and the energy and per-atom energies to float64: in every precision
  /// mode energies are summed, compared with their labels and differenced
  /// in the energy loss in float64; only the forces path follows the mode
  /// (issue 48).
  virtual ModelOutputs convert_output(const ModelOutputs& outputs) const;
  /// The autocast region of the forward (and loss), or an inactive guard.
  /// Warns once when 16-mixed cannot autocast on this device.
  virtual std::unique_ptr<AutocastGuard> forward_context(at::Device device) const;
  /// Sets LibTorch's default float dtype to param_dtype() while alive.
  class DefaultDtypeGuard {
   public:
    explicit DefaultDtypeGuard(at::ScalarType dtype);
    ~DefaultDtypeGuard();
    DefaultDtypeGuard(const DefaultDtypeGuard&) = delete;
    DefaultDtypeGuard& operator=(const DefaultDtypeGuard&) = delete;

   private:
    caffe2::TypeMeta previous_;
  };
  /// Seed 004 module_init_context: module parameters created while the
  /// guard lives get param_dtype(). The default enters tensor_init_context()
  /// (so an override of that one applies to modules too). build_training
  /// creates the run's model under it.
  virtual std::unique_ptr<DefaultDtypeGuard> module_init_context() const;
  /// Seed 004 tensor_init_context: tensors created while the guard lives get
  /// param_dtype() (LibTorch's default float dtype).
  virtual std::unique_ptr<DefaultDtypeGuard> tensor_init_context() const;

  /// Before backward: returns the loss to back-propagate (scaled under 16-mixed).
  virtual at::Tensor pre_backward(const at::Tensor& loss);
  /// Runs backward on `loss` (already passed through pre_backward): seed
  /// 004's backward(tensor, model), with the model given as the parameters
  /// that need the gradients (every trained model's, so a strategy with
  /// several models is served by one call). Only their .grad change; the
  /// engine skips the work that only other leaves need, such as the
  /// positions and strain of a force computation (their gradients in a
  /// force loss are second derivatives nobody reads). Empty `parameters`:
  /// every leaf that requires grad (loss.backward()).
  /// @throws c10::Error if a listed tensor does not require grad.
  virtual void backward(const at::Tensor& loss, const std::vector<at::Tensor>& parameters);
  /// After backward (no-op by default).
  virtual void post_backward(const at::Tensor& loss);
  /// Unscales `optimizer`'s gradients if a scaler is active (before clipping).
  void unscale_gradients(torch::optim::Optimizer& optimizer);
  /// Steps `optimizer` (through the scaler under 16-mixed, which skips
  /// non-finite steps and updates its scale). Returns whether the step ran.
  virtual bool optimizer_step(torch::optim::Optimizer& optimizer);
  /// The parameters the optimizer updates (its own parameters here): what
  /// gradient clipping, spike skipping and gradient averaging iterate over
  /// (optimizer_parameters in training/update_hook.h).
  virtual std::vector<at::Tensor> main_params(torch::optim::Optimizer& optimizer) const;
  /// Seed 004 state_dict: the plugin's state for checkpoints. The default
  /// holds the scaler's ("scale", "_growth_tracker", ...), empty without
  /// one; a plugin with its own state overrides both (and calls these for
  /// the scaler's). Checkpointed through the MixedPrecisionHook that drives
  /// the plugin (hook state "hooks.pt"): the strategy registers one for a
  /// plugin with an autocast dtype, a user registers one for any other.
  virtual std::map<std::string, double> state_dict() const;
  /// Restores state_dict(). @throws std::invalid_argument if the state has
  /// no scaler keys under 16-mixed.
  virtual void load_state_dict(const std::map<std::string, double>& state);
  /// End of a run (TrainingStrategy::run calls it last, also after an
  /// exception): releases the scaler, keeping its state_dict() (a later
  /// scaler starts from it, and checkpoints taken after the run hold it).
  virtual void teardown();
  /// The gradient scaler (16-mixed only; built lazily), or null.
  GradScaler* scaler() { return scaler_.get(); }
  const GradScaler* scaler() const { return scaler_.get(); }

 private:
  PrecisionMode mode_;
  GradScalerOptions scaler_options_;
  std::unique_ptr<GradScaler> scaler_;
  std::optional<std::map<std::string, double>> pending_state_;
};

/// `batch` with positions, cell and shifts that are below float32 (float16,
/// bfloat16) cast to float32; everything else unchanged. What the loop
/// applies after every PrecisionPlugin::convert_input. Never throws.
Batch keep_geometry_float32(Batch batch);

/// The mode of an autocast / parameter dtype (seed 000's MixedPrecisionHook
/// takes a dtype): float32 → 32-true, bfloat16 → bf16-mixed, float16 →
/// 16-mixed, float64 → 64-true. @throws ConfigError for another dtype.
PrecisionMode precision_from_dtype(at::ScalarType dtype);

/// Builds the plugin for a mode or alias. @throws ConfigError.
std::unique_ptr<PrecisionPlugin> make_precision_plugin(const std::string& mode,
                                                       GradScalerOptions scaler_options = {});

}  // namespace crucible

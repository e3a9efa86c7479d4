#pragma once
// Dynamic loss scaling for fp16 mixed-precision training.
//
// Semantics follow PyTorch's torch.cuda.amp.GradScaler (1.13): scale the loss
// before backward(), unscale the gradients of each optimizer once per
// iteration while checking them for inf/NaN, skip the optimizer step of an
// iteration whose gradients overflowed, then grow or back off the scale in
// update(). The scaler is constructed lazily by the mixed-precision hook of
// seed 000 (MixedPrecisionHook) and queried by scaler-aware stepping (seed
// 001) to know whether an optimizer step was skipped.
//
// Device-agnostic: the scale tensor lives on the device of the first loss
// passed to scale(). On CUDA the fused ATen kernels
// (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_) are used;
// on every other device (they have no CPU kernel in 1.13) plain tensor ops
// with the same results.

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace crucible {

/// Construction options of GradScaler; defaults are PyTorch's.
struct GradScalerOptions {
  double init_scale = 65536.0;     ///< initial scale, 2^16; finite and > 0.
  double growth_factor = 2.0;      ///< scale multiplier after growth_interval clean steps; finite, > 1.
  double backoff_factor = 0.5;     ///< scale multiplier after an inf/NaN step; in (0, 1).
  int64_t growth_interval = 2000;  ///< consecutive clean steps before growth; >= 1.
  bool enabled = true;             ///< false: identity scale, step() just steps.

  /// Checks every value (also when !enabled, so a bad config fails early).
  /// @throws ConfigError naming the option and the bad value, e.g.
  ///   "growth_factor must be > 1, got 0.5",
  ///   "backoff_factor must be in (0, 1), got 1.5",
  ///   "init_scale must be finite and > 0, got -1",
  ///   "growth_interval must be >= 1, got 0".
  void validate() const;
};

/// Gradient scaler (PyTorch GradScaler semantics; seed 000 / 001).
///
/// Typical iteration:
///   scaler.scale(loss).backward();
///   scaler.unscale(opt);            // optional, e.g. before gradient clipping
///   bool stepped = scaler.step(opt);
///   scaler.update();
///
/// State: a float32 scale tensor of shape [1] and an int32 growth tracker of
/// shape [1], both created lazily on the first loss's device; per-optimizer
/// (keyed by address) stage READY → UNSCALED → STEPPED and found-inf flag,
/// cleared by update(). Not thread-safe.
class GradScaler {
 public:
  /// @throws ConfigError if `options` is invalid (see GradScalerOptions::validate).
  explicit GradScaler(GradScalerOptions options = {});

  /// Returns loss * scale. Any shape; the result keeps the loss's shape and
  /// has dtype promote(loss.dtype, float32) (fp16/bf16 losses are scaled in
  /// float32; float64 stays float64); autograd flows through. The first call
  /// creates the scale on loss.device(). Disabled: returns `loss` unchanged.
  /// @throws std::invalid_argument if `loss` is undefined or not floating point.
  at::Tensor scale(const at::Tensor& loss);

  /// Divides, in place, every defined gradient of `optimizer`'s parameters by
  /// the scale (multiplies by inv_scale = float32(1 / float64(scale)); fp16 /
  /// bf16 gradients are upcast to float32 for the multiply and written back)
  /// and records whether any of them held inf/NaN (checked before unscaling).
  /// Undefined gradients are skipped; for sparse gradients the values are
  /// unscaled (fp16 sparse gradients are coalesced first, replacing .grad).
  /// Disabled: no-op.
  /// @throws std::logic_error "unscale() has already been called on this
  ///   optimizer since the last update()" on a second call, "unscale() is
  ///   being called after step()" after step(), and if scale() was never called.
  void unscale(torch::optim::Optimizer& optimizer);

  /// Unscales `optimizer` if unscale() was not called for it this iteration,
  /// then runs optimizer.step() unless an inf/NaN gradient was found.
  /// Returns whether optimizer.step() ran. Disabled: steps and returns true.
  /// optimizer.step() is called without a closure (as in PyTorch, closures
  /// are not supported; LBFGS therefore cannot be driven by the scaler).
  /// @throws std::logic_error "step() has already been called on this
  ///   optimizer since the last update()" on a second call, if the optimizer
  ///   has no defined gradient ("No inf checks were recorded for this
  ///   optimizer"), and if scale() was never called.
  bool step(torch::optim::Optimizer& optimizer);

  /// Updates the scale from this iteration's inf checks (all optimizers):
  /// any inf/NaN → scale *= backoff_factor, tracker = 0; otherwise tracker
  /// += 1 and when it reaches growth_interval → scale *= growth_factor
  /// (only if the float32 result is finite), tracker = 0. Clears the
  /// per-optimizer state. Disabled: no-op.
  /// @throws std::logic_error if scale() was never called or no optimizer
  ///   was unscaled/stepped since the last update().
  void update();

  /// Sets the scale to `new_scale` (tracker untouched) and clears the
  /// per-optimizer state (PyTorch update(new_scale)). Disabled: no-op.
  /// @throws std::logic_error if scale() was never called;
  ///   std::invalid_argument if new_scale is not finite and > 0.
  void update(double new_scale);

  /// Current scale (init_scale before the first scale()); 1.0 if disabled.
  double get_scale() const;
  /// Consecutive clean steps since the last growth/backoff; 0 if disabled.
  int64_t get_growth_tracker() const;
  double get_growth_factor() const { return options_.growth_factor; }
  double get_backoff_factor() const { return options_.backoff_factor; }
  int64_t get_growth_interval() const { return options_.growth_interval; }
  bool is_enabled() const { return options_.enabled; }

  /// Whether unscale()/step() found inf/NaN in `optimizer`'s gradients since
  /// the last update(); std::nullopt if it was not unscaled since then (or the
  /// scaler is disabled). Lets scaler-aware stepping (seed 001) know which
  /// optimizer steps were skipped. Synchronizes with the device.
  std::optional<bool> found_inf(const torch::optim::Optimizer& optimizer) const;

  /// PyTorch's state dict: "scale", "growth_factor", "backoff_factor",
  /// "growth_interval", "_growth_tracker" (integers stored as doubles).
  /// Empty if disabled. Take it after update().
  std::map<std::string, double> state_dict() const;

  /// Restores a state_dict() (also before the first scale(): the values are
  /// used when the scale is created). Disabled: no-op.
  /// @throws std::invalid_argument if `state` is empty ("... saved from a
  ///   disabled GradScaler"), lacks a key (named), or has a negative or
  ///   non-integral "_growth_tracker"; ConfigError for invalid option values.
  void load_state_dict(const std::map<std::string, double>& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct OptimizerState {
    Stage stage = Stage::kReady;
    at::Tensor found_inf;  ///< float32 [1] on the scale's device; undefined if no grads.
  };

  void require_scale(const char* caller) const;
  void unscale_grads(torch::optim::Optimizer& optimizer, OptimizerState& state);

  GradScalerOptions options_;
  int64_t init_growth_tracker_ = 0;
  at::Tensor scale_;           ///< float32 [1]; undefined until the first scale().
  at::Tensor growth_tracker_;  ///< int32 [1]; created with scale_.
  std::map<const torch::optim::Optimizer*, OptimizerState> per_optimizer_;
};

}  // namespace crucible

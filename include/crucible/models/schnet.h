#pragma once
// SchNet (Schütt et al., J. Chem. Phys. 148, 241722 (2018)).

#include "crucible/models/energy_model.h"
#include "crucible/models/energy_normalization.h"
#include "crucible/models/model_params.h"

#include <ATen/ATen.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <vector>
#include <algorithm>

namespace crucible {

/// SchNet hyperparameters (defaults inline).
struct SchNetOptions {
  int64_t hidden_channels = 64;   ///< atom feature size F. Default 64.
  int64_t num_filters = 64;       ///< filter size of cfconv. Default 64.
  int64_t num_interactions = 3;   ///< interaction blocks T. Default 3.
  int64_t num_gaussians = 20;     ///< Gaussian radial basis size. Default 20.
  double cutoff = 5.0;            ///< cosine cutoff radius, Å. Default 5.
  int64_t max_atomic_number = 118;///< embedding table covers Z = 0..max. Default 118.
  /// Differentiate everything with autograd's generic derivatives (the
  /// reference path the hand-written derivatives are tested against,
  /// issue 7). Not a config key. Default false.
  bool reference_autograd = false;
};

/// SchNet energy model.
///
/// Per atom: x_i = Embed(Z_i); T interaction blocks
///   v_i = Σ_j W(r_ij) ⊙ (x_j W1),  W(r) = Dense(ssp(Dense(g(r)))) · f_c(r)
///   x_i += Dense(ssp(Dense(v_i)))
/// with Gaussian basis g_k(r) = exp(-γ (r - μ_k)²), μ_k evenly spaced on
/// [0, cutoff], γ = 0.5 / Δμ², cosine cutoff f_c(r) = ½(cos(πr/r_c)+1) for
/// r < r_c, shifted softplus ssp(x) = ln(½eˣ + ½). Atom-wise output
/// y_i = Dense(ssp(Dense(x_i))) → scalar; then
///   E = Σ_i (scale · y_i + shift + E0[Z_i])   (eV),
/// where E0 (per-element reference energies), scale and shift are buffers set
/// from training data (see `fit_reference_energies`).
///
/// Precision (issue 3, deliverable 4): edge vectors, distances, the Gaussian
/// basis, the cosine cutoff, scale/shift/E0 and the per-structure energy sum
/// run with autocast off in the dtype of `batch.positions`; only the Linear /
/// embedding layers run in the parameters' dtype or, inside a mixed-precision
/// autocast region, in autocast's dtype. The energy has the positions' dtype.
class SchNetImpl : public torch::nn::Cloneable<SchNetImpl>, public EnergyModel {
 public:
  /// Parameters are created in float32 (call `to(at::kDouble)` for float64).
  /// @throws std::invalid_argument if hidden_channels < 2, num_filters < 1,
  ///         num_interactions < 0, num_gaussians < 2, cutoff <= 0 or not
  ///         finite, or max_atomic_number < 1.
  explicit SchNetImpl(SchNetOptions options = {});
  void reset() override;

  at::Tensor energy(const Batch& batch) override;
  torch::nn::Module& module() override { return *this; }
  double cutoff() const override { return options_.cutoff; }
  /// max(1, num_interactions) × cutoff, Å.
  double interaction_range() const override { return static_cast<double>(std::max<int64_t>(1, options_.num_interactions)) * options_.cutoff; }
  std::string name() const override { return "schnet"; }
  /// Deep copy through torch::nn::Cloneable::clone (same device and dtype).
  std::shared_ptr<EnergyModel> clone_model() const override;
  /// Atomic numbers Z with a nonzero reference energy E0[Z] (set by
  /// set_energy_normalization; all E0 zero = empty = any element).
  std::vector<int64_t> elements() const override;

  /// Per-atom learned contribution scale · y_i + shift, [N] (no E0).
  at::Tensor atomic_energies(const Batch& batch);
  /// Sets E0 ([max_atomic_number+1] eV, index = Z; copied into the buffer's
  /// dtype/device), scale (eV) and shift (eV/atom).
  /// @throws std::invalid_argument on a wrong e0 shape or non-finite scale/shift.
  void set_energy_normalization(const at::Tensor& e0, double scale, double shift) override;
  /// atomic_energies + E0[Z], [N] eV.
  at::Tensor node_energies(const Batch& batch) override;
  const SchNetOptions& options() const { return options_; }

 private:
  SchNetOptions options_;
  torch::nn::Embedding embedding_{nullptr};
  torch::nn::ModuleList filter1_, filter2_, in2f_, f2out_, dense_;
  torch::nn::Linear out1_{nullptr}, out2_{nullptr};
  at::Tensor offsets_, e0_, scale_, shift_;
};
TORCH_MODULE(SchNet);

/// SchNet options from the model.schnet.* values (ModelConfig::params) and
/// the cutoff (Å). @throws std::invalid_argument if a key is missing.
SchNetOptions schnet_options(const ModelParams& params, double cutoff);

}  // namespace crucible

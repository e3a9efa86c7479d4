#pragma once
// SchNet (Schütt et al., J. Chem. Phys. 148, 241722 (2018)).

#include "crucible/models/energy_model.h"
#include "crucible/models/energy_normalization.h"
#include "crucible/models/model_params.h"
#include "crucible/models/mace/radial_spline.h"
#include "crucible/models/spline_cache.h"

#include <ATen/ATen.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace crucible {

/// SchNet hyperparameters (defaults inline).
struct SchNetOptions {
  int64_t hidden_channels = 64;   ///< atom feature size F. Default 64.
  int64_t num_filters = 64;       ///< filter size of cfconv. Default 64.
  int64_t num_interactions = 3;   ///< interaction blocks T. Default 3.
  int64_t num_gaussians = 20;     ///< Gaussian radial basis size. Default 20.
  double cutoff = 5.0;            ///< cosine cutoff radius, Å. Default 5.
  int64_t max_atomic_number = 118;///< embedding table covers Z = 0..max. Default 118.
  /// Adds the ZBL screened nuclear repulsion (models/zbl.h, MACE's form and
  /// constants, envelope order SchNetImpl::kZblEnvelopeP) to every atom's
  /// energy after scale and shift: V_i = ½ Σ_j V_ZBL(r_ij) f(r_ij / (R_i + R_j)).
  /// Config model.schnet.pair_repulsion. Default false.
  bool pair_repulsion = false;
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
  /// Order p of the ZBL term's polynomial envelope (MACE's default
  /// num_polynomial_cutoff).
  static constexpr int64_t kZblEnvelopeP = 5;
  void reset() override;

  at::Tensor energy(const Batch& batch) override;
  torch::nn::Module& module() override { return *this; }
  /// torch::nn::Module::to, except that E0, scale, shift and the ZBL
  /// constants stay float64 (module_to_keeping_float64): the layers take
  /// `dtype`, the energy sums not.
  using torch::nn::Module::to;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override {
    module_to_keeping_float64(*this, float64_buffers(), device, dtype, non_blocking);
  }
  void to(torch::Dtype dtype, bool non_blocking = false) override {
    module_to_keeping_float64(*this, float64_buffers(), std::nullopt, dtype, non_blocking);
  }
  double cutoff() const override { return options_.cutoff; }
  /// max(1, num_interactions) × cutoff, Å.
  double interaction_range() const override { return static_cast<double>(std::max<int64_t>(1, options_.num_interactions)) * options_.cutoff; }
  std::string name() const override { return "schnet"; }
  /// Deep copy through torch::nn::Cloneable::clone (same device and dtype).
  std::shared_ptr<EnergyModel> clone_model() const override;
  /// Atomic numbers Z with a nonzero reference energy E0[Z] (set by
  /// set_energy_normalization; all E0 zero = empty = any element).
  std::vector<int64_t> elements() const override;

  /// Per-atom learned contribution scale · y_i + shift, [N] eV float64 (no
  /// E0; y_i in the layers' dtype, scaled and shifted in float64).
  at::Tensor atomic_energies(const Batch& batch);
  /// Sets E0 ([max_atomic_number+1] eV, index = Z; kept in float64 on the
  /// model's device), scale (eV) and shift (eV/atom).
  /// @throws std::invalid_argument on a wrong e0 shape or non-finite scale/shift.
  void set_energy_normalization(const at::Tensor& e0, double scale, double shift) override;
  /// atomic_energies + E0[Z], [N] eV float64.
  at::Tensor node_energies(const Batch& batch) override;
  const SchNetOptions& options() const { return options_; }

  /// Inference path (issue 48): interaction t's filter W_t(r) =
  /// (ssp(g(r) W1ᵀ + b1) W2ᵀ + b2) · f_c(r) [num_filters per distance, r in
  /// Å] as a quintic Hermite spline of the distance on [0, cutoff]
  /// (mace::tabulate_radial with Origin::kSmooth, relative value error
  /// ≤ 1e-9, derivatives ≤ 1e-7; the nodes' derivatives analytic: g' =
  /// -2γ(r - μ) g, ssp' = σ, f_c' = -½(π/r_c) sin(πr/r_c) and their second
  /// derivatives), in the layers' dtype, built from the current weights on
  /// first use and rebuilt after a filter weight changes (storage or
  /// version). The per-pair filter network (two dense layers forward, again
  /// in the backward, and its reverse pass) becomes one quintic per filter
  /// value and one slope dot. nullptr when splines are off
  /// (set_filter_spline(false), or the environment's
  /// CRUCIBLE_RADIAL_SPLINE=0): then the network runs per distance pair,
  /// the exact reference. Thread-safe. @throws std::out_of_range for t
  /// outside 0..num_interactions-1.
  std::shared_ptr<const mace::RadialSpline> filter_spline(int64_t t) const;
  /// Turns the inference path's filter splines on or off (this model and
  /// its later clones). Never throws.
  void set_filter_spline(bool on) { filter_spline_ = on; }
  /// Whether the inference path uses filter_spline(): set_filter_spline's
  /// value, else CRUCIBLE_RADIAL_SPLINE (0 = off), else on.
  bool filter_spline_enabled() const;

 private:
  /// e0_, scale_, shift_ and the defined zbl_* buffers: kept float64 by to().
  std::vector<at::Tensor> float64_buffers() const {
    std::vector<at::Tensor> out{e0_, scale_, shift_};
    for (const at::Tensor* t : {&zbl_c_, &zbl_a_exp_, &zbl_a_prefactor_, &zbl_covalent_radii_})
      if (t->defined()) out.push_back(*t);
    return out;
  }
  SchNetOptions options_;
  torch::nn::Embedding embedding_{nullptr};
  torch::nn::ModuleList filter1_, filter2_, in2f_, f2out_, dense_;
  torch::nn::Linear out1_{nullptr}, out2_{nullptr};
  at::Tensor offsets_, e0_, scale_, shift_;
  at::Tensor zbl_c_, zbl_a_exp_, zbl_a_prefactor_, zbl_covalent_radii_;  // pair_repulsion: ZblParameters
  std::shared_ptr<SplineCache> spline_cache_ = std::make_shared<SplineCache>();
  std::optional<bool> filter_spline_;
};
TORCH_MODULE(SchNet);

/// SchNet options from the model.schnet.* values (ModelConfig::params) and
/// the cutoff (Å). @throws std::invalid_argument if a key is missing.
SchNetOptions schnet_options(const ModelParams& params, double cutoff);

}  // namespace crucible

#pragma once
// Energy-model interface and autograd forces / stress.

#include "crucible/data/batch.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace crucible {

/// A machine-learned potential: a batch in, per-structure energy out.
///
/// Implementations compute edge vectors with `edge_vectors(batch)` so that
/// the strain applied by `compute_outputs` reaches both positions and cell.
class EnergyModel {
 public:
  virtual ~EnergyModel() = default;
  /// Per-structure total energy [B] (eV), float64 in every precision mode
  /// (issue 48): E0s, per-atom energies and their sums are float64 while the
  /// layers run in the model's dtype, so a float32 model's 10^4-atom total
  /// is not quantized by float32's spacing (1 eV at 10^7 eV). Forces and
  /// stress keep the positions' dtype.
  virtual at::Tensor energy(const Batch& batch) = 0;
  /// The torch module holding parameters and buffers.
  virtual torch::nn::Module& module() = 0;
  /// Neighbor-list cutoff, Å.
  virtual double cutoff() const = 0;
  /// Interaction range, Å: an atom's energy depends only on atoms within
  /// this distance of it. num_interactions × cutoff for message passing
  /// (each layer reaches one cutoff further); the default, cutoff(), holds
  /// for a model without message passing. Domain decomposition (the KIM
  /// model's influence distance, docs/deployment_kim.md) relies on it.
  /// Never throws.
  virtual double interaction_range() const { return cutoff(); }
  /// Short name ("schnet").
  virtual std::string name() const = 0;
  /// A deep copy (parameters, buffers, options) on the same device and
  /// dtype, or null if the model cannot be copied (the default). The EMA
  /// hook publishes its average through such a copy. Never throws for a
  /// model that implements it.
  virtual std::shared_ptr<EnergyModel> clone_model() const { return nullptr; }
  /// Atomic numbers the model was set up for (e.g. those with a reference
  /// energy E0), ascending; empty = not known / any. Checkpoint validators
  /// compare it (same_models_validator). Never throws.
  virtual std::vector<int64_t> elements() const { return {}; }
  /// Sets the energy normalization fitted on the training data: E0 [119]
  /// eV (index Z), scale (eV) and shift (eV/atom), as
  /// E = Σ_i (E0[Z_i] + scale · y_i + shift). @throws std::invalid_argument
  /// on a wrong shape or non-finite values, std::logic_error if the model
  /// has no such normalization (the default).
  virtual void set_energy_normalization(const at::Tensor& e0, double scale, double shift);
  /// Per-atom energies [N] (eV, float64 as energy()) whose sum over each
  /// structure is energy(batch): E0[Z_i] + the learned contribution of atom
  /// i (ASE's "energies"). @throws std::logic_error if the model has none
  /// (the default).
  virtual at::Tensor node_energies(const Batch& batch);
};

/// Module::to(device, dtype) for a model whose energy normalization (E0,
/// scale, shift) stays float64 whatever the layers' dtype (issue 48):
/// converts everything as torch::nn::Module::to does, then puts the
/// float64 values of `float64_buffers` (taken before the conversion, so
/// nothing is rounded through float32) back on the new device. `dtype`
/// nullopt: the device alone changes. Never throws for a floating dtype.
void module_to_keeping_float64(torch::nn::Module& module, const std::vector<at::Tensor>& float64_buffers,
                               std::optional<at::Device> device, std::optional<at::ScalarType> dtype,
                               bool non_blocking);

/// RAII scope in which autocast is off on every device (CPU, CUDA, XPU),
/// whatever region encloses it; the previous state returns on exit. Used for
/// the force-safe parts of a model (issue 3, deliverable 4): geometry (edge
/// vectors, distances, radial basis, cutoff), the strain, the per-atom →
/// per-structure energy sum and the autograd derivatives then run in the
/// dtype of the positions (float32 or float64), while only the inner layers
/// follow a mixed-precision region (seed 000's autocast from BEFORE_BATCH to
/// DO_BACKWARD). Excludes the autocast dispatch keys, which is what
/// disabling autocast does in LibTorch 1.13 and 2.x. Never throws.
class AutocastDisabledGuard {
 public:
  AutocastDisabledGuard() : guard_(c10::autocast_dispatch_keyset) {}
  AutocastDisabledGuard(const AutocastDisabledGuard&) = delete;
  AutocastDisabledGuard& operator=(const AutocastDisabledGuard&) = delete;

 private:
  c10::impl::ExcludeDispatchKeyGuard guard_;
};

/// RAII scope of the inference path (issue 19, deliverable 1): inside it, on
/// this thread, a model may compute its energy with kernels whose backward
/// gives first derivatives with respect to geometry and node features only
/// (forces, stress, virials) and that keep no per-edge tensors between
/// forward and backward, processing edges in chunks instead. Such a backward
/// throws std::runtime_error if a parameter gradient or a differentiable
/// backward (create_graph) is asked of it. `compute_outputs` opens it when
/// `ComputeOptions::training` is false; the KIM cluster evaluation opens it
/// too. Nestable; the previous state returns on exit. Never throws.
class InferencePathGuard {
 public:
  explicit InferencePathGuard(bool enabled = true);
  ~InferencePathGuard();
  InferencePathGuard(const InferencePathGuard&) = delete;
  InferencePathGuard& operator=(const InferencePathGuard&) = delete;

 private:
  bool previous_;
};

/// True inside an InferencePathGuard(true) on this thread and outside any
/// autocast region (the chunked kernels compute in the tensors' dtype, so a
/// mixed-precision region keeps the autograd path). Never throws.
bool inference_path_enabled();

/// Whether a model takes its chunked inference kernels for geometry dtype
/// `geometry` (the positions') and layer dtype `layer` (the parameters'):
/// inference_path_enabled(), and both the same float32 or float64 (the
/// kernels compute in one dtype; the *-true half modes keep the autograd
/// layers). Never throws.
bool use_inference_kernels(at::ScalarType geometry, at::ScalarType layer);

/// Edges per chunk of the inference path's kernels: rows of the per-edge
/// temporaries, sized so that a chunk's [chunk, 64] float32 tensors stay in
/// a core's L2 cache (256 KiB each at the default 1024). Default 1024, or
/// the environment's CRUCIBLE_EDGE_CHUNK (>= 1) for experiments. Never throws.
int64_t inference_edge_chunk();

/// Overrides inference_edge_chunk() for this process (tests, benchmarks);
/// 0 restores the default. @throws std::invalid_argument if chunk < 0.
void set_inference_edge_chunk(int64_t chunk);

/// Edge vectors r_ij = positions[j] - positions[i] + shifts · cell[batch[i]]:
/// [E,3], Å, dtype of positions, differentiable w.r.t. positions and cell.
/// Computed with autocast off (AutocastDisabledGuard), so a mixed-precision
/// region never lowers the geometry below the positions' dtype. On the CPU
/// (float32/float64 positions that require grad, int64 edge_index) the
/// position difference and its transpose, a scatter into per-thread [N,3]
/// sums over edge chunks, are hand-written loops that are each other's
/// derivative: exact to any order (force training's create_graph included).
/// Elsewhere index_select and autograd.
at::Tensor edge_vectors(const Batch& batch);

/// What `compute_outputs` computes.
struct ComputeOptions {
  bool forces = true;    ///< forces = -dE/dr. Default true.
  bool stress = false;   ///< stress = (1/V) dE/dε (periodic structures). Default false.
  bool training = false; ///< keep the graph (create_graph) for force/stress losses. Default false.
  /// Also return the per-atom energies (EnergyModel::node_energies), from
  /// the same evaluation: the energy is then their per-structure sum.
  /// Default false.
  bool energies = false;
};

/// Model outputs. Undefined tensors were not requested.
struct ModelOutputs {
  at::Tensor energy;  ///< [B] eV, float64 (EnergyModel::energy).
  at::Tensor forces;  ///< [N,3] eV/Å.
  at::Tensor stress;  ///< [B,3,3] eV/Å³, ASE sign; zero for non-periodic structures.
  at::Tensor energies;  ///< [N] eV float64, per-atom energies (ComputeOptions::energies).
};

/// Energy, forces and stress of `batch` through autograd.
///
/// Forces F = -∂E/∂r. Stress σ = (1/V) ∂E/∂ε at ε = 0 under the symmetric
/// strain r → r(1+ε), cell → cell(1+ε) (Knuth et al., Comput. Phys. Commun.
/// 190, 33 (2015); as in ASE/MACE/NequIP). Works on any device; positions get
/// a fresh leaf each call. With `training`, outputs keep the graph so losses
/// on forces/stress can be back-propagated to parameters.
/// Precision (issue 3, deliverable 4): only `model.energy` runs under an
/// enclosing autocast region; the strain, the derivatives (backward) and the
/// stress run with autocast off, so positions, strain, forces and stress have
/// the positions' dtype (float32 or float64) in every precision mode. The
/// energy and the per-atom energies are float64 in every mode (issue 48; cast
/// up if the model returned a lower dtype). Denormals flush to zero during the call and the
/// caller's setting is restored after it (common/denormals.h).
/// @throws std::invalid_argument if stress is requested for a batch without
///         a cell tensor.
ModelOutputs compute_outputs(EnergyModel& model, const Batch& batch, const ComputeOptions& options);

}  // namespace crucible

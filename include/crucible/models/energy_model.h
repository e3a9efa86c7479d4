#pragma once
// Energy-model interface and autograd forces / stress.

#include "crucible/data/batch.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <string>

namespace crucible {

/// A machine-learned potential: a batch in, per-structure energy out.
///
/// Implementations compute edge vectors with `edge_vectors(batch)` so that
/// the strain applied by `compute_outputs` reaches both positions and cell.
class EnergyModel {
 public:
  virtual ~EnergyModel() = default;
  /// Per-structure total energy [B] (eV), dtype of batch.positions.
  virtual at::Tensor energy(const Batch& batch) = 0;
  /// The torch module holding parameters and buffers.
  virtual torch::nn::Module& module() = 0;
  /// Neighbor-list cutoff, Å.
  virtual double cutoff() const = 0;
  /// Short name ("schnet").
  virtual std::string name() const = 0;
};

/// Edge vectors r_ij = positions[j] - positions[i] + shifts · cell[batch[i]]:
/// [E,3], Å, dtype of positions, differentiable w.r.t. positions and cell.
at::Tensor edge_vectors(const Batch& batch);

/// What `compute_outputs` computes.
struct ComputeOptions {
  bool forces = true;    ///< forces = -dE/dr. Default true.
  bool stress = false;   ///< stress = (1/V) dE/dε (periodic structures). Default false.
  bool training = false; ///< keep the graph (create_graph) for force/stress losses. Default false.
};

/// Model outputs. Undefined tensors were not requested.
struct ModelOutputs {
  at::Tensor energy;  ///< [B] eV.
  at::Tensor forces;  ///< [N,3] eV/Å.
  at::Tensor stress;  ///< [B,3,3] eV/Å³, ASE sign; zero for non-periodic structures.
};

/// Energy, forces and stress of `batch` through autograd.
///
/// Forces F = -∂E/∂r. Stress σ = (1/V) ∂E/∂ε at ε = 0 under the symmetric
/// strain r → r(1+ε), cell → cell(1+ε) (Knuth et al., Comput. Phys. Commun.
/// 190, 33 (2015); as in ASE/MACE/NequIP). Works on any device; positions get
/// a fresh leaf each call. With `training`, outputs keep the graph so losses
/// on forces/stress can be back-propagated to parameters.
/// @throws std::invalid_argument if stress is requested for a batch without
///         a cell tensor.
ModelOutputs compute_outputs(EnergyModel& model, const Batch& batch, const ComputeOptions& options);

}  // namespace crucible

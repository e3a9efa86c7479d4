#pragma once
// A two-parameter pair potential used to test the training loop without SchNet:
// E = Σ_edges a·exp(-b·r_ij) / 2 + c·N  (eV), r in Å.

#include "crucible/data/dataset.h"
#include "crucible/losses/loss.h"
#include "crucible/models/energy_model.h"

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <random>

namespace crucible::testing {

class ToyModelImpl : public torch::nn::Cloneable<ToyModelImpl>, public EnergyModel {
 public:
  ToyModelImpl(double a = 1.0, double b = 1.0, double c = 0.0, double cutoff = 4.0)
      : a0_(a), b0_(b), c0_(c), cutoff_(cutoff) {
    reset();
  }
  void reset() override {
    a = register_parameter("a", at::full({}, a0_, at::kDouble));
    b = register_parameter("b", at::full({}, b0_, at::kDouble));
    c = register_parameter("c", at::full({}, c0_, at::kDouble));
  }
  at::Tensor energy(const Batch& batch) override {
    auto r = edge_vectors(batch).norm(2, -1);
    auto e_edge = 0.5 * a * at::exp(-b * r);
    auto graph = batch.batch.index_select(0, batch.edge_index[0]);
    auto e = at::zeros({batch.num_graphs()}, r.options()).index_add(0, graph, e_edge);
    return e + c * batch.num_atoms.to(r.scalar_type());
  }
  torch::nn::Module& module() override { return *this; }
  double cutoff() const override { return cutoff_; }
  std::string name() const override { return "toy"; }
  std::shared_ptr<EnergyModel> clone_model() const override {
    return std::dynamic_pointer_cast<ToyModelImpl>(clone());
  }
  at::Tensor a, b, c;

 private:
  double a0_, b0_, c0_, cutoff_;
};
TORCH_MODULE(ToyModel);

/// Random clusters of 2..5 atoms in a 3 Å box (non-periodic), labelled by a
/// toy model with (a, b, c) = (2, 1.5, -0.3).
inline std::vector<Structure> toy_structures(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 3.0);
  std::uniform_int_distribution<int> count(2, 5);
  ToyModel truth(2.0, 1.5, -0.3);
  std::vector<Structure> out;
  for (int s = 0; s < n; ++s) {
    Structure st;
    const int atoms = count(rng);
    st.positions = at::empty({atoms, 3}, at::kDouble);
    auto p = st.positions.accessor<double, 2>();
    for (int i = 0; i < atoms; ++i)
      for (int d = 0; d < 3; ++d) p[i][d] = u(rng);
    st.atomic_numbers = at::full({atoms}, 1, at::kLong);
    st.cell = at::zeros({3, 3}, at::kDouble);
    out.push_back(st);
  }
  AtomicDataset ds(out, truth->cutoff());
  for (int s = 0; s < n; ++s) {
    auto b = ds.collate({s});
    auto o = compute_outputs(*truth, b, ComputeOptions{});
    out[s].energy = o.energy.item<double>();
    out[s].forces = o.forces.detach().clone();
  }
  return out;
}

/// `n` structures alternating between periodic ones (even index: 3-4 atoms
/// in a 4.5 Å cubic cell, pbc, with energy, forces and stress from the toy
/// truth) and molecules without a stress label (odd index, as
/// toy_structures): mixed-label data as in MOF or MACE regression sets.
inline std::vector<Structure> mixed_stress_structures(int n, uint64_t seed = 3) {
  std::vector<Structure> out = toy_structures(n, seed);
  ToyModel truth(2.0, 1.5, -0.3);
  for (int s = 0; s < n; s += 2) {
    Structure& st = out[s];
    st.cell = 4.5 * at::eye(3, at::kDouble);
    st.pbc = {true, true, true};
    AtomicDataset one({st}, truth->cutoff());
    auto b = one.collate({0});
    ComputeOptions co;
    co.stress = true;
    auto o = compute_outputs(*truth, b, co);
    st.energy = o.energy.item<double>();
    st.forces = o.forces.detach().clone();
    st.stress = o.stress.detach()[0].clone();
  }
  return out;
}

/// `n` toy structures (see toy_structures) with neighbor lists at 4 Å.
inline std::shared_ptr<AtomicDataset> toy_dataset(int n, uint64_t seed = 1) {
  return std::make_shared<AtomicDataset>(toy_structures(n, seed), 4.0);
}

/// Energy MSE (per atom, weight 1) + forces MSE (weight 10) + stress MSE (weight 100).
inline WeightedSumLoss energy_forces_stress_loss() {
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
  loss.add(std::make_shared<ForcesMSELoss>(), 10.0);
  loss.add(std::make_shared<StressMSELoss>(), 100.0);
  return loss;
}

/// Energy MSE (per atom, weight 1) + forces MSE (weight 10).
inline WeightedSumLoss energy_forces_loss() {
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
  loss.add(std::make_shared<ForcesMSELoss>(), 10.0);
  return loss;
}

}  // namespace crucible::testing

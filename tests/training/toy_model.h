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

/// `n` toy structures (see toy_structures) with neighbor lists at 4 Å.
inline std::shared_ptr<AtomicDataset> toy_dataset(int n, uint64_t seed = 1) {
  return std::make_shared<AtomicDataset>(toy_structures(n, seed), 4.0);
}

/// Energy MSE (per atom, weight 1) + forces MSE (weight 10).
inline WeightedSumLoss energy_forces_loss() {
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
  loss.add(std::make_shared<ForcesMSELoss>(), 10.0);
  return loss;
}

}  // namespace crucible::testing

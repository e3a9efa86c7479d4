// Edge vectors and autograd forces / stress for any EnergyModel.
//
// Forces are F = -∂E/∂r. Stress follows the strain-derivative definition
// σ = (1/V) ∂E/∂ε at ε = 0 under the homogeneous symmetric deformation
// r → r(1+ε), cell → cell(1+ε) (Knuth et al., Comput. Phys. Commun. 190, 33
// (2015)); this is ASE's sign convention (ase.calculators.calculator.
// Calculator.calculate_numerical_stress) and the one used by MACE / NequIP.

#include "crucible/models/energy_model.h"
#include "crucible/models/chunk_parallel.h"
#include "crucible/common/autocast_state.h"
#include "crucible/common/denormals.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace crucible {

void EnergyModel::set_energy_normalization(const at::Tensor&, double, double) {
  throw std::logic_error(name() + ": the model has no energy normalization (E0, scale, shift)");
}

at::Tensor EnergyModel::node_energies(const Batch&) {
  throw std::logic_error(name() + ": the model has no per-atom energies");
}

void module_to_keeping_float64(torch::nn::Module& module, const std::vector<at::Tensor>& float64_buffers,
                               std::optional<at::Device> device, std::optional<at::ScalarType> dtype,
                               bool non_blocking) {
  std::vector<at::Tensor> values;
  values.reserve(float64_buffers.size());
  for (const at::Tensor& b : float64_buffers) values.push_back(b.detach().to(at::kDouble, /*non_blocking=*/false, /*copy=*/true));
  if (device && dtype) {
    module.torch::nn::Module::to(*device, *dtype, non_blocking);
  } else if (dtype) {
    module.torch::nn::Module::to(*dtype, non_blocking);
  } else if (device) {
    module.torch::nn::Module::to(*device, non_blocking);
  }
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < values.size(); ++k) {
    at::Tensor b = float64_buffers[k];  // shares the registered buffer's TensorImpl
    b.set_data(values[k].to(b.device()));
  }
}

namespace {
thread_local bool t_inference_path = false;
std::atomic<int64_t> g_edge_chunk_override{0};

/// vec[e] = pos[j_e] - pos[i_e] [E,3] (EdgeDifference) and its transpose
/// out[n] = Σ_{e: j_e = n} g[e] - Σ_{e: i_e = n} g[e] [N,3]
/// (EdgeDifferenceSum): each is the other's derivative, so both orders of
/// force training go through these two loops. They replace
/// index_select · sub, whose backward is LibTorch's serial index_add_ of
/// [E,3] rows (100-180 ms of a 2-thread 16384-atom SchNet call; 3.5% of a
/// SchNet training step, 256 atoms, 1 thread). CPU, float32/float64, int64
/// edge_index [2,E] (row 0 i, row 1 j), contiguous.
class EdgeDifferenceSum;

class EdgeDifference : public torch::autograd::Function<EdgeDifference> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& pos,
                            const at::Tensor& edge_index) {
    ctx->save_for_backward({edge_index});
    ctx->saved_data["num_atoms"] = pos.size(0);
    const int64_t E = edge_index.size(1);
    at::Tensor vec = at::empty({E, 3}, pos.options());
    const int64_t* recv = edge_index.data_ptr<int64_t>();
    const int64_t* send = recv + E;
    AT_DISPATCH_FLOATING_TYPES(pos.scalar_type(), "edge_vectors", [&] {
      const scalar_t* p = pos.data_ptr<scalar_t>();
      scalar_t* v = vec.data_ptr<scalar_t>();
      at::parallel_for(0, E, 8192, [&](int64_t b, int64_t end) {
        for (int64_t e = b; e < end; ++e) {
          for (int k = 0; k < 3; ++k) v[3 * e + k] = p[3 * send[e] + k] - p[3 * recv[e] + k];
        }
      });
    });
    return vec;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out);
};

class EdgeDifferenceSum : public torch::autograd::Function<EdgeDifferenceSum> {
 public:
  /// Per-thread [N,3] sums over chunks of 16384 edges (sum_over_chunks), in
  /// edge order within a chunk: the same bits for the same thread count.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& g_in,
                            const at::Tensor& edge_index, int64_t n) {
    ctx->save_for_backward({edge_index});
    const at::Tensor g = g_in.contiguous();
    const int64_t E = edge_index.size(1);
    const int64_t* recv = edge_index.data_ptr<int64_t>();
    const int64_t* send = recv + E;
    constexpr int64_t kChunk = 16384;
    const at::Tensor like = at::empty({n, 3}, g.options());
    at::Tensor out;
    AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "edge_vectors_backward", [&] {
      const scalar_t* gp = g.data_ptr<scalar_t>();
      out = sum_over_chunks((E + kChunk - 1) / kChunk, {like}, [&](int64_t c, std::vector<at::Tensor>& acc) {
        scalar_t* a = acc[0].data_ptr<scalar_t>();
        for (int64_t e = c * kChunk, end = std::min(E, e + kChunk); e < end; ++e) {
          scalar_t* aj = a + 3 * send[e];
          scalar_t* ai = a + 3 * recv[e];
          for (int k = 0; k < 3; ++k) {
            aj[k] += gp[3 * e + k];
            ai[k] -= gp[3 * e + k];
          }
        }
      })[0];
    });
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const at::Tensor edge_index = ctx->get_saved_variables()[0];
    return {EdgeDifference::apply(grad_out[0].contiguous(), edge_index), at::Tensor(), at::Tensor()};
  }
};

torch::autograd::variable_list EdgeDifference::backward(torch::autograd::AutogradContext* ctx,
                                                        torch::autograd::variable_list grad_out) {
  const at::Tensor edge_index = ctx->get_saved_variables()[0];
  const int64_t n = ctx->saved_data["num_atoms"].toInt();
  return {EdgeDifferenceSum::apply(grad_out[0], edge_index, n), at::Tensor()};
}

/// out[r] = rows[r] · mats[graph of r] [R,3], rows [R,3], mats [B,3,3] (same
/// dtype); the graph of row r is node_graph[node_index[r]], or node_graph[r]
/// when node_index is undefined (R = N). For one structure (B = 1: MD, the
/// calculator, KIM) this is one [R,3]×[3,3] product, whose gradient for mats
/// is a GEMM that threads. Otherwise it gathers [R,3,3] matrices, and the
/// gather's backward is LibTorch's serial index_add_: on one 16384-atom
/// SchNet call with stress (Intel Xeon VM, 1 thread) the profiler listed
/// index_add_ at 36 ms and bmm at 26 ms with the gather, neither without it.
at::Tensor rows_times_graph_matrix(const at::Tensor& rows, const at::Tensor& mats, const at::Tensor& node_graph,
                                   const at::Tensor& node_index) {
  if (mats.size(0) == 1) return rows.mm(mats.select(0, 0));
  const at::Tensor graph = node_index.defined() ? node_graph.index_select(0, node_index) : node_graph;
  return at::bmm(rows.unsqueeze(1), mats.index_select(0, graph)).squeeze(1);
}

/// energy [B] float64 = Σ per structure of `energies` [N], with autocast off.
at::Tensor structure_sums(const Batch& batch, const at::Tensor& energies) {
  AutocastDisabledGuard sum_in_float64;
  const at::Tensor e = energies.to(at::kDouble);
  return at::zeros({batch.num_atoms.size(0)}, e.options()).index_add(0, batch.batch, e);
}
}  // namespace

InferencePathGuard::InferencePathGuard(bool enabled) : previous_(t_inference_path) {
  t_inference_path = enabled;
}
InferencePathGuard::~InferencePathGuard() { t_inference_path = previous_; }

bool inference_path_enabled() {
  return t_inference_path && !autocast_enabled(at::kCPU) && !autocast_enabled(at::kCUDA);
}

bool use_inference_kernels(at::ScalarType geometry, at::ScalarType layer) {
  return inference_path_enabled() && geometry == layer && (geometry == at::kFloat || geometry == at::kDouble);
}

int64_t inference_edge_chunk() {
  if (const int64_t o = g_edge_chunk_override.load()) return o;
  static const int64_t chunk = [] {
    const char* v = std::getenv("CRUCIBLE_EDGE_CHUNK");
    const long long c = v ? std::atoll(v) : 0;
    return c >= 1 ? static_cast<int64_t>(c) : int64_t{1024};
  }();
  return chunk;
}

void set_inference_edge_chunk(int64_t chunk) {
  if (chunk < 0) throw std::invalid_argument("set_inference_edge_chunk: chunk must be >= 0, got " + std::to_string(chunk));
  g_edge_chunk_override.store(chunk);
}

at::Tensor edge_vectors(const Batch& batch) {
  AutocastDisabledGuard no_autocast;  // geometry stays in the positions' dtype
  const at::Tensor& pos = batch.positions;
  const at::Tensor i = batch.edge_index.select(0, 0);
  const at::Tensor j = batch.edge_index.select(0, 1);
  // The hand-written loops where they apply (CPU, float dtypes, int64
  // indices); otherwise autograd's index_select.
  const bool own_backward = pos.device().is_cpu() && batch.edge_index.device().is_cpu() &&
                            (pos.scalar_type() == at::kFloat || pos.scalar_type() == at::kDouble) &&
                            batch.edge_index.scalar_type() == at::kLong && pos.requires_grad();
  at::Tensor vec = own_backward ? EdgeDifference::apply(pos.contiguous(), batch.edge_index.contiguous())
                                : pos.index_select(0, j) - pos.index_select(0, i);  // [E,3]
  if (batch.cell.defined() && batch.shifts.defined() && vec.size(0) > 0) {
    // S · cell, with the cell of each edge's structure (graph of its center atom).
    vec = vec + rows_times_graph_matrix(batch.shifts.to(pos.scalar_type()), batch.cell, batch.batch, i);
  }
  return vec;
}

ModelOutputs compute_outputs(EnergyModel& model, const Batch& batch, const ComputeOptions& options) {
  const DenormalFlushGuard flush;  // denormals cost ~100 cycles each on Intel CPUs (common/denormals.h)
  ModelOutputs out;
  const bool need_grad = options.forces || options.stress;

  if (!need_grad) {
    std::optional<at::NoGradGuard> no_grad;
    if (!options.training) no_grad.emplace();
    if (options.energies) {
      out.energies = model.node_energies(batch);
      out.energy = structure_sums(batch, out.energies);
    } else {
      out.energy = model.energy(batch).to(at::kDouble);
    }
    return out;
  }

  if (options.stress && !batch.cell.defined()) {
    throw std::invalid_argument("compute_outputs: stress requested but the batch has no cell tensor");
  }

  // Force-safe precision: everything but model.energy runs with autocast off.
  std::optional<AutocastDisabledGuard> no_autocast(std::in_place);
  // Shallow copy: every tensor is shared except the ones replaced below.
  Batch b = batch;
  const at::Tensor positions = batch.positions.detach().requires_grad_(true);  // fresh leaf [N,3]
  std::vector<at::Tensor> inputs{positions};

  at::Tensor strain;
  if (options.stress) {
    const int64_t num_graphs = batch.cell.size(0);
    strain = at::zeros({num_graphs, 3, 3}, batch.positions.options()).requires_grad_(true);
    const at::Tensor sym = 0.5 * (strain + strain.transpose(1, 2));  // [B,3,3]
    b.positions = positions + rows_times_graph_matrix(positions, sym, batch.batch, at::Tensor());
    const at::Tensor cell = batch.cell.detach();
    b.cell = cell + at::bmm(cell, sym);
    inputs.push_back(strain);
  } else {
    b.positions = positions;
  }

  no_autocast.reset();  // the model's inner layers follow the enclosing region
  at::Tensor energy;
  {
    InferencePathGuard inference(!options.training);  // chunked kernels (issue 19)
    if (options.energies) {
      out.energies = model.node_energies(b);  // [N]
      energy = structure_sums(batch, out.energies);
    } else {
      energy = model.energy(b);  // [B]
    }
  }
  no_autocast.emplace();
  // float64 whatever the model returned (EnergyModel::energy's contract).
  if (energy.scalar_type() != at::kDouble) energy = energy.to(at::kDouble);

  std::vector<at::Tensor> grads(inputs.size());
  if (energy.requires_grad()) {
    grads = torch::autograd::grad({energy.sum()}, inputs, /*grad_outputs=*/{},
                                  /*retain_graph=*/options.training,
                                  /*create_graph=*/options.training,
                                  /*allow_unused=*/true);
  }
  // Inputs the energy does not depend on (e.g. isolated atoms, no edges).
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!grads[k].defined()) grads[k] = at::zeros_like(inputs[k]).detach();
  }

  out.energy = energy;
  if (options.forces) out.forces = -grads[0];
  if (options.stress) {
    const at::Tensor cell = batch.cell.detach();
    const at::Tensor volume = at::linalg_det(cell).abs();  // [B]
    // Non-periodic structures (all pbc false) have no volume: stress 0 there.
    at::Tensor periodic = batch.pbc.defined()
                              ? batch.pbc.to(volume.device()).any(1)
                              : at::ones_like(volume, volume.options().dtype(at::kBool));
    periodic = at::logical_and(periodic, volume > 0);
    const at::Tensor safe_volume = at::where(periodic, volume, at::ones_like(volume));
    const at::Tensor stress = grads[1] / safe_volume.view({-1, 1, 1});
    out.stress = at::where(periodic.view({-1, 1, 1}), stress, at::zeros_like(stress));
  }

  if (out.energies.defined() && !options.training) out.energies = out.energies.detach();
  if (!options.training) {
    out.energy = out.energy.detach();
    if (out.forces.defined()) out.forces = out.forces.detach();
    if (out.stress.defined()) out.stress = out.stress.detach();
  }
  return out;
}

}  // namespace crucible

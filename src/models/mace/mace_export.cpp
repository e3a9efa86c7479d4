// MACE's state_dict and hyper-parameters of an imported MACE model (issue
// 46). See include/crucible/models/mace/mace_export.h.

#include "crucible/models/mace/mace_export.h"
#include "crucible/common/error.h"
#include "mace_layout.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace crucible {

std::map<std::string, at::Tensor> mace_state_dict(const MaceImpl& model, const std::map<int64_t, double>& e0,
                                                  double scale, double shift) {
  if (!model.mace_basis()) {
    throw std::invalid_argument(
        "export mace needs a model imported from MACE (crucible import mace) or fine-tuned from one; a MACE "
        "trained by Crucible uses Crucible's own product basis and harmonics frame");
  }
  const MaceOptions& o = model.options();
  auto& module = const_cast<MaceImpl&>(model);
  const auto params = module.named_parameters(/*recurse=*/false);
  const auto buffers = module.named_buffers(/*recurse=*/false);
  auto tensor = [&](const std::string& name) -> at::Tensor {
    if (const at::Tensor* p = params.find(name)) return p->detach().cpu();
    if (const at::Tensor* b = buffers.find(name)) return b->detach().cpu();
    throw std::logic_error("mace_state_dict: no tensor " + name);
  };
  const at::Tensor ref = tensor("embedding");
  const auto fopt = at::TensorOptions().dtype(ref.scalar_type());
  std::map<std::string, at::Tensor> sd;
  for (const auto& m : mace_layout::tensor_maps(o)) {
    std::vector<at::Tensor> parts;
    for (const auto& name : m.crucible) parts.push_back(tensor(name));
    at::Tensor t = m.to_mace(parts).reshape(m.mace_shape).contiguous();
    // The ZBL constants are kept float64 (the energy sums' dtype); MACE's
    // file holds every float tensor in the model's dtype.
    if (at::isFloatingType(t.scalar_type()) && t.scalar_type() != ref.scalar_type()) t = t.to(ref.scalar_type());
    sd[m.mace] = t;
  }
  const int64_t C = mace::Irreps::parse(o.hidden_irreps, 3).terms()[0].mul;
  const int64_t nE = static_cast<int64_t>(o.atomic_numbers.size());
  const at::Tensor r_max = tensor("cutoff_r_max").reshape({});
  sd["atomic_numbers"] = at::tensor(o.atomic_numbers, at::kLong);
  sd["r_max"] = r_max.clone();
  sd["num_interactions"] = at::full({}, o.num_interactions, at::kLong);
  sd["radial_embedding.bessel_fn.bessel_weights"] = tensor("bessel_weights");
  sd["radial_embedding.bessel_fn.r_max"] = r_max.clone();
  sd["radial_embedding.bessel_fn.prefactor"] = tensor("bessel_prefactor").reshape({});
  sd["radial_embedding.cutoff_fn.p"] = at::full({}, o.num_polynomial_cutoff, at::kInt);
  sd["radial_embedding.cutoff_fn.r_max"] = r_max.clone();
  if (o.pair_repulsion) sd["pair_repulsion_fn.p"] = at::full({}, o.num_polynomial_cutoff, at::kInt);
  at::Tensor energies = at::zeros({1, nE}, fopt.dtype(at::kDouble));
  for (int64_t k = 0; k < nE; ++k) {
    auto it = e0.find(o.atomic_numbers[static_cast<size_t>(k)]);
    energies[0][k] = it == e0.end() ? 0.0 : it->second;
  }
  sd["atomic_energies_fn.atomic_energies"] = energies.to(fopt);
  sd["scale_shift.scale"] = at::full({1}, scale, fopt.dtype(at::kDouble)).to(fopt);
  sd["scale_shift.shift"] = at::full({1}, shift, fopt.dtype(at::kDouble)).to(fopt);
  // e3nn's bookkeeping: empty biases, output masks (every output is reached).
  auto linear = [&](const std::string& prefix, int64_t out_dim) {
    sd[prefix + ".bias"] = at::zeros({0}, fopt);
    sd[prefix + ".output_mask"] = at::ones({out_dim}, fopt);
  };
  auto dim_of = [](const std::vector<mace::Irrep>& irreps) {
    int64_t d = 0;
    for (const auto& ir : irreps) d += ir.dim();
    return d;
  };
  linear("node_embedding.linear", C);
  const int64_t T = o.num_interactions;
  for (int64_t t = 0; t < T; ++t) {
    const std::string in = "interactions." + std::to_string(t) + ".", pr = "products." + std::to_string(t) + ".";
    const auto L = mace_layout::layer_irreps(o, t);
    linear(in + "linear_up", dim_of(L.node) * C);
    sd[in + "conv_tp.weight"] = at::zeros({0}, fopt);
    sd[in + "conv_tp.output_mask"] = at::ones({mace_layout::tp_paths(o, t).second * C}, fopt);
    linear(in + "linear", dim_of(L.target) * C);
    sd[in + "skip_tp.output_mask"] = at::ones({(t == 0 ? dim_of(L.target) : dim_of(L.out)) * C}, fopt);
    for (size_t b = 0; b < L.out.size(); ++b) {
      const std::string sc = pr + "symmetric_contractions.contractions." + std::to_string(b) + ".";
      for (int nu = 1; nu <= o.correlation; ++nu) {
        const std::string idx = nu == o.correlation ? "max" : std::to_string(o.correlation - 1 - nu);
        // MACE zeroes (and flags) the weights of a path whose U matrix is all zero.
        auto u = sd.find(sc + "U_matrix_" + std::to_string(nu));
        sd[sc + "weights_" + idx + "_zeroed"] =
            at::full({}, u != sd.end() && u->second.numel() > 0 && u->second.abs().max().item<double>() == 0.0, at::kBool);
      }
    }
    linear(pr + "linear", dim_of(L.out) * C);
    const std::string ro = "readouts." + std::to_string(t) + ".";
    if (t < T - 1) {
      linear(ro + "linear", 1);
    } else {
      linear(ro + "linear_1", o.readout_mlp);
      linear(ro + "linear_2", 1);
    }
  }
  return sd;
}

nlohmann::json mace_hyperparameters(const MaceImpl& model, const std::map<int64_t, double>& e0, double scale,
                                    double shift) {
  const MaceOptions& o = model.options();
  std::vector<double> energies;
  for (int64_t z : o.atomic_numbers) {
    auto it = e0.find(z);
    energies.push_back(it == e0.end() ? 0.0 : it->second);
  }
  return {{"model_class", "ScaleShiftMACE"},
          {"r_max", o.cutoff},
          {"num_bessel", o.num_bessel},
          {"num_polynomial_cutoff", o.num_polynomial_cutoff},
          {"max_ell", o.max_ell},
          {"interaction_cls", "RealAgnosticResidualInteractionBlock"},
          {"interaction_cls_first", "RealAgnosticInteractionBlock"},
          {"num_interactions", o.num_interactions},
          {"num_elements", o.atomic_numbers.size()},
          {"hidden_irreps", o.hidden_irreps},
          {"MLP_irreps", std::to_string(o.readout_mlp) + "x0e"},
          {"gate", "silu"},
          {"readout_cls", "NonLinearReadoutBlock"},
          {"atomic_energies", nlohmann::json::array({energies})},
          {"avg_num_neighbors", o.avg_num_neighbors},
          {"atomic_numbers", o.atomic_numbers},
          {"correlation", o.correlation},
          {"radial_type", "bessel"},
          {"radial_MLP", o.radial_mlp},
          {"pair_repulsion", o.pair_repulsion},
          {"distance_transform", nullptr},
          {"use_reduced_cg", o.reduced_cg},
          {"use_so3", false},
          {"atomic_inter_scale", {scale}},
          {"atomic_inter_shift", {shift}},
          {"heads", {"Default"}}};
}

void write_state_dict_file(const std::string& path, const std::map<std::string, at::Tensor>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) dict.insert(name, t);
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw DataError(path + ": cannot be written");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw DataError(path + ": cannot be written (rename failed)");
  }
}

}  // namespace crucible

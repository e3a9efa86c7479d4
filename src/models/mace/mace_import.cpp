// A MACE model file as a Crucible MACE model (issue 46). The weight layouts
// are tabled in docs/mace_import.md; e3nn's conventions come from its
// o3/_linear.py (per-instruction [mul_in, mul_out] blocks),
// o3/_tensor_product (uvw blocks [mul1, mul2, mul_out]) and MACE's
// modules/irreps_tools.py (tp_out_irreps_with_instructions: the edge tensor
// product's outputs sorted by irrep, stably).

#include "crucible/models/mace/mace_import.h"
#include "crucible/common/error.h"
#include "mace_layout.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <sstream>

namespace crucible {
namespace {

using mace::Irrep;
using mace::Irreps;

/// Hyper-parameter keys and the value Crucible needs (what it can represent).
struct Fixed {
  const char* key;
  nlohmann::json expected;  ///< the only accepted value (null = absent/None too)
  const char* what;         ///< what Crucible lacks otherwise
};

const std::vector<Fixed>& fixed_keys() {
  static const std::vector<Fixed> keys = {
      {"edge_irreps", nullptr, "edge_irreps (a separate edge irreps)"},
      {"use_so3", false, "use_so3 (SO(3) instead of O(3) irreps)"},
      {"use_agnostic_product", false, "use_agnostic_product (an element-agnostic product basis)"},
      {"use_last_readout_only", false, "use_last_readout_only (energy from the last readout only)"},
      {"use_embedding_readout", false, "use_embedding_readout (a readout of the embedding)"},
      {"cueq_config", nullptr, "cueq_config (cuEquivariance weight layout; export the model without cuEquivariance)"},
      {"oeq_config", nullptr, "oeq_config (OpenEquivariance weight layout)"},
      {"distance_transform", nullptr, "distance_transform (Agnesi / Soft distance transforms)"},
      {"radial_type", "bessel", "radial_type other than bessel"},
      {"gate", "silu", "a gate other than silu"},
      {"apply_cutoff", true, "apply_cutoff false"},
      {"les_arguments", nullptr, "LES (latent Ewald summation)"},
      {"embedding_specs", nullptr, "embedding_specs (extra node embeddings)"},
  };
  return keys;
}

/// Keys read (or only informational) for a model Crucible represents.
const std::set<std::string>& understood_keys() {
  static const std::set<std::string> keys = {
      // read
      "r_max", "num_bessel", "num_polynomial_cutoff", "max_ell", "interaction_cls", "interaction_cls_first",
      "num_interactions", "num_elements", "hidden_irreps", "MLP_irreps", "atomic_energies", "avg_num_neighbors",
      "atomic_numbers", "correlation", "radial_MLP", "atomic_inter_scale", "atomic_inter_shift", "heads",
      "readout_cls", "model_class", "cutoff_fn_p", "spherical_harmonics", "versions", "pair_repulsion",
      "use_reduced_cg",
      // informational (the fixture JSON and python3 -m crucible.mace_to_pt write them)
      "name", "model_dtype", "num_parameters", "avg_num_neighbors_per_interaction", "atomic_energies_by_Z", "scale",
      "shift", "interaction_classes", "product_classes", "readout_classes", "correlation_per_product",
      "interaction_target_irreps", "interaction_hidden_irreps", "product_irreps_out", "readout_irreps_in",
      "radial_basis", "cutoff_fn", "units", "training", "interaction_cls_module", "interaction_cls_first_module",
      "readout_cls_module"};
  return keys;
}

bool is_none(const nlohmann::json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_string() && v.get<std::string>() == "None") ||
         (v.is_array() && v.empty()) || (v.is_object() && v.empty());
}

class Importer {
 public:
  explicit Importer(const MaceFile& f) : f_(f), hp_(f.hyperparameters) {}

  ImportedMace run();

 private:
  [[noreturn]] void refuse(const std::string& what) const {
    throw DataError(f_.path + ": " + what);
  }
  const nlohmann::json& need(const std::string& key) const {
    if (!hp_.contains(key) || hp_.at(key).is_null()) refuse("the hyper-parameters lack '" + key + "'");
    return hp_.at(key);
  }
  std::string need_string(const std::string& key) const {
    const auto& v = need(key);
    if (!v.is_string()) refuse("hyper-parameter '" + key + "' must be a string like \"16x0e+16x1o\", got " + v.dump());
    return v.get<std::string>();
  }
  int64_t need_int(const std::string& key) const {
    const auto& v = need(key);
    if (!v.is_number()) refuse("hyper-parameter '" + key + "' must be a number, got " + v.dump());
    const double d = v.get<double>();
    if (d != std::floor(d)) refuse("hyper-parameter '" + key + "' must be an integer, got " + v.dump());
    return static_cast<int64_t>(d);
  }
  double need_number(const std::string& key) const {
    const auto& v = need(key);
    if (!v.is_number()) refuse("hyper-parameter '" + key + "' must be a number, got " + v.dump());
    return v.get<double>();
  }
  /// A number, or a list whose entries must all be equal (per layer / head).
  double one_value(const std::string& key, const std::string& what) const {
    const auto& v = need(key);
    if (v.is_number()) return v.get<double>();
    if (!v.is_array() || v.empty()) refuse("hyper-parameter '" + key + "' must be a number or a list of numbers, got " + v.dump());
    for (const auto& x : v) {
      if (!x.is_number()) refuse("hyper-parameter '" + key + "' must be a number or a list of numbers, got " + v.dump());
      if (x.get<double>() != v[0].get<double>()) refuse(key + " differs between " + what + " (" + v.dump() + "): Crucible's MACE has one value");
    }
    return v[0].get<double>();
  }
  at::Tensor take(const std::string& name, std::vector<int64_t> numel_shape) {
    auto it = f_.tensors.find(name);
    if (it == f_.tensors.end()) refuse("tensor '" + name + "' is missing");
    used_.insert(name);
    const at::Tensor& t = it->second;
    const int64_t n = std::accumulate(numel_shape.begin(), numel_shape.end(), int64_t{1}, std::multiplies<int64_t>());
    if (t.numel() != n) {
      std::ostringstream os;
      os << "tensor '" << name << "' has shape " << t.sizes() << ", expected " << n << " numbers " << at::IntArrayRef(numel_shape);
      refuse(os.str());
    }
    return t.reshape(numel_shape);
  }
  void check_hyperparameters();
  void build_options();
  void copy_weights(MaceImpl& model);
  /// The value of Crucible's tensor `name` (copied into the model at the end).
  void set(const std::string& name, const at::Tensor& value);

  const MaceFile& f_;
  const nlohmann::json& hp_;
  std::set<std::string> used_;
  std::map<std::string, at::Tensor> values_;  // Crucible name → value
  MaceOptions o_;
  int64_t C_ = 0, nE_ = 0;
};

void Importer::check_hyperparameters() {
  for (const auto& [key, value] : hp_.items()) {
    if (understood_keys().count(key)) continue;
    bool fixed = false;
    for (const auto& k : fixed_keys()) fixed = fixed || key == k.key;
    if (!fixed && !is_none(value)) {
      refuse("hyper-parameter '" + key + "' = " + value.dump() + " is not understood by the import (Crucible's MACE lacks it)");
    }
  }
  for (const auto& k : fixed_keys()) {
    if (!hp_.contains(k.key)) continue;
    const auto& v = hp_.at(k.key);
    const bool ok = k.expected.is_null() ? is_none(v) : (v == k.expected || (k.expected == false && is_none(v)));
    if (!ok) refuse("Crucible's MACE lacks " + std::string(k.what) + " (" + k.key + " = " + v.dump() + ")");
  }
  auto cls = [&](const std::string& key, const std::vector<std::string>& allowed, const std::string& dflt) {
    const std::string v = hp_.contains(key) && hp_.at(key).is_string() ? hp_.at(key).get<std::string>() : dflt;
    if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      refuse("Crucible's MACE lacks " + key + " " + v + " (it has " + allowed[0] + ")");
    }
  };
  cls("interaction_cls_first", {"RealAgnosticInteractionBlock"}, "");
  cls("interaction_cls", {"RealAgnosticResidualInteractionBlock"}, "");
  cls("readout_cls", {"NonLinearReadoutBlock"}, "NonLinearReadoutBlock");
  cls("model_class", {"ScaleShiftMACE", "MACE"}, "ScaleShiftMACE");
  if (hp_.contains("heads") && hp_.at("heads").is_array() && hp_.at("heads").size() > 1) {
    refuse("Crucible's MACE lacks multiple heads (heads = " + hp_.at("heads").dump() + "): select one head in MACE first");
  }
  if (hp_.contains("spherical_harmonics") && hp_.at("spherical_harmonics").is_object()) {
    const auto& sh = hp_.at("spherical_harmonics");
    if (sh.value("normalize", true) != true || sh.value("normalization", std::string("component")) != "component") {
      refuse("Crucible's MACE lacks spherical harmonics other than normalize=True, normalization='component' (" + sh.dump() + ")");
    }
  }
}

void Importer::build_options() {
  o_.basis = "mace";
  o_.cutoff = need_number("r_max");
  o_.num_bessel = need_int("num_bessel");
  o_.num_polynomial_cutoff = need_int("num_polynomial_cutoff");
  if (hp_.contains("cutoff_fn_p") && hp_.at("cutoff_fn_p").is_number() &&
      hp_.at("cutoff_fn_p").get<double>() != static_cast<double>(o_.num_polynomial_cutoff)) {
    refuse("cutoff_fn_p = " + hp_.at("cutoff_fn_p").dump() + " differs from num_polynomial_cutoff");
  }
  o_.max_ell = static_cast<int>(need_int("max_ell"));
  o_.num_interactions = need_int("num_interactions");
  if (o_.num_interactions < 2) {
    refuse("Crucible's MACE lacks a model with num_interactions = " + std::to_string(o_.num_interactions) + " (it needs >= 2)");
  }
  o_.correlation = static_cast<int>(one_value("correlation", "products"));
  o_.avg_num_neighbors = one_value("avg_num_neighbors", "interactions");
  for (double a : f_.avg_num_neighbors) {
    if (a != o_.avg_num_neighbors) refuse("avg_num_neighbors differs between interaction blocks: Crucible's MACE has one value");
  }
  if (!f_.avg_num_neighbors.empty()) o_.avg_num_neighbors = f_.avg_num_neighbors[0];
  const auto& mlp = need("radial_MLP");
  if (!mlp.is_array()) refuse("hyper-parameter 'radial_MLP' must be a list of widths, got " + mlp.dump());
  o_.radial_mlp = mlp.get<std::vector<int64_t>>();
  o_.hidden_irreps = need_string("hidden_irreps");
  const Irreps hidden = Irreps::parse(o_.hidden_irreps, 3);
  if (hidden.size() == 0 || hidden.terms()[0].irrep != Irrep{0, 1}) {
    refuse("hidden_irreps '" + o_.hidden_irreps + "' must start with 0e (MACE's last layer keeps hidden_irreps[0])");
  }
  C_ = hidden.terms()[0].mul;
  const Irreps mlp_irreps = Irreps::parse(need_string("MLP_irreps"), 0);
  if (mlp_irreps.size() != 1 || mlp_irreps.terms()[0].irrep != Irrep{0, 1}) {
    refuse("Crucible's MACE lacks MLP_irreps other than scalars (" + need("MLP_irreps").dump() + ")");
  }
  o_.readout_mlp = mlp_irreps.terms()[0].mul;
  const auto& z = need("atomic_numbers");
  if (!z.is_array()) refuse("hyper-parameter 'atomic_numbers' must be a list, got " + z.dump());
  o_.atomic_numbers = z.get<std::vector<int64_t>>();
  if (!std::is_sorted(o_.atomic_numbers.begin(), o_.atomic_numbers.end())) {
    refuse("atomic_numbers " + z.dump() + " are not ascending (Crucible's element order)");
  }
  nE_ = static_cast<int64_t>(o_.atomic_numbers.size());
  if (hp_.contains("num_elements") && hp_.at("num_elements").is_number() && hp_.at("num_elements").get<int64_t>() != nE_) {
    refuse("num_elements = " + hp_.at("num_elements").dump() + " but atomic_numbers lists " + std::to_string(nE_));
  }
  // The U matrices' column counts, per layer and output irrep (the last
  // layer: 0e only), from the file.
  o_.u_columns.assign(static_cast<size_t>(o_.num_interactions), {});
  for (int64_t t = 0; t < o_.num_interactions; ++t) {
    const size_t outs = t + 1 == o_.num_interactions ? 1 : hidden.size();
    for (size_t b = 0; b < outs; ++b) {
      std::vector<int64_t> per_nu;
      for (int nu = 1; nu <= o_.correlation; ++nu) {
        const std::string name = "products." + std::to_string(t) + ".symmetric_contractions.contractions." +
                                 std::to_string(b) + ".U_matrix_" + std::to_string(nu);
        auto it = f_.tensors.find(name);
        if (it == f_.tensors.end()) refuse("tensor '" + name + "' is missing (the product basis of layer " + std::to_string(t) + ")");
        per_nu.push_back(it->second.dim() == 0 ? 0 : it->second.size(-1));
      }
      o_.u_columns[static_cast<size_t>(t)].push_back(per_nu);
    }
  }
  o_.silu_normalization = e3nn_silu_normalization();
  // Bools that Crucible represents: the ZBL term, and the reduced CG basis
  // (it only changed how MACE computed the U matrices, read from the file).
  auto flag = [&](const std::string& key) {
    if (!hp_.contains(key) || is_none(hp_.at(key))) return false;
    if (!hp_.at(key).is_boolean()) refuse("hyper-parameter '" + key + "' must be true or false, got " + hp_.at(key).dump());
    return hp_.at(key).get<bool>();
  };
  o_.pair_repulsion = flag("pair_repulsion");
  o_.reduced_cg = flag("use_reduced_cg");
}

void Importer::set(const std::string& name, const at::Tensor& value) { values_[name] = value; }

void Importer::copy_weights(MaceImpl& model) {
  const double r_max = o_.cutoff;
  // The radial constants as stored (float32-rounded in a float32 model,
  // which MACE then evaluates as they are); checked against r_max.
  const at::Tensor w = take("radial_embedding.bessel_fn.bessel_weights", {o_.num_bessel});
  const at::Tensor expect = at::arange(1, o_.num_bessel + 1, at::kDouble) * (3.14159265358979323846 / r_max);
  if (!at::allclose(w.to(at::kDouble), expect, 1e-6, 0.0)) {
    refuse("radial_embedding.bessel_fn.bessel_weights differ from n·π/r_max (trained Bessel frequencies): Crucible's MACE lacks them");
  }
  set("bessel_weights", w);
  const at::Tensor prefactor = take("radial_embedding.bessel_fn.prefactor", {});
  if (std::abs(prefactor.item<double>() - std::sqrt(2.0 / r_max)) > 1e-6 * std::sqrt(2.0 / r_max)) {
    refuse("radial_embedding.bessel_fn.prefactor differs from sqrt(2/r_max)");
  }
  set("bessel_prefactor", prefactor);
  const at::Tensor envelope_r_max = take("radial_embedding.cutoff_fn.r_max", {});
  if (std::abs(envelope_r_max.item<double>() - r_max) > 1e-6 * r_max) refuse("radial_embedding.cutoff_fn.r_max differs from r_max");
  set("cutoff_r_max", envelope_r_max);
  if (take("radial_embedding.cutoff_fn.p", {}).item<double>() != static_cast<double>(o_.num_polynomial_cutoff)) {
    refuse("radial_embedding.cutoff_fn.p differs from num_polynomial_cutoff");
  }
  if (o_.pair_repulsion && take("pair_repulsion_fn.p", {}).item<double>() != static_cast<double>(o_.num_polynomial_cutoff)) {
    refuse("pair_repulsion_fn.p differs from num_polynomial_cutoff (MACE builds ZBLBasis(p=num_polynomial_cutoff))");
  }
  for (const char* name : {"r_max", "radial_embedding.bessel_fn.r_max"}) {
    if (f_.tensors.count(name) && std::abs(take(name, {}).item<double>() - r_max) > 1e-6 * r_max) {
      refuse(std::string(name) + " differs from r_max");
    }
  }
  if (f_.tensors.count("num_interactions") && take("num_interactions", {}).item<int64_t>() != o_.num_interactions) {
    refuse("num_interactions tensor differs from the hyper-parameter");
  }
  if (f_.tensors.count("atomic_numbers")) {
    const at::Tensor z = take("atomic_numbers", {nE_}).to(at::kLong);
    for (int64_t k = 0; k < nE_; ++k)
      if (z[k].item<int64_t>() != o_.atomic_numbers[static_cast<size_t>(k)]) refuse("atomic_numbers tensor differs from the hyper-parameter");
  }

  // Every weight, U matrix and Clebsch-Gordan block (mace_layout.h).
  for (const auto& m : mace_layout::tensor_maps(o_)) {
    const std::vector<at::Tensor> parts = m.to_crucible(take(m.mace, m.mace_shape));
    for (size_t k = 0; k < parts.size(); ++k) set(m.crucible[k], parts[k]);
  }
  // The product paths' "zeroed" flags (MACE's pruned paths), and the
  // U matrices without columns.
  for (int64_t t = 0; t < o_.num_interactions; ++t) {
    const auto L = mace_layout::layer_irreps(o_, t);
    for (size_t b = 0; b < L.out.size(); ++b) {
      const std::string sc = "products." + std::to_string(t) + ".symmetric_contractions.contractions." + std::to_string(b) + ".";
      for (int nu = 1; nu <= o_.correlation; ++nu) {
        const std::string idx = nu == o_.correlation ? "max" : std::to_string(o_.correlation - 1 - nu);
        const std::string zname = sc + "weights_" + idx + "_zeroed";
        // A "zeroed" path has an all-zero U matrix (MACE drops its weights):
        // it contributes nothing here either.
        const std::string uname = sc + "U_matrix_" + std::to_string(nu);
        if (f_.tensors.count(zname) && take(zname, {}).item<bool>() && f_.tensors.count(uname) &&
            f_.tensors.at(uname).abs().max().item<double>() != 0.0) {
          refuse("tensor '" + zname + "' is true but " + uname + " is not zero: a pruned product path Crucible's MACE lacks");
        }
        if (o_.u_columns[static_cast<size_t>(t)][b][static_cast<size_t>(nu - 1)] == 0) {
          used_.insert(sc + "U_matrix_" + std::to_string(nu));
          used_.insert(nu == o_.correlation ? sc + "weights_max" : sc + "weights." + idx);
        }
      }
    }
  }
  // Everything of the file is used or bookkeeping; anything else is a
  // feature Crucible lacks.
  for (const auto& [name, t] : f_.tensors) {
    if (used_.count(name)) continue;
    auto ends_with = [&name](const std::string& tail) {
      return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    const bool empty_bias = ends_with(".bias") && t.numel() == 0;
    const bool mask = ends_with(".output_mask");
    const bool tp_weight = ends_with(".conv_tp.weight") && t.numel() == 0;
    const bool energies = name == "atomic_energies_fn.atomic_energies" || name.rfind("scale_shift.", 0) == 0;
    if (empty_bias || mask || tp_weight || energies) continue;
    refuse("tensor '" + name + "' is not understood by the import (a MACE feature Crucible's MACE lacks)");
  }
  // Into the model, checking every name and shape.
  at::NoGradGuard no_grad;
  std::set<std::string> filled;
  for (auto& item : model.named_parameters(/*recurse=*/false)) {
    auto it = values_.find(item.key());
    if (it == values_.end()) refuse("no MACE tensor for Crucible's parameter '" + item.key() + "' (an import bug)");
    item.value().copy_(it->second.reshape(item.value().sizes()));
    filled.insert(item.key());
  }
  for (auto& item : model.named_buffers(/*recurse=*/false)) {
    auto it = values_.find(item.key());
    if (it == values_.end()) continue;  // e0 / scale / shift: set_energy_normalization
    item.value().copy_(it->second.reshape(item.value().sizes()));
    filled.insert(item.key());
  }
  for (const auto& [name, v] : values_)
    if (!filled.count(name)) refuse("Crucible's MACE has no tensor '" + name + "' (an import bug)");
}

ImportedMace Importer::run() {
  check_hyperparameters();
  build_options();
  // The file's dtype: its node embedding's.
  auto emb = f_.tensors.find("node_embedding.linear.weight");
  if (emb == f_.tensors.end()) refuse("tensor 'node_embedding.linear.weight' is missing (not a MACE model?)");
  ImportedMace r;
  r.dtype = emb->second.scalar_type();
  if (r.dtype != at::kFloat && r.dtype != at::kDouble) refuse("the weights must be float32 or float64");
  try {
    r.model = std::make_shared<MaceImpl>(o_);
  } catch (const std::invalid_argument& e) {
    refuse(std::string("cannot build Crucible's MACE: ") + e.what());
  }
  r.model->to(r.dtype);
  copy_weights(*r.model);
  // E0s, scale, shift.
  at::Tensor e0s = f_.tensors.count("atomic_energies_fn.atomic_energies")
                       ? f_.tensors.at("atomic_energies_fn.atomic_energies").to(at::kDouble).reshape({-1})
                       : at::Tensor();
  if (!e0s.defined() || e0s.numel() != nE_) refuse("atomic_energies_fn.atomic_energies must hold one E0 per element (one head)");
  at::Tensor e0 = at::zeros({119}, at::kDouble);
  for (int64_t k = 0; k < nE_; ++k) {
    const int64_t z = o_.atomic_numbers[static_cast<size_t>(k)];
    r.e0[z] = e0s[k].item<double>();
    e0[z] = r.e0[z];
  }
  auto scalar = [&](const std::string& name, double dflt) {
    auto it = f_.tensors.find(name);
    if (it == f_.tensors.end()) return dflt;
    if (it->second.numel() != 1) refuse("tensor '" + name + "' must hold one value (one head)");
    return it->second.to(at::kDouble).item<double>();
  };
  r.scale = scalar("scale_shift.scale", 1.0);
  r.shift = scalar("scale_shift.shift", 0.0);
  r.model->set_energy_normalization(e0, r.scale, r.shift);  // float64, as the model keeps them
  r.model->eval();
  r.origin = {{"format", "mace"}, {"reader", f_.format}, {"file", f_.path}, {"hyperparameters", hp_}};
  if (hp_.contains("versions") && hp_.at("versions").is_object() && hp_.at("versions").contains("mace")) {
    r.origin["mace_version"] = hp_.at("versions").at("mace");
  }
  return r;
}

}  // namespace

double e3nn_silu_normalization() {
  static const double value = [] {
    at::NoGradGuard no_grad;
    at::Generator gen = at::detail::createCPUGenerator(0);
    const at::Tensor z = at::randn({1000000}, gen, at::TensorOptions().dtype(at::kDouble));
    return at::silu(z).pow(2).mean().pow(-0.5).item<double>();
  }();
  return value;
}

ImportedMace import_mace(const MaceFile& file) {
  try {
    return Importer(file).run();
  } catch (const nlohmann::json::exception& e) {
    throw DataError(file.path + ": malformed hyper-parameters (" + e.what() + ")");
  } catch (const std::invalid_argument& e) {  // an irreps string Irreps::parse refuses
    throw DataError(file.path + ": " + e.what());
  }
}

}  // namespace crucible

// MACE's registration (issue 16): its model.mace.* keys (the reference
// code's names and defaults), factory, model.json hyperparameters and
// parameter estimate.

#include "crucible/models/mace/mace.h"
#include "crucible/models/registry.h"

#include "crucible/common/error.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

namespace crucible {
namespace {

/// Irreps::parse of the value of model.mace.<key>, its errors naming the key
/// (issue 47). @throws ConfigError "model.mace.<key>: irreps '...': ...".
mace::Irreps parse_key(const char* key, const std::string& text, int max_l) {
  try {
    return mace::Irreps::parse(text, max_l);
  } catch (const std::exception& e) {
    throw ConfigError(std::string("model.mace.") + key + ": " + e.what());
  }
}

/// "16x0e" → 16 (MACE's MLP_irreps of the last readout: scalars only).
int64_t scalar_multiplicity(const std::string& text) {
  const mace::Irreps ir = parse_key("mlp_irreps", text, 0);
  if (ir.size() != 1 || ir.terms()[0].irrep != mace::Irrep{0, 1}) {
    throw std::invalid_argument("model.mace.mlp_irreps must be scalars like 16x0e, got '" + text + "'");
  }
  return ir.terms()[0].mul;
}

MaceOptions options_from(const ModelBuildContext& ctx) {
  MaceOptions o;
  o.hidden_irreps = ctx.get_string("hidden_irreps");
  o.max_ell = static_cast<int>(ctx.get_int("max_ell"));
  o.correlation = static_cast<int>(ctx.get_int("correlation"));
  o.num_interactions = ctx.get_int("num_interactions");
  o.num_bessel = ctx.get_int("num_bessel");
  o.num_polynomial_cutoff = ctx.get_int("num_polynomial_cutoff");
  o.radial_mlp = ctx.get_int_list("radial_mlp");
  o.readout_mlp = scalar_multiplicity(ctx.get_string("mlp_irreps"));
  o.cutoff = ctx.cutoff;
  const double avg = ctx.get_float("avg_num_neighbors");
  o.avg_num_neighbors = avg > 0 ? avg : ctx.avg_num_neighbors;
  o.atomic_numbers = ctx.elements;
  o.pair_repulsion = ctx.get_bool("pair_repulsion");
  return o;
}

}  // namespace

ModelFactory mace_factory() {
  ModelFactory f;
  f.type = "mace";
  f.description = "MACE (Batatia et al., NeurIPS 2022, arXiv 2206.07697): equivariant higher-order message passing";
  f.keys = {
      {"hidden_irreps", std::string("32x0e+32x1o"),
       "Irreps of the node features as MACE writes them (128x0e+128x1o): one multiplicity for every irrep, "
       "l <= max_ell, with 0e."},
      {"max_ell", int64_t{3}, "Spherical harmonics of the edge directions up to this l (1..3).", "", 1.0},
      {"correlation", int64_t{3}, "Correlation order of the product basis (body order - 1), 1..3.", "", 1.0},
      {"num_interactions", int64_t{2}, "Number of interaction (message-passing) layers.", "", 1.0},
      {"num_bessel", int64_t{8}, "Number of Bessel radial basis functions.", "", 1.0},
      {"num_polynomial_cutoff", int64_t{5}, "Exponent p of the polynomial envelope.", "", 1.0},
      {"radial_mlp", std::vector<int64_t>{64, 64, 64}, "Hidden widths of the radial MLP (MACE's radial_MLP).", "",
       1.0},
      {"mlp_irreps", std::string("16x0e"), "Hidden irreps of the last (non-linear) readout (MACE's MLP_irreps)."},
      {"avg_num_neighbors", 0.0,
       "Messages are divided by it. 0 = the mean number of neighbors within model.cutoff in the training set "
       "(MACE's default).",
       "", 0.0},
      {"pair_repulsion", false,
       "Add the ZBL screened nuclear repulsion (MACE's pair_repulsion: Ziegler-Biersack-Littmark with MACE's "
       "screening length, cut off at the sum of covalent radii) to the energy, trained and deployed with the "
       "model: MD then survives close encounters. The ZBL energy is added after scale and shift."},
  };
  f.create = [](const ModelBuildContext& ctx) -> std::shared_ptr<EnergyModel> {
    try {
      return std::make_shared<MaceImpl>(options_from(ctx));
    } catch (const std::invalid_argument& e) {
      // "MaceOptions: hidden_irreps ..." → "model.mace.hidden_irreps ...".
      std::string what = e.what();
      const std::string prefix = "MaceOptions: ";
      if (what.rfind(prefix, 0) == 0) what = "model.mace." + what.substr(prefix.size());
      throw std::invalid_argument(what);
    }
  };
  f.to_json = [](const EnergyModel& m) {
    const auto& o = dynamic_cast<const MaceImpl&>(m).options();
    nlohmann::json h{{"hidden_irreps", o.hidden_irreps},
                          {"max_ell", o.max_ell},
                          {"correlation", o.correlation},
                          {"num_interactions", o.num_interactions},
                          {"num_bessel", o.num_bessel},
                          {"num_polynomial_cutoff", o.num_polynomial_cutoff},
                          {"radial_mlp", o.radial_mlp},
                          {"readout_mlp", o.readout_mlp},
                          {"cutoff", o.cutoff},
                          {"avg_num_neighbors", o.avg_num_neighbors},
                          {"atomic_numbers", o.atomic_numbers}};
    if (o.basis != "crucible") {  // an imported MACE model (docs/mace_import.md)
      h["basis"] = o.basis;
      h["u_columns"] = o.u_columns;
      h["silu_normalization"] = o.silu_normalization;
      if (o.reduced_cg) h["reduced_cg"] = true;
    }
    if (o.pair_repulsion) h["pair_repulsion"] = true;
    return h;
  };
  f.from_json = [](const nlohmann::json& h) -> std::shared_ptr<EnergyModel> {
    MaceOptions o;
    o.hidden_irreps = h.at("hidden_irreps").get<std::string>();
    o.max_ell = h.at("max_ell").get<int>();
    o.correlation = h.at("correlation").get<int>();
    o.num_interactions = h.at("num_interactions").get<int64_t>();
    o.num_bessel = h.at("num_bessel").get<int64_t>();
    o.num_polynomial_cutoff = h.at("num_polynomial_cutoff").get<int64_t>();
    o.radial_mlp = h.at("radial_mlp").get<std::vector<int64_t>>();
    o.readout_mlp = h.at("readout_mlp").get<int64_t>();
    o.cutoff = h.at("cutoff").get<double>();
    o.avg_num_neighbors = h.at("avg_num_neighbors").get<double>();
    o.atomic_numbers = h.at("atomic_numbers").get<std::vector<int64_t>>();
    o.basis = h.value("basis", std::string("crucible"));
    if (h.contains("u_columns")) o.u_columns = h.at("u_columns").get<std::vector<std::vector<std::vector<int64_t>>>>();
    o.silu_normalization = h.value("silu_normalization", 0.0);
    o.pair_repulsion = h.value("pair_repulsion", false);
    o.reduced_cg = h.value("reduced_cg", false);
    return std::make_shared<MaceImpl>(o);
  };
  f.parameter_estimate = [](const ModelBuildContext& ctx) {
    // Upper estimate from the option values alone (no model is built):
    // paths per layer <= (number of hidden irreps) · (max_ell + 1)².
    const mace::Irreps hidden = parse_key("hidden_irreps", ctx.get_string("hidden_irreps"), 3);
    const double C = hidden.size() ? static_cast<double>(hidden.terms()[0].mul) : 1.0;
    const double terms = static_cast<double>(hidden.size());
    const double L = static_cast<double>(ctx.get_int("max_ell") + 1);
    const double nE = static_cast<double>(std::max<size_t>(ctx.elements.size(), 1));
    const double T = static_cast<double>(ctx.get_int("num_interactions"));
    double radial = 0, prev = static_cast<double>(ctx.get_int("num_bessel"));
    for (int64_t w : ctx.get_int_list("radial_mlp")) {
      radial += prev * static_cast<double>(w);
      prev = static_cast<double>(w);
    }
    const double paths = terms * L * L;
    radial += prev * paths * C;
    const double per_layer = terms * C * C + radial + paths * C * C + (L + terms) * nE * C * C +
                             terms * static_cast<double>(ctx.get_int("correlation")) * nE * 64 * C + terms * C * C;
    return nE * C + T * per_layer + C * 16;
  };
  // Per edge and layer: the radial MLP's hidden layers and its output (a
  // weight per tensor-product path and channel) and the messages, C (2 l_out
  // + 1) numbers per path l_in x l_sh -> l_out (|l_in - l_sh| <= l_out <=
  // min(l_in + l_sh, max_ell), in steps of 2 for parity; the first layer's
  // input is scalars only). Per atom and layer: the aggregated messages, the
  // symmetric contraction's C (max_ell+1)^2 correlation terms and the node
  // features. Factors 1.2 (edge) and 0.5 (atom) fitted to peaks measured on
  // 64-atom Cu cells (32x0e to 256x0e+256x1o, max_ell 2-3, correlation 2-3,
  // batch 1-8: within 0.87-1.17 of the peak); validation batches hold 10%.
  f.activation_estimate = [](const ModelBuildContext& ctx) {
    const mace::Irreps hidden = parse_key("hidden_irreps", ctx.get_string("hidden_irreps"), 3);
    const double C = hidden.size() ? static_cast<double>(hidden.terms()[0].mul) : 1.0;
    const int max_ell = static_cast<int>(ctx.get_int("max_ell"));
    const double L2 = static_cast<double>((max_ell + 1) * (max_ell + 1));
    double radial = static_cast<double>(ctx.get_int("num_bessel"));
    for (int64_t w : ctx.get_int_list("radial_mlp")) radial += static_cast<double>(w);
    ActivationEstimate a;
    for (int64_t layer = 0; layer < ctx.get_int("num_interactions"); ++layer) {
      std::vector<int> l_in{0};
      if (layer > 0) {
        l_in.clear();
        for (const auto& t : hidden.terms()) l_in.push_back(t.irrep.l);
      }
      double paths = 0, messages = 0;
      for (int li : l_in)
        for (int ls = 0; ls <= max_ell; ++ls)
          for (int lo = std::abs(li - ls); lo <= std::min(li + ls, max_ell); lo += 2) {
            paths += 1;
            messages += C * (2 * lo + 1);
          }
      a.per_edge += 1.2 * (radial + paths * C + messages);
      a.per_atom += 0.5 * (messages + C * L2 * static_cast<double>(ctx.get_int("correlation")) +
                           static_cast<double>(hidden.dim()));
    }
    a.eval_fraction = 0.1;
    return a;
  };
  return f;
}

}  // namespace crucible

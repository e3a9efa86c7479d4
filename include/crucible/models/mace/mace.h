#pragma once
// MACE (Batatia, Kovács, Simm, Ortner, Csányi, NeurIPS 2022, arXiv
// 2206.07697), in the layout of the reference code's ScaleShiftMACE
// (mace/modules/models.py, v0.3): issue 16.

#include "crucible/models/energy_model.h"
#include "crucible/models/filter_convolution.h"
#include "crucible/models/mace/irreps.h"
#include "crucible/models/mace/radial_spline.h"
#include "crucible/models/spline_cache.h"
#include "crucible/models/mace/symmetric_contraction.h"
#include "crucible/models/mace/tensor_product.h"

#include <ATen/ATen.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>
#include <algorithm>

namespace crucible::mace {
struct ProductBasisPlan;  // product_basis_engine.h
}  // namespace crucible::mace

namespace crucible {

/// MACE hyperparameters (the reference code's names and defaults).
struct MaceOptions {
  std::string hidden_irreps = "32x0e+32x1o";  ///< one multiplicity C for every irrep; must hold 0e.
  int max_ell = 3;                 ///< harmonics of the edge direction to l = max_ell (1..3).
  int correlation = 3;             ///< body order - 1 of the product basis (1..3).
  int64_t num_interactions = 2;    ///< message-passing layers (>= 1).
  int64_t num_bessel = 8;          ///< Bessel radial functions.
  int64_t num_polynomial_cutoff = 5;  ///< envelope exponent p.
  std::vector<int64_t> radial_mlp = {64, 64, 64};  ///< hidden widths of the radial MLP.
  int64_t readout_mlp = 16;        ///< hidden width of the last readout (MACE's MLP_irreps 16x0e).
  double cutoff = 5.0;             ///< r_max, Å.
  double avg_num_neighbors = 1.0;  ///< messages are divided by it (from the training set).
  std::vector<int64_t> atomic_numbers;  ///< the elements (one-hot order), ascending, non-empty.
  /// Autograd-only reference path (dense einsums; the fast path is tested
  /// against it to 1e-10). Not a config key. Default false.
  bool reference_autograd = false;
  /// Where the edge couplings and the product basis come from (not a config
  /// key; docs/mace_import.md):
  /// - "crucible" (default): Crucible's harmonics frame, real Clebsch-Gordan
  ///   couplings and orthonormal product basis;
  /// - "mace": an imported MACE model. Harmonics of r_receiver − r_sender in
  ///   e3nn's frame, couplings from the buffers `layer{t}_w3j_{l1}_{l2}_{l3}`
  ///   (e3nn's wigner_3j blocks; δ/√(2l+1) where an l is 0) and the product
  ///   basis from the buffers `layer{t}_U_matrix_{irrep}_nu{ν}` [2L+1, D^ν, K]
  ///   (MACE's U matrices), and the radial basis from the buffers
  ///   `bessel_weights`, `bessel_prefactor`, `cutoff_r_max`; all filled by
  ///   the import.
  std::string basis = "crucible";
  /// basis "mace": the number K of U-matrix columns per layer, output irrep
  /// (the layer's output irreps in order) and ν - 1; 0 = no such term.
  std::vector<std::vector<std::vector<int64_t>>> u_columns;
  /// Normalisation c of the SiLU between MLP layers (c·silu); 0 = the exact
  /// value with ∫ (c·silu(z))² φ(z) dz = 1 (mace::normalized_silu_factor).
  /// An imported MACE model uses e3nn's Monte Carlo estimate (e3nn
  /// math/_normalize_activation.py: 10^6 float64 normal draws, seed 0).
  double silu_normalization = 0.0;
  /// MACE's ZBL pair repulsion (mace/modules/radial.py ZBLBasis; Ziegler,
  /// Biersack, Littmark 1985; models/zbl.h). An imported model (basis
  /// "mace") adds it to the readouts before scale and shift as MACE does; a
  /// model trained here (config model.mace.pair_repulsion) adds the ZBL
  /// energy itself after them (NequIP's convention):
  ///   V_i = ½ Σ_j 14.3996 Z_i Z_j / r_ij · φ(r_ij / a_ij) · f_p(r_ij / (R_i + R_j)),
  ///   a_ij = 0.4543 · 0.529 / (Z_i^0.3 + Z_j^0.3), φ(x) = Σ_k c_k e^(−d_k x)
  /// with c, the exponent 0.3, the prefactor 0.4543 and the covalent radii
  /// R (ASE's) held as buffers `zbl_*` (MACE's defaults, or the file's);
  /// f_p the polynomial
  /// envelope with p = num_polynomial_cutoff.
  bool pair_repulsion = false;
  /// basis "mace": the file's use_reduced_cg (which only changed how MACE
  /// computed its U matrices, which are read from the file); kept so that
  /// an export rebuilds the same U shapes.
  bool reduced_cg = false;
};

/// MACE energy model.
///
/// Per atom i with element one-hot z_i and neighbors j (r_ij = r_j − r_i):
///   h⁰_i = W_emb z_i / √n_elem                                    (Cx0e)
/// per layer t:
///   R(r) = MLP(b(r) f(r))  (Bessel basis b, envelope f, SiLU MLP, no bias)
///   A_i = Linear( Σ_j R(r_ij) ⊙ (Linear_up h_j ⊗ Y(r̂_ij)) ) / avg_num_neighbors
///   (first layer: A_i ← element-dependent linear of A_i)
///   h_i = Linear( Σ_ν Σ_k W_ν,k(z_i) B_ν,k(A_i) ) [+ element-dependent linear of h_i, t > 0]
///   e_i += readout_t(h_i)  (linear; the last an MLP with SiLU)
/// E = Σ_i (E0[Z_i] + scale · e_i + shift)   (eV).
/// Linear maps act per irrep on channels, scaled 1/√fan_in with N(0,1)
/// weights (e3nn's o3.Linear); the symmetric contraction B is described in
/// symmetric_contraction.h. The last layer produces scalars only.
///
/// Precision (issue 16, deliverable 4): edge vectors, distances, radial
/// basis, harmonics, the coupling tables, the readout sum, scale / shift /
/// E0 and the per-structure sum run with autocast off in the positions'
/// dtype; only the linear maps, the radial MLP and the contractions follow
/// the parameters' dtype or an autocast region; node features and message
/// sums are kept in the parameters' dtype (float32 in the mixed modes).
class MaceImpl : public torch::nn::Cloneable<MaceImpl>, public EnergyModel {
 public:
  /// Parameters in float32. @throws std::invalid_argument naming the option
  /// (hidden_irreps not parsable, unequal multiplicities, no 0e, l above
  /// max_ell... ; max_ell / correlation outside 1..3; no elements; ...).
  explicit MaceImpl(MaceOptions options);
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
  std::string name() const override { return "mace"; }
  std::shared_ptr<EnergyModel> clone_model() const override;
  std::vector<int64_t> elements() const override { return options_.atomic_numbers; }

  /// Per-atom energy without E0: scale · Σ_t e_t + shift, [N] eV float64
  /// (the readouts e_t in the layers' dtype, scaled and shifted in float64).
  /// @throws std::invalid_argument for an element the model was not built for.
  at::Tensor atomic_energies(const Batch& batch);
  /// E0 [119] eV (index Z), scale (eV), shift (eV/atom).
  /// @throws std::invalid_argument on a wrong e0 shape or non-finite values.
  void set_energy_normalization(const at::Tensor& e0, double scale, double shift) override;
  /// atomic_energies + E0[Z], [N] eV float64.
  at::Tensor node_energies(const Batch& batch) override;
  const MaceOptions& options() const { return options_; }
  void set_reference_autograd(bool on) { options_.reference_autograd = on; }
  /// True for an imported MACE model (MaceOptions::basis "mace").
  bool mace_basis() const { return options_.basis == "mace"; }
  /// Inference path (issue 48): layer t's radial weights R_t(r) =
  /// MLP_t(b(r) f(r)) [num_paths · C per distance] as a cubic spline of the
  /// distance on [0, cutoff] (mace::tabulate_radial, relative value error
  /// ≤ 1e-9), in the layers' dtype, built from the current weights on first
  /// use and rebuilt after a weight changes (storage or version). nullptr
  /// when splines are off (set_radial_spline(false), or the environment's
  /// CRUCIBLE_RADIAL_SPLINE=0): then the MLP runs per distance pair, the
  /// exact reference. Thread-safe. @throws std::out_of_range for t outside
  /// 0..num_interactions-1.
  std::shared_ptr<const mace::RadialSpline> radial_spline(int64_t t) const;
  /// Turns the inference path's radial splines on or off (this model and
  /// its later clones). Never throws.
  void set_radial_spline(bool on) { radial_spline_ = on; }
  /// Whether the inference path uses radial_spline(): set_radial_spline's
  /// value, else CRUCIBLE_RADIAL_SPLINE (0 = off), else on.
  bool radial_spline_enabled() const;

 private:
  /// e0_, scale_, shift_ and the defined zbl_* buffers: kept float64 by to().
  std::vector<at::Tensor> float64_buffers() const {
    std::vector<at::Tensor> out{e0_, scale_, shift_};
    for (const at::Tensor* t : {&zbl_c_, &zbl_a_exp_, &zbl_a_prefactor_, &zbl_covalent_radii_})
      if (t->defined()) out.push_back(*t);
    return out;
  }
  struct Layer {
    mace::Irreps node, target, out;  // per channel (multiplicity 1)
    std::shared_ptr<mace::ConvTensorProduct> tp;
    std::shared_ptr<mace::MonomialTable> table;
    std::vector<const mace::SymmetricBasis*> bases;  // [out][ν] flattened out·corr + ν-1
    std::vector<std::shared_ptr<mace::SymmetricBasis>> owned_bases;  // basis "mace": built from the U buffers
    // Fast path, built once: per ν the outputs' coefficient rows stacked
    // (float64, CPU; undefined if none) and the monomial indices.
    std::vector<at::Tensor> stacked_coefficients, monomial_indices;
    // The inference engine's index form of `table` (product_basis_engine.h),
    // built with it: the same for every call.
    std::shared_ptr<const mace::ProductBasisPlan> engine_plan;
    size_t out_scalar = 0;  // index of 0e in `out`
  };
  at::Tensor element_index(const at::Tensor& atomic_numbers) const;
  at::Tensor radial_weights(int64_t t, const at::Tensor& edge_feats) const;
  /// Interaction t's product basis of A [N, D_target, C] with the element
  /// weights of `elem` [N]: one [N, O, C] per output irrep. Chunked and
  /// checkpointed on the inference path (`chunked`) and, above 16384 nodes,
  /// on the training path (checkpointed_rows_twice).
  std::vector<at::Tensor> product_basis(int64_t t, const at::Tensor& A, const at::Tensor& elem, bool chunked) const;
  /// Interaction t: messages from every row of `h_in` along the given
  /// edges, node updates for its first `n_out` rows (-1 = all;
  /// Batch::layer_nodes), which the result [n_out, D, C] holds.
  /// The training fast path's edge inputs of one layer: per input term its
  /// coupling table [E, rows, 2l1+1] and its paths' radial weights [E, count, C].
  struct TermEdges {
    std::vector<at::Tensor> tables, weights;  ///< weights: [pairs, count·C], one row per distance pair
    PairEdges pairs;                          ///< the layer's edges grouped by pair
  };
  /// `radial`: the per-edge weights [E, P·C] (reference path) or the pair
  /// features (inference path, `chunked`); unused when `fast` is given.
  at::Tensor layer_forward(int64_t t, const at::Tensor& h_in, const at::Tensor& elem_all, const at::Tensor& sender,
                           const at::Tensor& receiver, const at::Tensor& Y, const at::Tensor& radial,
                           const TermEdges* fast, const PairEdges* chunked = nullptr, int64_t n_out = -1);
  /// The radial MLP of layer t split at its last layer by input term:
  /// per term [rows of edge_feats, count · C] (its paths' columns), undefined
  /// for a term without paths. Sums to radial_weights column-wise.
  std::vector<at::Tensor> radial_term_weights(int64_t t, const at::Tensor& edge_feats) const;
  /// The radial MLP's weights of layer t with their scales folded in.
  std::vector<at::Tensor> radial_mlp_weights(int64_t t) const;

  /// The layer's fast-path tables from its table: stacked coefficient rows
  /// and monomial indices per ν.
  static void stack_product_tables(Layer& L);
  /// basis "mace": registers the U-matrix and w3j buffers of layer t (L).
  void register_file_tables(const Layer& L, int64_t t, const std::string& prefix);
  /// basis "mace": rebuilds every layer's coupling and product tables from
  /// the buffers when their storage or version changed (after a load,
  /// to(dtype), clone). Called first by atomic_energies.
  void refresh_file_tables();
  /// The SiLU normalisation c (MaceOptions::silu_normalization).
  double silu_factor() const;

  MaceOptions options_;
  mace::Irreps hidden_;  // per channel
  int64_t channels_ = 0;
  std::vector<Layer> layers_;
  at::Tensor z_index_;  // [119] int64 CPU, -1 = unknown element
  std::vector<std::vector<at::Tensor>> radial_, linear_up_, linear_, skip_, product_linear_;
  std::vector<std::vector<std::vector<at::Tensor>>> product_weights_;  // [t][out][ν]
  std::vector<std::vector<at::Tensor>> readout_;
  at::Tensor embedding_, e0_, scale_, shift_;
  // basis "mace": U matrices [t][out][ν-1] (undefined where K = 0) and w3j
  // blocks per layer keyed by (l1, l2, l3); the buffers' (storage, version)
  // when the tables were last built.
  std::vector<std::vector<std::vector<at::Tensor>>> u_matrices_;
  /// basis "mace": MACE's radial constants as its file stores them (float32
  /// rounded in a float32 model): Bessel frequencies [num_bessel], prefactor
  /// and the envelope's r_max [].
  at::Tensor bessel_weights_, bessel_prefactor_, cutoff_r_max_;
  /// MaceOptions::pair_repulsion: ZBL coefficients c [4], the screening
  /// length's exponent and prefactor [], covalent radii [119] Å.
  at::Tensor zbl_c_, zbl_a_exp_, zbl_a_prefactor_, zbl_covalent_radii_;
  /// The ZBL pair energy of each node (receiver sums), [N] in `r`'s dtype.
  at::Tensor pair_repulsion(const Batch& batch, const at::Tensor& r) const;
  std::vector<std::map<std::array<int, 3>, at::Tensor>> w3j_;
  std::vector<std::pair<const void*, int64_t>> file_tables_signature_;
  std::shared_ptr<SplineCache> spline_cache_ = std::make_shared<SplineCache>();
  std::optional<bool> radial_spline_;
  /// Whether a call runs the inference engine (issue 48): the chunked
  /// inference path (`chunked`) on the CPU with radial splines on. One
  /// condition for the harmonics, the interaction and the product basis.
  bool engine_on(bool chunked) const { return chunked && embedding_.device().is_cpu() && radial_spline_enabled(); }
  std::shared_ptr<std::mutex> file_tables_mutex_ = std::make_shared<std::mutex>();
};
TORCH_MODULE(Mace);

/// Mean number of neighbors per atom within `cutoff` over `counts` (edges
/// per structure / atoms per structure, summed): MACE's avg_num_neighbors.
/// Returns 1 when there are no atoms. Never throws.
double average_num_neighbors(int64_t total_edges, int64_t total_atoms);

}  // namespace crucible

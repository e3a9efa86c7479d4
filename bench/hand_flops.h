#pragma once
// FLOPs per atom of one inference call (energy, forces and stress), counted
// by hand from the model's architecture (issue 48, item 5): what the
// engine's loops and matrix products must do, term by term, with the
// multiply and the add of a multiply-add counted as 2. The bench divides
// them by the measured float32 GEMM rate: the machine's arithmetic limit,
// a time no implementation of the same algorithm beats on one core.
//
// Counted: every product of a size that grows with the channels; not
// counted: O(1)-per-edge geometry (distances, the cutoff envelope's
// scalars), index arithmetic and memory traffic. Sizes of the tensor
// product (rows per input irrep) and of the symmetric contraction
// (monomials and nonzero coefficients per degree) are read off the same
// tables the model builds (ConvTensorProduct, monomial_table), so the count
// follows the architecture rather than a formula's guess of them.

#include "crucible/models/mace/irreps.h"
#include "crucible/models/mace/mace.h"
#include "crucible/models/mace/symmetric_contraction.h"
#include "crucible/models/mace/tensor_product.h"
#include "crucible/models/schnet.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace crucible::bench {

/// MACE's engine (radial splines, sparse product basis, hand-written edge
/// backward; docs/mace_engine.md), forward + the reverse pass for forces
/// and stress, per atom, with `edges_per_atom` directed edges (pairs: half).
/// Per layer t, with C channels, Dsh = (max_ell+1)² harmonics and, for each
/// input irrep a of dimension d_a with rows R_a of its tensor-product paths:
///   per edge  Σ_a [ 3 · 2 Dsh R_a d_a            (T = Y M: forward, recomputed, and ∂/∂Y)
///                 + R_a (2 d_a C + 2 C)           (message)
///                 + R_a (3 C + 6 d_a C) ]         (one-pass ∂/∂x, ∂/∂w, ∂/∂T)
///   per pair  24 · paths · C                     (quintic Hermite values and ∂/∂r)
///   per atom  2 · [ Σ_a d_a 2C² (linear_up) + Σ_b d_b 2 paths_b C² (linear)
///                 + Σ_out d 2C² (skip, product linear) ]
///           + Σ_ν [ M_ν C + 2 nnz_ν C + 2 OK_ν C      (monomials, P·M, element weights)
///                 + 2 OK_ν C + 2 nnz_ν C + 4 M_ν C ]  (their reverse)
/// plus the readouts (2 · 2C per layer, the last an MLP C → 16 → 1).
inline double mace_engine_flops_per_atom(const MaceOptions& o, double edges_per_atom) {
  using namespace mace;
  const Irreps hidden = Irreps::parse(o.hidden_irreps, o.max_ell);
  const double C = static_cast<double>(hidden.terms().front().mul);
  std::vector<MulIrrep> per_channel, sh, scalar{MulIrrep{1, Irrep{0, 1}}};
  for (const auto& t : hidden.terms()) per_channel.push_back(MulIrrep{1, t.irrep});
  for (int l = 0; l <= o.max_ell; ++l) sh.push_back(MulIrrep{1, Irrep{l, l % 2 ? -1 : 1}});
  const Irreps target(sh), node_hidden(per_channel), node_scalar(scalar);
  const double Dsh = static_cast<double>((o.max_ell + 1) * (o.max_ell + 1));
  const double pairs_per_atom = 0.5 * edges_per_atom;
  double total = 0.0;
  for (int64_t t = 0; t < o.num_interactions; ++t) {
    const bool last = t == o.num_interactions - 1;
    const Irreps& node = t == 0 ? node_scalar : node_hidden;
    const Irreps& out = last ? node_scalar : node_hidden;
    const ConvTensorProduct tp(node, o.max_ell, target);
    double per_edge = 0.0;
    for (size_t a = 0; a < node.size(); ++a) {
      const double d = node.terms()[a].irrep.dim();
      double rows = 0.0;
      for (const auto& p : tp.paths())
        if (p.in_term == a) rows += p.out.dim();
      per_edge += 3.0 * 2.0 * Dsh * rows * d + rows * (2.0 * d * C + 2.0 * C) + rows * (3.0 * C + 6.0 * d * C);
    }
    const double per_pair = 24.0 * static_cast<double>(tp.num_paths()) * C;
    double per_atom = 0.0;
    for (const auto& term : node.terms()) per_atom += 2.0 * term.irrep.dim() * 2.0 * C * C;  // linear_up
    for (size_t b = 0; b < target.size(); ++b) {
      double paths = 0.0;
      for (const auto& p : tp.paths()) paths += p.target_term == b ? 1.0 : 0.0;
      per_atom += 2.0 * target.terms()[b].irrep.dim() * 2.0 * paths * C * C;  // linear (mid → target)
    }
    std::vector<Irrep> outs;
    for (const auto& term : out.terms()) {
      outs.push_back(term.irrep);
      per_atom += 2.0 * 2.0 * term.irrep.dim() * 2.0 * C * C;  // skip and product linear
    }
    const MonomialTable table = monomial_table(target, outs, o.correlation);
    for (int nu = 1; nu <= o.correlation; ++nu) {
      const auto n = static_cast<size_t>(nu - 1);
      const double M = static_cast<double>(table.monomials[n].size(0));
      double nnz = 0.0, ok = 0.0;
      for (size_t b = 0; b < outs.size(); ++b) {
        if (table.coefficients[n][b].defined()) nnz += table.coefficients[n][b].ne(0).sum().item<double>();
        ok += static_cast<double>(table.out_dims[n][b] * table.num_basis[n][b]);
      }
      const double build = nu >= 2 ? M : 0.0;
      per_atom += (build + 2.0 * nnz + 2.0 * ok) * C + (2.0 * ok + 2.0 * nnz + 4.0 * build) * C;
    }
    per_atom += last ? 2.0 * (2.0 * C * o.readout_mlp + 2.0 * o.readout_mlp) : 2.0 * 2.0 * C;
    total += per_atom + edges_per_atom * per_edge + pairs_per_atom * per_pair;
  }
  return total;
}

/// SchNet's inference call per atom (F hidden, Fi filters, G Gaussians, T
/// interactions; Schütt et al. 2018): per distance pair and interaction the
/// filter W(r), three times (the forward, its recomputation in the
/// backward, and the reverse pass to r): with `filter_spline` (the default
/// inference path, SchNetImpl::filter_spline) a quintic per filter value
/// (5 multiply-adds: 10 Fi FLOPs each time), else the network Dense(G → Fi)
/// · ssp · Dense(Fi → Fi) (2 G Fi + 2 Fi² + 12 Fi each time); per edge the
/// cfconv product and its reverse (2 Fi + 4 Fi), per atom the dense maps
/// in2f, f2out (Fi → F, ssp, F → F) and the readout F → F/2 → 1, each twice
/// (forward and ∂/∂x).
/// schnet_flops_per_atom's terms by the unit their work scales with.
struct SchNetFlops {
  double atoms = 0;  ///< dense maps and readout, per atom.
  double edges = 0;  ///< cfconv, per atom (edges_per_atom edges).
  double pairs = 0;  ///< the filter, per atom (edges_per_atom / 2 pairs).
  double total() const { return atoms + edges + pairs; }
};

inline SchNetFlops schnet_flops_split(const SchNetOptions& o, double edges_per_atom, bool filter_spline = true) {
  const double F = static_cast<double>(o.hidden_channels), Fi = static_cast<double>(o.num_filters);
  const double G = static_cast<double>(o.num_gaussians), T = static_cast<double>(o.num_interactions);
  const double per_pair = filter_spline ? 3.0 * 10.0 * Fi : 3.0 * (2.0 * G * Fi + 2.0 * Fi * Fi + 12.0 * Fi);
  const double per_edge = 6.0 * Fi;
  const double per_atom = 2.0 * (2.0 * F * Fi + 2.0 * Fi * F + 2.0 * F * F + 10.0 * F);
  const double readout = 2.0 * (2.0 * F * (F / 2.0) + F);
  return {T * per_atom + readout, T * edges_per_atom * per_edge, T * 0.5 * edges_per_atom * per_pair};
}

inline double schnet_flops_per_atom(const SchNetOptions& o, double edges_per_atom, bool filter_spline = true) {
  return schnet_flops_split(o, edges_per_atom, filter_spline).total();
}

}  // namespace crucible::bench

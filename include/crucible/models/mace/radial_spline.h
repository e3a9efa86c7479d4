#pragma once
// MACE's radial weights as splines of the distance (issue 48, step 1 of
// docs/mace_engine.md): R_t(r) = MLP_t(b(r) · f(r)) depends on |r| alone,
// so at inference it is tabulated once per set of weights and evaluated per
// distance pair by a quintic, instead of three dense layers per pair forward
// and again in the backward (the idea of Symmetrix, MIT licensed; the code
// here is written from the formulas below). SchNet's filter network
// W_t(r) uses the same tables (SchNetImpl::filter_spline).

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

namespace crucible::mace {

/// A vector function of the distance, R: [0, r_max] → ℝ^K, as piecewise
/// quintic Hermite interpolation on a uniform grid r_g = g·h (values, first
/// and second derivatives at the nodes, exact; de Boor, A Practical Guide to
/// Splines, ch. IV). On [r_g, r_g + h] with t = (r − r_g)/h, Δ = y_{g+1} − y_g,
/// m = h y', a = h² y'':
///   S(r) = Σ_{j=0..5} c_j t^j,  c0 = y_g, c1 = m_g, c2 = a_g / 2,
///   c3 = 10Δ − 6m_g − 4m_{g+1} − (3a_g − a_{g+1})/2,
///   c4 = −15Δ + 8m_g + 7m_{g+1} + (3a_g − 2a_{g+1})/2,
///   c5 = 6Δ − 3m_g − 3m_{g+1} − (a_g − a_{g+1})/2,
/// so S, S' and S'' are continuous. Its error is at most h⁶/46080 ·
/// max|R⁽⁶⁾| (the Hermite remainder R⁽⁶⁾(ξ)/6! · (r − r_g)³(r − r_{g+1})³);
/// a cubic would need ~8x the intervals for MACE's radial MLPs (4096 on
/// [0, 5] Å for 1e-7 in the derivatives, 42 MB a layer at 64 channels).
/// value_error() and derivative_error() are the errors measured against R
/// when the table is built.
class RadialSpline {
 public:
  /// R, dR/dr and d²R/dr² [M,K] float64 at r [M] float64 (Å).
  struct Values {
    at::Tensor value, first, second;
  };
  using Function = std::function<Values(const at::Tensor& r)>;
  /// How the table takes its node r = 0.
  enum class Origin {
    /// `f` is even in r (MACE's b(r) f(r), whose Bessel basis sin(kr)/r is
    /// 0/0 at r = 0): the value at r = 1e-9 h, the first derivative 0 and
    /// the second derivative at r = 1e-3 h.
    kEven,
    /// `f` is smooth at r = 0 and evaluated there (SchNet's filter, whose
    /// Gaussians exp(-γ(r - μ)²) have R'(0) ≠ 0).
    kSmooth,
  };

  /// Tabulates `f` on [0, r_max] with num_intervals intervals, keeping the
  /// coefficients in `dtype` (float32 or float64); the node r = 0 as
  /// `origin` says. Measures the error at the quarter, mid and
  /// three-quarter points of every interval against f (float64
  /// coefficients, so the measured figures are the interpolation error,
  /// not the storage dtype's).
  /// @throws std::invalid_argument if r_max <= 0, num_intervals < 1, dtype
  ///         is not float32/float64, or f returns wrong shapes.
  RadialSpline(const Function& f, double r_max, int64_t num_intervals, at::ScalarType dtype,
               Origin origin = Origin::kEven);

  /// S(r) [P,K] in the table's dtype for r [P] (any float dtype, Å; clamped
  /// to [0, r_max]). CPU, contiguous output. Never throws for a 1-D r.
  at::Tensor values(const at::Tensor& r) const;
  /// S'(r) = dS/dr [P,K] (per Å) in the table's dtype. Never throws for a 1-D r.
  at::Tensor derivatives(const at::Tensor& r) const;
  /// g_r [P] = Σ_k g[p,k] · S'_k(r_p) for g [P,K] in the table's dtype: the
  /// backward of values() for r. Never throws for matching shapes.
  at::Tensor backward(const at::Tensor& r, const at::Tensor& g) const;

  double r_max() const { return r_max_; }
  double spacing() const { return h_; }
  int64_t num_intervals() const { return G_; }
  int64_t num_outputs() const { return K_; }
  at::ScalarType dtype() const { return coefficients_.scalar_type(); }
  /// max |S − R| / max |R| over the test points (0 if R ≡ 0).
  double value_error() const { return value_error_; }
  /// max |S' − R'| / max |R'| over the test points (0 if R' ≡ 0).
  double derivative_error() const { return derivative_error_; }
  /// Bytes of the coefficient table [G, 6, K].
  int64_t bytes() const { return coefficients_.numel() * static_cast<int64_t>(coefficients_.element_size()); }

 private:
  double r_max_ = 0, h_ = 0;
  int64_t G_ = 0, K_ = 0;
  at::Tensor coefficients_;  // [G, 6, K], c0..c5 per interval
  double value_error_ = 0, derivative_error_ = 0;
};

/// The coarsest grid of r_max/2^k (k = 5 .. 12) whose measured errors are
/// at most `value_tolerance` (relative, values) and 100 · value_tolerance
/// (relative, derivatives, whose Hermite error is one order of h larger);
/// the finest one when none is; the node r = 0 as `origin` says.
/// @throws as RadialSpline.
RadialSpline tabulate_radial(const RadialSpline::Function& f, double r_max, double value_tolerance,
                             at::ScalarType dtype, RadialSpline::Origin origin = RadialSpline::Origin::kEven);

}  // namespace crucible::mace

// Issue 7: the hand-written derivatives (shifted softplus) against
// autograd's generic ones, and SchNet's fast path against its reference
// path: energies, forces, stress and parameter gradients of an energy +
// forces + stress loss agree to 1e-10 in float64.

#include "crucible/losses/loss.h"
#include "crucible/models/cfconv.h"
#include "crucible/models/schnet.h"
#include "crucible/precision/precision.h"
#include "crucible/models/gemm_rows.h"
#include "crucible/models/shifted_softplus.h"
#include "helpers.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <cmath>
#include <limits>
#include <optional>
#include <functional>
#include <string>
#include <vector>
#include <torch/csrc/autograd/autograd.h>

namespace crucible {
namespace {

using testing::make_batch;
using testing::random_periodic;

TEST(FastPath, ShiftedSoftplusValueFirstAndSecondDerivatives) {
  // |x| < 20: at::softplus switches to the identity above its threshold 20
  // (derivative exactly 1 instead of σ(x) = 1 - 2e-9); the closed forms
  // below hold everywhere.
  const at::Tensor x0 = at::linspace(-19.9, 19.9, 161, at::kDouble);
  at::Tensor xa = x0.clone().requires_grad_(true);
  at::Tensor xb = x0.clone().requires_grad_(true);
  const at::Tensor w = at::cos(x0);  // a non-uniform upstream gradient
  at::Tensor ya = shifted_softplus(xa);
  at::Tensor yb = shifted_softplus_reference(xb);
  EXPECT_LT((ya - yb).abs().max().item<double>(), 1e-14);
  // First derivative with a graph, then a second-order quantity.
  at::Tensor ga = torch::autograd::grad({(ya * w).sum()}, {xa}, {}, true, true)[0];
  at::Tensor gb = torch::autograd::grad({(yb * w).sum()}, {xb}, {}, true, true)[0];
  EXPECT_LT((ga - gb).abs().max().item<double>(), 1e-14);
  // Closed forms: ssp' = σ, ssp'' = σ(1 − σ).
  EXPECT_LT((ga - w * at::sigmoid(x0)).abs().max().item<double>(), 1e-14);
  at::Tensor ha = torch::autograd::grad({ga.pow(2).sum()}, {xa})[0];
  at::Tensor hb = torch::autograd::grad({gb.pow(2).sum()}, {xb})[0];
  EXPECT_LT((ha - hb).abs().max().item<double>(), 1e-13);
  const at::Tensor s = at::sigmoid(x0);
  EXPECT_LT((ha - 2.0 * w * s * w * s * (1.0 - s)).abs().max().item<double>(), 1e-13);
  EXPECT_EQ(shifted_softplus(at::zeros({1}, at::kDouble)).item<double>(), 0.0);
  // Far out: ssp' = σ(x) stays exact (the reference's threshold does not).
  at::Tensor far = at::full({1}, 25.0, at::kDouble).requires_grad_(true);
  at::Tensor d = torch::autograd::grad({shifted_softplus(far).sum()}, {far})[0];
  EXPECT_DOUBLE_EQ(d.item<double>(), 1.0 / (1.0 + std::exp(-25.0)));
}

// The one-pass CPU loop (issue 19) against ssp and σ evaluated in float64
// by the C library on the same (rounded) inputs: float64 to 1e-15, float32
// to 4 ulps, bfloat16 to the nearest bfloat16 of the exact value (one ulp
// where the exact value lies within float32 rounding of a tie).
TEST(FastPath, ShiftedSoftplusAndSigmoidLoopMatchesLibmInEveryDtype) {
  const at::Tensor grid = at::cat({at::linspace(-60.0, 60.0, 4801, at::kDouble),
                                   at::linspace(-1e-3, 1e-3, 101, at::kDouble)});
  for (at::ScalarType dt : {at::kDouble, at::kFloat, at::kBFloat16}) {
    const at::Tensor x = grid.to(dt);
    auto [y, s] = shifted_softplus_and_sigmoid(x);
    ASSERT_EQ(y.scalar_type(), dt);
    ASSERT_EQ(s.scalar_type(), dt);
    ASSERT_EQ(y.sizes(), x.sizes());
    const at::Tensor xd = x.to(at::kDouble).contiguous();
    const double* xv = xd.data_ptr<double>();
    std::vector<double> want_y(xd.numel()), want_s(xd.numel());
    for (int64_t k = 0; k < xd.numel(); ++k) {
      want_y[k] = std::log1p(std::exp(xv[k])) - std::log(2.0);  // no overflow for |x| <= 60
      want_s[k] = 1.0 / (1.0 + std::exp(-xv[k]));
    }
    const at::Tensor ey = at::tensor(want_y, at::kDouble), es = at::tensor(want_s, at::kDouble);
    const double ulp = dt == at::kDouble ? 1.1e-16 : dt == at::kFloat ? 6e-8 : 3.9e-3;
    const double tol = dt == at::kBFloat16 ? ulp : 4 * ulp;
    // Relative to max(|value|, 1): near x = 0, ssp(x) ≈ x/2 is the
    // difference of ln(1 + e^-|x|) and ln 2 (as in softplus(x) − ln 2), so
    // the error there is absolute, a few ulps of 1. Bfloat16 relative to the
    // value itself where that is larger than 1e-2.
    const double floor = dt == at::kBFloat16 ? 1e-2 : 1.0;
    const at::Tensor ry = (y.to(at::kDouble) - ey).abs() / ey.abs().clamp_min(floor);
    const at::Tensor rs = (s.to(at::kDouble) - es).abs() / es.abs().clamp_min(floor);
    EXPECT_LT(ry.max().item<double>(), tol) << dt;
    EXPECT_LT(rs.max().item<double>(), tol) << dt;
    if (dt == at::kBFloat16) {
      // Rounded once: the nearest bfloat16 of the exact value (ties aside).
      const double exact_match = y.to(at::kDouble).eq(ey.to(at::kBFloat16).to(at::kDouble)).to(at::kDouble).mean().item<double>();
      EXPECT_GT(exact_match, 0.99);
    }
  }
  // Special values propagate; a non-contiguous input is read by stride.
  const at::Tensor sp = at::tensor({std::nan(""), INFINITY, -INFINITY, 0.0}, at::kFloat);
  auto [ys, ss] = shifted_softplus_and_sigmoid(sp);
  EXPECT_TRUE(std::isnan(ys[0].item<float>()));
  EXPECT_TRUE(std::isnan(ss[0].item<float>()));
  EXPECT_EQ(ys[1].item<float>(), INFINITY);
  EXPECT_EQ(ss[1].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(ys[2].item<float>(), -static_cast<float>(std::log(2.0)));
  EXPECT_EQ(ss[2].item<float>(), 0.0f);
  EXPECT_EQ(ys[3].item<float>(), 0.0f);
  EXPECT_EQ(ss[3].item<float>(), 0.5f);
  const at::Tensor wide = at::randn({7, 10}, at::kFloat) * 5.0;
  const at::Tensor strided = wide.t();
  auto [yt, st] = shifted_softplus_and_sigmoid(strided);
  auto [yc, sc] = shifted_softplus_and_sigmoid(strided.contiguous());
  EXPECT_TRUE(yt.equal(yc));
  EXPECT_TRUE(st.equal(sc));
  // Threads split the elements (at::parallel_for): the same values on 1
  // and 2 threads, bf16 blocks included.
  const int threads = at::get_num_threads();
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const at::Tensor big = (at::randn({100003}, at::kFloat) * 4.0).to(dt);
    at::set_num_threads(1);
    auto [y1, s1] = shifted_softplus_and_sigmoid(big);
    at::set_num_threads(2);
    auto [y2, s2] = shifted_softplus_and_sigmoid(big);
    at::set_num_threads(threads);
    EXPECT_TRUE(y1.equal(y2)) << dt;
    EXPECT_TRUE(s1.equal(s2)) << dt;
    EXPECT_TRUE(y1.equal(shifted_softplus_and_sigmoid(big.clone()).first)) << dt;
  }
}

// The second-order loop in float32 and bfloat16 against the closed forms
// evaluated in float64: ssp' = σ, ssp'' = σ(1 − σ).
TEST(FastPath, ShiftedSoftplusSecondOrderInFloat32AndBf16) {
  const at::Tensor x0 = at::linspace(-8.0, 8.0, 257, at::kDouble);
  const at::Tensor w = at::cos(3.0 * x0);
  const at::Tensor sd = at::sigmoid(x0);
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const double tol = dt == at::kFloat ? 1e-6 : 2e-2;
    at::Tensor x = x0.to(dt).requires_grad_(true);
    const at::Tensor y = shifted_softplus(x);
    const at::Tensor g = torch::autograd::grad({(y * w.to(dt)).sum()}, {x}, {}, true, true)[0];
    EXPECT_EQ(g.scalar_type(), dt);
    EXPECT_LT((g.to(at::kDouble) - w * sd).abs().max().item<double>(), tol) << dt;
    const at::Tensor h = torch::autograd::grad({g.pow(2).sum()}, {x})[0];
    EXPECT_LT((h.to(at::kDouble) - 2.0 * w * sd * w * sd * (1.0 - sd)).abs().max().item<double>(), 2 * tol) << dt;
  }
}

// Each of `got` within `tol` of `want` relative to max(1, |want|).
void expect_close(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, double tol,
                  at::ScalarType dt) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    const double scale = std::max(1.0, want[k].abs().max().item<double>());
    EXPECT_LT((got[k] - want[k]).abs().max().item<double>() / scale, tol) << "quantity " << k << " dtype " << dt;
  }
}

TEST(FastPath, CfconvAndEdgeProductMatchCompositeOpsToSecondOrder) {
  for (at::ScalarType dt : {at::kDouble, at::kFloat}) {
    const double tol = dt == at::kDouble ? 1e-12 : 2e-4;
    at::manual_seed(1);
    const int64_t N = 7, E = 30, K = 5;
    const at::Tensor recv = at::randint(0, N, {E}, at::kLong);
    const at::Tensor send = at::randint(0, N, {E}, at::kLong);
    const at::Tensor h0 = at::randn({N, K}, dt), w0 = at::randn({E, K}, dt);
    const at::Tensor up = at::randn({N, K}, dt);
    std::vector<at::Tensor> results[2];
    for (int path = 0; path < 2; ++path) {
      at::Tensor h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      at::Tensor v = path == 0 ? cfconv(h, w, recv, send)
                               : at::zeros({N, K}, dt).index_add(0, recv, h.index_select(0, send) * w);
      auto g = torch::autograd::grad({(v * up).sum()}, {h, w}, {}, true, true);
      // A second-order quantity through both first derivatives.
      at::Tensor q = (g[0].pow(2).sum() + (g[1] * w).pow(2).sum());
      auto gg = torch::autograd::grad({q}, {h, w});
      results[path] = {v, g[0], g[1], gg[0], gg[1]};
    }
    expect_close(results[0], results[1], tol, dt);
    // edge_product against its definition.
    const at::Tensor p = edge_product(h0, up, send, recv);
    EXPECT_LT((p - h0.index_select(0, send) * up.index_select(0, recv)).abs().max().item<double>(), tol);
  }
}

TEST(FastPath, PairFilterCfconvMatchesGatheredFiltersToSecondOrder) {
  // cfconv_pairs(h, Wp, r, s, pair) against cfconv's composite definition
  // with the filter gathered to edges, Wp.index_select(0, pair); both
  // derivatives and a second-order quantity through them.
  for (at::ScalarType dt : {at::kDouble, at::kFloat}) {
    const double tol = dt == at::kDouble ? 1e-12 : 2e-4;
    at::manual_seed(2);
    const int64_t N = 6, E = 40, P = 17, K = 4;
    const at::Tensor recv = at::randint(0, N, {E}, at::kLong);
    const at::Tensor send = at::randint(0, N, {E}, at::kLong);
    const at::Tensor pair = at::randint(0, P, {E}, at::kLong);
    const at::Tensor h0 = at::randn({N, K}, dt), w0 = at::randn({P, K}, dt), up = at::randn({N, K}, dt);
    std::vector<at::Tensor> results[2];
    for (int path = 0; path < 2; ++path) {
      at::Tensor h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      at::Tensor v = path == 0 ? cfconv_pairs(h, w, recv, send, pair)
                               : at::zeros({N, K}, dt).index_add(
                                     0, recv, h.index_select(0, send) * w.index_select(0, pair));
      auto g = torch::autograd::grad({(v * up).sum()}, {h, w}, {}, true, true);
      at::Tensor q = g[0].pow(3).sum() + (g[1] * w).pow(2).sum();
      auto gg = torch::autograd::grad({q}, {h, w});
      results[path] = {v, g[0], g[1], gg[0], gg[1]};
    }
    expect_close(results[0], results[1], tol, dt);
    // edge_product_pairs against its definition: a per-pair sum.
    const at::Tensor q = edge_product_pairs(h0, up, send, recv, pair, P);
    const at::Tensor ref = at::zeros({P, K}, dt).index_add(0, pair, h0.index_select(0, send) * up.index_select(0, recv));
    EXPECT_LT((q - ref).abs().max().item<double>(), tol);
    EXPECT_GT(ref.abs().max().item<double>(), 0.1);
  }
  // An out-of-range pair index is refused.
  const at::Tensor h = at::randn({3, 2}), w = at::randn({2, 2});
  const at::Tensor idx = at::zeros({2}, at::kLong);
  EXPECT_THROW(cfconv_pairs(h, w, idx, idx, at::full({2}, 2, at::kLong)), c10::Error);
}

TEST(FastPath, CfconvAndEdgeProductRefuseEveryOutOfRangeIndex) {
  // Each index tensor is checked against its own table: below 0 and at the
  // row count are refused with a message naming it; the extreme valid rows
  // (0 and n - 1) pass, contiguous or strided.
  const at::Tensor h = at::randn({4, 2}, at::kDouble), w = at::randn({3, 2}, at::kDouble);
  auto longs = [](std::vector<int64_t> v) { return at::tensor(v, at::kLong); };
  const at::Tensor ok = longs({0, 3, 1}), pair = longs({0, 2, 1});
  auto message_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "";
  };
  for (int64_t bad : {-1, 4}) {
    const at::Tensor b = longs({0, bad, 1});
    EXPECT_NE(message_of([&] { cfconv_pairs(h, w, b, ok, pair); }).find("cfconv receiver must index rows 0..3"),
              std::string::npos);
    EXPECT_NE(message_of([&] { cfconv_pairs(h, w, ok, b, pair); }).find("cfconv sender must index rows 0..3"),
              std::string::npos);
    EXPECT_NE(message_of([&] { edge_product(h, h, b, ok); }).find("edge_product left"), std::string::npos);
    EXPECT_NE(message_of([&] { edge_product(h, h, ok, b); }).find("edge_product right"), std::string::npos);
  }
  EXPECT_NE(message_of([&] { cfconv_pairs(h, w, ok, ok, longs({0, 3, 1})); })
                .find("cfconv edge_pair must index rows 0..2"),
            std::string::npos);
  // Long index vectors run the vector body of the range check, not only its
  // scalar tail: one bad index anywhere (first, middle, last) is found.
  const at::Tensor many = at::arange(1001, at::kLong).remainder(4);
  const at::Tensor many_w = at::randn({1001, 2}, at::kDouble);
  EXPECT_EQ(message_of([&] { cfconv(h, many_w, many, many); }), "");
  for (int64_t at_row : {int64_t{0}, int64_t{517}, int64_t{1000}}) {
    for (int64_t bad : {int64_t{-1}, int64_t{4}, std::numeric_limits<int64_t>::min()}) {
      at::Tensor b = many.clone();
      b[at_row] = bad;
      EXPECT_NE(message_of([&] { cfconv(h, many_w, b, many); }).find("cfconv receiver must index rows 0..3"),
                std::string::npos)
          << "bad index " << bad << " at " << at_row;
    }
  }
  // The first and last valid rows, and a strided view (every other element).
  EXPECT_EQ(message_of([&] { cfconv_pairs(h, w, ok, ok, pair); }), "");
  const at::Tensor strided = longs({3, 9, 0, 9, 2, 9}).slice(0, 0, 6, 2);
  EXPECT_EQ(message_of([&] { edge_product(h, h, strided, strided); }), "");
  EXPECT_NE(message_of([&] { edge_product(h, h, longs({3, 0, 4, 0, 1, 0}).slice(0, 0, 6, 2), strided); })
                .find("edge_product left"),
            std::string::npos);
  // Indices on another device than the (CPU) features: refused by name, not
  // read as host memory. The meta device stands in for an accelerator.
  const at::Tensor elsewhere = ok.to(at::kMeta);
  EXPECT_NE(message_of([&] { cfconv_pairs(h, w, elsewhere, ok, pair); })
                .find("cfconv receiver must be on the features' device (cpu), got meta"),
            std::string::npos);
  EXPECT_NE(message_of([&] { cfconv_pairs(h, w, ok, ok, pair.to(at::kMeta)); }).find("cfconv edge_pair must be on"),
            std::string::npos);
  EXPECT_NE(message_of([&] { edge_product(h, h, ok, elsewhere); }).find("edge_product right must be on"),
            std::string::npos);
}

TEST(FastPath, EdgeProductOfTablesWithDifferentRowCountsToSecondOrder) {
  // a [Na,K], b [Nb,K] (MACE's monomial rows times component rows): the
  // derivatives land on each table's own rows.
  const int64_t Na = 7, Nb = 3, E = 25, K = 6;
  at::manual_seed(6);
  const at::Tensor left = at::randint(0, Na, {E}, at::kLong), right = at::randint(0, Nb, {E}, at::kLong);
  const at::Tensor a0 = at::randn({Na, K}, at::kDouble), b0 = at::randn({Nb, K}, at::kDouble);
  const at::Tensor up = at::randn({E, K}, at::kDouble);
  std::vector<at::Tensor> results[2];
  for (int path = 0; path < 2; ++path) {
    at::Tensor a = a0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    at::Tensor p = path == 0 ? edge_product(a, b, left, right) : a.index_select(0, left) * b.index_select(0, right);
    auto g = torch::autograd::grad({(p * up).sum()}, {a, b}, {}, true, true);
    ASSERT_EQ(g[0].size(0), Na);
    ASSERT_EQ(g[1].size(0), Nb);
    at::Tensor q = (g[0] * a).pow(2).sum() + g[1].pow(3).sum();
    auto gg = torch::autograd::grad({q}, {a, b});
    results[path] = {p, g[0], g[1], gg[0], gg[1]};
  }
  expect_close(results[0], results[1], 1e-12, at::kDouble);
}

TEST(FastPath, Bf16CfconvSumsInFloatAndRoundsOnce) {
  // bf16 inputs: the fused kernels sum in float32 and round the result once,
  // so they equal the float32 sums of the same (bf16-exact) values rounded
  // to bf16; the composite bf16 ops would round at every partial sum.
  at::manual_seed(4);
  const int64_t N = 9, E = 300, P = 160, K = 16;
  const at::Tensor recv = at::randint(0, N, {E}, at::kLong), send = at::randint(0, N, {E}, at::kLong);
  const at::Tensor pair = at::randint(0, P, {E}, at::kLong);
  const at::Tensor h = at::randn({N, K}).to(at::kBFloat16), w = at::randn({P, K}).to(at::kBFloat16);
  const at::Tensor v = cfconv_pairs(h, w, recv, send, pair);
  ASSERT_EQ(v.scalar_type(), at::kBFloat16);
  const at::Tensor v32 = cfconv_pairs(h.to(at::kFloat), w.to(at::kFloat), recv, send, pair);
  EXPECT_TRUE(at::equal(v, v32.to(at::kBFloat16)));
  const at::Tensor q = edge_product_pairs(h, h, send, recv, pair, P);
  ASSERT_EQ(q.scalar_type(), at::kBFloat16);
  const at::Tensor q32 = edge_product_pairs(h.to(at::kFloat), h.to(at::kFloat), send, recv, pair, P);
  EXPECT_TRUE(at::equal(q, q32.to(at::kBFloat16)));
  const at::Tensor pe = edge_product(h, h, send, recv);
  EXPECT_TRUE(at::equal(pe, edge_product(h.to(at::kFloat), h.to(at::kFloat), send, recv).to(at::kBFloat16)));
  // NaN stays NaN and ±inf stays ±inf through the rounding of the sums (rows
  // of 40); the rest rounds as LibTorch does.
  at::Tensor hx = at::randn({N, 40}).to(at::kBFloat16);
  hx.index_put_({1, 3}, std::numeric_limits<float>::quiet_NaN());
  hx.index_put_({2, 17}, std::numeric_limits<float>::infinity());
  hx.index_put_({4, 39}, -std::numeric_limits<float>::infinity());
  const at::Tensor px = edge_product(hx, at::ones_like(hx), send, recv);
  const at::Tensor px32 = edge_product(hx.to(at::kFloat), at::ones({N, 40}), send, recv).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(px.isnan(), px32.isnan()));
  EXPECT_GT(px.isnan().sum().item<int64_t>(), 0);
  EXPECT_GT(px.isinf().sum().item<int64_t>(), 0);
  EXPECT_TRUE(at::equal(at::nan_to_num(px, 0.0), at::nan_to_num(px32, 0.0)));
  // Its gradient stays bf16 and equals the float32 one to bf16 rounding.
  at::Tensor hg = h.clone().requires_grad_(true);
  const at::Tensor g = torch::autograd::grad({cfconv_pairs(hg, w, recv, send, pair).to(at::kFloat).sum()}, {hg})[0];
  EXPECT_EQ(g.scalar_type(), at::kBFloat16);
  at::Tensor h32 = h.to(at::kFloat).requires_grad_(true);
  const at::Tensor g32 = torch::autograd::grad({cfconv_pairs(h32, w.to(at::kFloat), recv, send, pair).sum()}, {h32})[0];
  EXPECT_TRUE(at::equal(g, g32.to(at::kBFloat16)));
}

TEST(FastPath, ReverseEdgePairsPairEachEdgeWithItsReverse) {
  // 0→1 (S=0) and 1→0 (S=0); 0→0 with S=(1,0,0) and S=(-1,0,0); 2→1 alone.
  const at::Tensor ei = at::tensor({0, 1, 0, 0, 2, 1, 0, 0, 0, 1}, at::kLong).view({2, 5});
  const at::Tensor sh =
      at::tensor({0, 0, 0, 0, 0, 0, 1, 0, 0, -1, 0, 0, 0, 0, 0}, at::kDouble).view({5, 3});
  auto [edge_pair, rep] = reverse_edge_pairs(ei, sh);
  EXPECT_EQ(rep.size(0), 3);
  EXPECT_EQ(edge_pair[0].item<int64_t>(), edge_pair[1].item<int64_t>());
  EXPECT_EQ(edge_pair[2].item<int64_t>(), edge_pair[3].item<int64_t>());
  EXPECT_NE(edge_pair[0].item<int64_t>(), edge_pair[2].item<int64_t>());
  EXPECT_NE(edge_pair[4].item<int64_t>(), edge_pair[0].item<int64_t>());
  EXPECT_NE(edge_pair[4].item<int64_t>(), edge_pair[2].item<int64_t>());
  for (int64_t p = 0; p < 3; ++p) EXPECT_EQ(edge_pair[rep[p].item<int64_t>()].item<int64_t>(), p);
}

/// Checks reverse_edge_pairs(ei, sh) against its definition by an O(E^2)
/// search: reverse[e] = the first edge k != e (in edge order) with
/// (src, dst, S)_k = (dst, src, -S)_e, or none; e joins the pair of
/// r = reverse[e] when r < e and reverse[r] = e, else opens a new pair
/// (so duplicated edges stay alone). Pairs numbered by first edge.
void expect_brute_force_pairing(const at::Tensor& ei, const at::Tensor& sh) {
  const int64_t E = ei.size(1);
  auto [edge_pair, rep] = reverse_edge_pairs(ei, sh);
  const auto a = ei.accessor<int64_t, 2>();
  const at::Tensor shd = sh.to(at::kDouble);
  const auto s = shd.accessor<double, 2>();
  std::vector<int64_t> reverse(static_cast<size_t>(E), -1);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t k = 0; k < E; ++k) {
      if (k != e && a[0][k] == a[1][e] && a[1][k] == a[0][e] && s[k][0] == -s[e][0] && s[k][1] == -s[e][1] &&
          s[k][2] == -s[e][2]) {
        reverse[static_cast<size_t>(e)] = k;
        break;
      }
    }
  }
  std::vector<int64_t> want_pair(static_cast<size_t>(E)), want_rep;
  int64_t joined = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r = reverse[static_cast<size_t>(e)];
    if (r >= 0 && r < e && reverse[static_cast<size_t>(r)] == e) {
      want_pair[static_cast<size_t>(e)] = want_pair[static_cast<size_t>(r)];
      ++joined;
    } else {
      want_pair[static_cast<size_t>(e)] = static_cast<int64_t>(want_rep.size());
      want_rep.push_back(e);
    }
  }
  EXPECT_TRUE(at::equal(edge_pair, at::tensor(want_pair, at::kLong)));
  EXPECT_TRUE(at::equal(rep, at::tensor(want_rep, at::kLong)));
  EXPECT_GT(joined, E / 10);  // not vacuous: many edges found their reverse
}

TEST(FastPath, ReverseEdgePairsMatchABruteForcePairingOnSortedPeriodicEdges) {
  // Crucible's own list: sorted by source, each source's destinations
  // ascending (the cursor search), several images of one pair with
  // equal destinations, shifts as int64 and as floats.
  const Batch b = make_batch({random_periodic(7, {22, 13}, 11)}, 4.0);
  const at::Tensor ei = b.edge_index.contiguous();
  const int64_t E = ei.size(1);
  ASSERT_GT(E, 50);
  const at::Tensor src = ei[0], dst = ei[1];
  ASSERT_TRUE(at::equal(src, std::get<0>(src.sort())));
  ASSERT_LT((dst.slice(0, 1) < dst.slice(0, 0, E - 1)).logical_and(src.slice(0, 1) == src.slice(0, 0, E - 1))
                .sum()
                .item<int64_t>(),
            1);
  // Several edges of one source share a destination (images of one pair).
  ASSERT_GT(((dst.slice(0, 1) == dst.slice(0, 0, E - 1)) & (src.slice(0, 1) == src.slice(0, 0, E - 1)))
                .sum()
                .item<int64_t>(),
            0);
  expect_brute_force_pairing(ei, b.shifts.to(at::kLong));
  expect_brute_force_pairing(ei, b.shifts.to(at::kFloat));
  // Zero float shifts (the KIM cluster's edge-gradient leaf): the images
  // become duplicated edges, each reverse the first of its run.
  expect_brute_force_pairing(ei, at::zeros({E, 3}, at::kFloat));
  // Undefined shifts (the KIM cluster's batch without a virial) are zero.
  const auto [zpair, zrep] = reverse_edge_pairs(ei, at::zeros({E, 3}, at::kLong));
  const auto [upair, urep] = reverse_edge_pairs(ei, at::Tensor());
  EXPECT_TRUE(at::equal(upair, zpair));
  EXPECT_TRUE(at::equal(urep, zrep));
}

TEST(FastPath, ReverseEdgePairsAreTheSameOnOneAndTwoThreads) {
  // Enough edges (> 2 x 4096: 7 atoms and their images within 15 Å) that
  // two threads each walk their own range with their own cursors, the
  // second starting mid-group.
  const Batch b = make_batch({random_periodic(7, {22, 13}, 11)}, 15.0);
  ASSERT_GT(b.num_edges(), 9000);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto [pair1, rep1] = reverse_edge_pairs(b.edge_index, b.shifts);
  const auto [zpair1, zrep1] = reverse_edge_pairs(b.edge_index, at::zeros({b.num_edges(), 3}, at::kFloat));
  at::set_num_threads(2);
  const auto [pair2, rep2] = reverse_edge_pairs(b.edge_index, b.shifts);
  const auto [zpair2, zrep2] = reverse_edge_pairs(b.edge_index, at::zeros({b.num_edges(), 3}, at::kFloat));
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(pair1, pair2));
  EXPECT_TRUE(at::equal(rep1, rep2));
  EXPECT_TRUE(at::equal(zpair1, zpair2));
  EXPECT_TRUE(at::equal(zrep1, zrep2));
  EXPECT_LT(rep1.size(0), b.num_edges() * 6 / 10);  // most edges found their reverse
}

TEST(FastPath, ReverseEdgePairsMatchABruteForcePairingOnShuffledPeriodicEdges) {
  // A small periodic cell (self-image edges, several images per pair), its
  // edges shuffled so that they are not grouped by center atom.
  const Batch b = make_batch({random_periodic(7, {22, 13}, 11)}, 4.0);
  const int64_t E = b.num_edges();
  ASSERT_GT(E, 50);
  at::manual_seed(5);
  const at::Tensor perm = at::randperm(E, at::kLong);
  const at::Tensor ei = b.edge_index.index_select(1, perm).contiguous();
  const at::Tensor sh = b.shifts.index_select(0, perm).to(at::kDouble).contiguous();
  expect_brute_force_pairing(ei, sh);
  expect_brute_force_pairing(ei, at::zeros({E, 3}, at::kDouble));
  const auto [zpair, zrep] = reverse_edge_pairs(ei, at::zeros({E, 3}, at::kLong));
  const auto [upair, urep] = reverse_edge_pairs(ei, at::Tensor());  // undefined = zero, unsorted edges
  EXPECT_TRUE(at::equal(upair, zpair));
  EXPECT_TRUE(at::equal(urep, zrep));
  EXPECT_THROW(reverse_edge_pairs(ei, at::zeros({E + 1, 3}, at::kLong)), c10::Error);

  // A duplicated edge cannot pair twice: every edge still maps to a
  // representative at its own distance (itself or its reverse).
  const at::Tensor ei2 = at::cat({ei, ei.narrow(1, 0, 1)}, 1);
  const at::Tensor sh2 = at::cat({sh, sh.narrow(0, 0, 1)}, 0);
  auto [pair2, rep2] = reverse_edge_pairs(ei2, sh2);
  for (int64_t e = 0; e <= E; ++e) {
    const int64_t f = rep2[pair2[e].item<int64_t>()].item<int64_t>();
    const bool same = at::equal(ei2.select(1, f), ei2.select(1, e)) && at::equal(sh2[f], sh2[e]);
    const bool reversed = ei2[0][f].item<int64_t>() == ei2[1][e].item<int64_t>() &&
                          ei2[1][f].item<int64_t>() == ei2[0][e].item<int64_t>() && at::equal(sh2[f], -sh2[e]);
    EXPECT_TRUE(same || reversed) << "edge " << e;
  }
}

// A small SchNet on the fast path and the same weights on the reference
// (autograd) path, in `dtype`.
std::pair<SchNet, SchNet> fast_and_reference_schnet(uint64_t seed, at::ScalarType dtype) {
  SchNetOptions o;
  o.hidden_channels = 16;
  o.num_filters = 12;
  o.num_interactions = 2;
  o.num_gaussians = 10;
  o.cutoff = 4.0;
  at::manual_seed(seed);
  SchNet fast(o);
  fast->to(dtype);
  SchNetOptions ro = o;
  ro.reference_autograd = true;
  SchNet ref(ro);
  ref->to(dtype);
  at::NoGradGuard no_grad;
  auto src = fast->named_parameters();
  for (auto& p : ref->named_parameters()) p.value().copy_(src[p.key()]);
  return {fast, ref};
}

TEST(FastPath, SchNetFastPathEqualsReferencePathToFloat64Precision) {
  auto [fast, ref] = fast_and_reference_schnet(3, at::kDouble);
  const double cutoff = fast->options().cutoff;
  Structure s = random_periodic(6, {22, 13}, 5);
  s.energy = -3.0;
  s.forces = at::randn({6, 3}, at::kDouble);
  s.stress = at::randn({3, 3}, at::kDouble) * 0.01;
  const Batch b = make_batch({s, random_periodic(4, {13, 13}, 9)}, cutoff);

  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
  loss.add(std::make_shared<ForcesMSELoss>(), 10.0);
  loss.add(std::make_shared<StressMSELoss>(), 5.0);
  ComputeOptions co;
  co.stress = true;
  co.training = true;
  std::vector<ModelOutputs> outs;
  for (SchNet* m : {&fast, &ref}) {
    (*m)->zero_grad();
    ModelOutputs out = compute_outputs(**m, b, co);
    loss(out, b).total.backward();
    outs.push_back(out);
  }
  EXPECT_LT((outs[0].energy - outs[1].energy).abs().max().item<double>(), 1e-10);
  EXPECT_LT((outs[0].forces - outs[1].forces).abs().max().item<double>(), 1e-10);
  EXPECT_LT((outs[0].stress - outs[1].stress).abs().max().item<double>(), 1e-10);
  auto rp = ref->named_parameters();
  int64_t compared = 0;
  for (const auto& p : fast->named_parameters()) {
    const at::Tensor& ga = p.value().grad();
    const at::Tensor& gb = rp[p.key()].grad();
    ASSERT_EQ(ga.defined(), gb.defined()) << p.key();
    if (!ga.defined()) continue;
    EXPECT_LT((ga - gb).abs().max().item<double>(), 1e-10) << p.key();
    EXPECT_GT(gb.abs().max().item<double>(), 0.0) << p.key();
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int64_t>(fast->parameters().size()));
}

TEST(FastPath, SchNetBf16FastPathWithPaddedPairsAgreesWithFloat32ToBf16Rounding) {
  // Under bf16 autocast the fast path pads the filter network's pair rows to
  // a GEMM bucket (gemm_rows.h), keeps the filter in bf16 and rounds each
  // shifted softplus once; the float32 reference path does none of that.
  // They agree to bf16's precision (2^-8 = 0.4%) up to accumulation.
  auto [fast, ref] = fast_and_reference_schnet(8, at::kFloat);
  const double cutoff = fast->options().cutoff;
  Structure s = random_periodic(6, {22, 13}, 5);
  s.energy = -3.0;
  s.forces = at::randn({6, 3}, at::kDouble);
  const Batch b = make_batch({s, random_periodic(5, {13, 13}, 9)}, cutoff).to(at::kCPU, at::kFloat);
  const int64_t P = reverse_edge_pairs(b.edge_index, b.shifts).second.size(0);
  ASSERT_GT(gemm_row_bucket(P), P) << "the batch must exercise the padding";
  WeightedSumLoss loss;
  loss.add(std::make_shared<EnergyMSELoss>(), 1.0);
  loss.add(std::make_shared<ForcesMSELoss>(), 10.0);
  ComputeOptions co;
  co.training = true;
  std::vector<ModelOutputs> outs;
  for (SchNet* m : {&fast, &ref}) {
    (*m)->zero_grad();
    std::optional<AutocastGuard> bf16;
    if (m == &fast) bf16.emplace(at::Device(at::kCPU), at::kBFloat16);
    ModelOutputs out = compute_outputs(**m, b, co);
    loss(out, b).total.backward();
    outs.push_back(out);
  }
  auto rel = [](const at::Tensor& a, const at::Tensor& r) {
    return ((a - r).norm() / r.norm()).item<double>();
  };
  // Measured: energy 0.5%, forces 1.6% (the bf16 reference path, which
  // rounds softplus and the − ln 2 separately: 2.4%, 1.9%).
  EXPECT_LT(rel(outs[0].energy, outs[1].energy), 1e-2);
  EXPECT_LT(rel(outs[0].forces, outs[1].forces), 3e-2);
  auto rp = ref->named_parameters();
  for (const auto& p : fast->named_parameters()) {
    if (!p.value().grad().defined()) continue;
    EXPECT_LT(rel(p.value().grad(), rp[p.key()].grad()), 5e-2) << p.key();
  }
}

}  // namespace
}  // namespace crucible

// Precision plugins: mode parsing with seed 000's aliases, dtypes of
// convert_module / convert_input / convert_output, the autocast region, and
// the 16-mixed scaler path (CPU LibTorch 1.13 has no fp16 autocast).

#include "crucible/common/error.h"
#include "crucible/precision/precision.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <limits>

namespace crucible {
namespace {

TEST(PrecisionMode, ParsesModesAndAliases) {
  const std::vector<std::pair<std::string, PrecisionMode>> cases = {
      {"64-true", PrecisionMode::k64True},   {"64", PrecisionMode::k64True},
      {"fp64", PrecisionMode::k64True},      {"float64", PrecisionMode::k64True},
      {"double", PrecisionMode::k64True},    {"32-true", PrecisionMode::k32True},
      {"32", PrecisionMode::k32True},        {"fp32", PrecisionMode::k32True},
      {"FLOAT32", PrecisionMode::k32True},   {"bf16-mixed", PrecisionMode::kBf16Mixed},
      {"bf16", PrecisionMode::kBf16Mixed},   {"bfloat16", PrecisionMode::kBf16Mixed},
      {"16-mixed", PrecisionMode::k16Mixed}, {"16", PrecisionMode::k16Mixed},
      {"fp16", PrecisionMode::k16Mixed},     {"float16", PrecisionMode::k16Mixed},
      {"half", PrecisionMode::k16Mixed},     {"bf16-true", PrecisionMode::kBf16True},
      {"16-true", PrecisionMode::k16True}};
  for (const auto& [text, mode] : cases) {
    EXPECT_EQ(parse_precision(text), mode) << text;
  }
  EXPECT_EQ(precision_name(parse_precision("bf16")), "bf16-mixed");
  try {
    parse_precision("fp8");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("precision must be one of 64-true, 32-true, bf16-mixed",
                                          0),
              0u);
    EXPECT_NE(std::string(e.what()).find("got 'fp8'"), std::string::npos);
  }
}

TEST(PrecisionPlugin, ModuleAndInputDtypesPerMode) {
  const std::vector<std::pair<std::string, at::ScalarType>> cases = {
      {"64-true", at::kDouble},   {"32-true", at::kFloat},     {"bf16-mixed", at::kFloat},
      {"16-mixed", at::kFloat},   {"bf16-true", at::kBFloat16}, {"16-true", at::kHalf}};
  Batch batch;
  batch.positions = at::zeros({2, 3}, at::kDouble);
  batch.edge_index = at::zeros({2, 1}, at::kLong);
  for (const auto& [mode, dtype] : cases) {
    auto plugin = make_precision_plugin(mode);
    torch::nn::Linear linear(3, 2);
    plugin->convert_module(*linear);
    EXPECT_EQ(linear->weight.scalar_type(), dtype) << mode;
    Batch converted = plugin->convert_input(batch, at::kCPU);
    // Geometry is never below float32 (force-safe precision).
    const at::ScalarType geom = mode == "64-true" ? at::kDouble : at::kFloat;
    EXPECT_EQ(converted.positions.scalar_type(), geom) << mode;
    EXPECT_EQ(converted.edge_index.scalar_type(), at::kLong) << mode;
  }
}

TEST(PrecisionPlugin, ConvertOutputIsAtLeastFloat32AndEnergiesFloat64) {
  auto plugin = make_precision_plugin("bf16-true");
  ModelOutputs out{at::ones({2}, at::kBFloat16), at::ones({3, 3}, at::kHalf), at::Tensor()};
  out.energies = at::ones({3}, at::kBFloat16);
  auto converted = plugin->convert_output(out);
  EXPECT_EQ(converted.energy.scalar_type(), at::kDouble);  // issue 48: energies in float64 in every mode
  EXPECT_EQ(converted.energies.scalar_type(), at::kDouble);
  EXPECT_EQ(converted.forces.scalar_type(), at::kFloat);
  EXPECT_FALSE(converted.stress.defined());
  ModelOutputs dbl{at::ones({2}, at::kDouble), at::Tensor(), at::Tensor()};
  EXPECT_EQ(plugin->convert_output(dbl).energy.scalar_type(), at::kDouble);
}

TEST(PrecisionPlugin, Bf16MixedAutocastsMatmulsOnlyInsideTheRegion) {
  auto plugin = make_precision_plugin("bf16-mixed");
  auto a = at::randn({4, 4}), b = at::randn({4, 4});
  {
    auto guard = plugin->forward_context(at::kCPU);
    ASSERT_TRUE(guard->active());
    EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kBFloat16);
    EXPECT_EQ((a + b).scalar_type(), at::kFloat);  // not an autocast op
  }
  EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
  auto plain = make_precision_plugin("32-true");
  auto guard = plain->forward_context(at::kCPU);
  EXPECT_FALSE(guard->active());
  EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
}

TEST(PrecisionPlugin, SixteenMixedScalesLossAndSkipsNonFiniteSteps) {
  auto plugin = make_precision_plugin("16-mixed", GradScalerOptions{});
  {
    auto guard = plugin->forward_context(at::kCPU);
    // LibTorch 1.13 has no CPU fp16 autocast: the forward stays float32.
    EXPECT_EQ(guard->active(), autocast_supported(at::kCPU, at::kHalf));
  }
  auto w = at::ones({3}, at::kFloat).requires_grad_(true);
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.1));
  auto loss = (w * 2.0).sum();
  auto scaled = plugin->pre_backward(loss);
  EXPECT_FLOAT_EQ(scaled.item<float>(), 6.0f * 65536.0f);
  plugin->backward(scaled, {});
  EXPECT_TRUE(plugin->optimizer_step(opt));
  EXPECT_TRUE(at::allclose(w.detach(), at::full({3}, 0.8f)));  // unscaled grad 2, lr 0.1
  EXPECT_DOUBLE_EQ(plugin->state_dict().at("scale"), 65536.0);

  opt.zero_grad();
  auto bad = plugin->pre_backward((w * std::numeric_limits<float>::infinity()).sum());
  plugin->backward(bad, {});
  const auto before = w.detach().clone();
  EXPECT_FALSE(plugin->optimizer_step(opt));
  EXPECT_TRUE(at::equal(w.detach(), before));
  EXPECT_DOUBLE_EQ(plugin->state_dict().at("scale"), 32768.0);
}

TEST(PrecisionPlugin, ScalerStateRestoredBeforeTheScalerIsBuilt) {
  auto first = make_precision_plugin("16-mixed");
  auto w = at::ones({2}, at::kFloat).requires_grad_(true);
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.1));
  first->backward(first->pre_backward((w * std::numeric_limits<float>::quiet_NaN()).sum()), {});
  first->optimizer_step(opt);
  const auto state = first->state_dict();
  EXPECT_DOUBLE_EQ(state.at("scale"), 32768.0);
  auto second = make_precision_plugin("16-mixed");
  second->load_state_dict(state);
  EXPECT_EQ(second->state_dict(), state);
  auto scaled = second->pre_backward(at::ones({}, at::kFloat));
  EXPECT_FLOAT_EQ(scaled.item<float>(), 32768.0f);
  EXPECT_THROW(second->load_state_dict({}), std::invalid_argument);
  EXPECT_TRUE(make_precision_plugin("32-true")->state_dict().empty());
}

TEST(PrecisionPlugin, InitContextsSetTheDefaultDtype) {
  auto plugin = make_precision_plugin("64-true");
  {
    auto guard = plugin->module_init_context();
    EXPECT_EQ(at::empty({1}).scalar_type(), at::kDouble);
  }
  EXPECT_EQ(at::empty({1}).scalar_type(), at::kFloat);
}

TEST(PrecisionPlugin, BackwardFillsOnlyTheListedParameters) {
  // A force-like graph: the loss depends on a "positions" leaf and a weight;
  // backward into {w} leaves the positions without a gradient.
  auto positions = at::full({3}, 2.0f).requires_grad_(true);
  auto w = at::full({3}, 3.0f).requires_grad_(true);
  auto plugin = make_precision_plugin("32-true");
  plugin->backward((w * positions * positions).sum(), {w});
  ASSERT_TRUE(w.grad().defined());
  EXPECT_TRUE(at::allclose(w.grad(), at::full({3}, 4.0f)));  // d/dw of w x^2 at x = 2
  EXPECT_FALSE(positions.grad().defined());
  // Empty list: every leaf, as loss.backward().
  w.mutable_grad() = at::Tensor();
  plugin->backward((w * positions * positions).sum(), {});
  EXPECT_TRUE(at::allclose(w.grad(), at::full({3}, 4.0f)));
  ASSERT_TRUE(positions.grad().defined());
  EXPECT_TRUE(at::allclose(positions.grad(), at::full({3}, 12.0f)));  // 2 w x
  // A listed tensor that does not require grad is an error.
  EXPECT_THROW(plugin->backward((w * 2.0f).sum(), {w, at::ones({3})}), c10::Error);
}

}  // namespace
}  // namespace crucible

// The CUDA path (ground rule: the same code builds and runs on a CUDA
// LibTorch 2.x). On a machine with a CUDA device these tests compare, for
// SchNet and MACE, energy, forces and stress computed on the GPU with those
// computed on the CPU (float64, training and inference paths), check that
// bf16 / fp16 autocast on the GPU changes the model's arithmetic but keeps
// forces close to float32, and that GradScaler's fused CUDA ops
// (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_) give the
// plain-op CPU path's gradients, scale and found-inf. Without a CUDA device
// they are skipped (GTEST_SKIP says so), as on CI's CPU machines.

#include "crucible/models/energy_model.h"
#include "crucible/models/mace/mace.h"
#include "crucible/models/schnet.h"
#include "crucible/precision/grad_scaler.h"
#include "crucible/precision/precision.h"
#include "models/small_models.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <limits>
#include <vector>

namespace crucible {
namespace {

using testing::biased_schnet;
using testing::max_abs_diff;
using testing::mixed_batch;
using testing::multi_element_mace;

#define SKIP_WITHOUT_CUDA() \
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device in this LibTorch build or machine"

/// GPU against CPU in float64 for the training and the inference path: the
/// sums run in another order on the GPU (atomic index_add), so 1e-9, not 0.
void expect_gpu_equals_cpu(EnergyModel& model) {
  const Batch cpu = mixed_batch(3.5);
  const at::Device cuda(at::kCUDA, 0);
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training path" : "inference path");
    ComputeOptions options;
    options.stress = true;
    options.training = training;
    model.module().to(at::kCPU);
    const ModelOutputs a = compute_outputs(model, cpu, options);
    model.module().to(cuda);
    const ModelOutputs b = compute_outputs(model, cpu.to(cuda, at::kDouble), options);
    ASSERT_TRUE(b.forces.is_cuda());
    ASSERT_GT(a.forces.abs().max().item<double>(), 1e-3);
    ASSERT_GT(a.stress.abs().max().item<double>(), 1e-5);
    EXPECT_LT(max_abs_diff(a.energy, b.energy), 1e-9);
    EXPECT_LT(max_abs_diff(a.forces, b.forces), 1e-9);
    EXPECT_LT(max_abs_diff(a.stress, b.stress), 1e-9);
    EXPECT_EQ(b.forces.dtype(), at::kDouble);
  }
  model.module().to(at::kCPU);
}

TEST(CudaPath, SchNetOnTheGpuEqualsTheCpuInFloat64) {
  SKIP_WITHOUT_CUDA();
  expect_gpu_equals_cpu(*biased_schnet());
}

TEST(CudaPath, MaceOnTheGpuEqualsTheCpuInFloat64) {
  SKIP_WITHOUT_CUDA();
  expect_gpu_equals_cpu(*multi_element_mace());
}

/// Autocast to `dtype` on the GPU: forces stay float32 and within a few
/// percent of float32's, and differ from them (the region did cast).
void expect_autocast_close(EnergyModel& model, at::ScalarType dtype, double rel_tol) {
  const at::Device cuda(at::kCUDA, 0);
  model.module().to(cuda);
  model.module().to(at::kFloat);
  const Batch batch = mixed_batch(3.5).to(cuda, at::kFloat);
  ComputeOptions options;
  options.training = true;
  const ModelOutputs ref = compute_outputs(model, batch, options);
  ModelOutputs mixed;
  {
    AutocastGuard autocast(cuda, dtype);
    mixed = compute_outputs(model, batch, options);
  }
  EXPECT_EQ(mixed.forces.dtype(), at::kFloat);
  EXPECT_EQ(mixed.energy.dtype(), at::kDouble);  // energies are summed in float64 (issue 48)
  const double scale = ref.forces.abs().max().item<double>();
  ASSERT_GT(scale, 1e-3);
  const double err = max_abs_diff(mixed.forces, ref.forces) / scale;
  EXPECT_LT(err, rel_tol);
  EXPECT_GT(err, 1e-6) << "autocast changed nothing: the region did not cast";
  model.module().to(at::kCPU);
  model.module().to(at::kDouble);
}

TEST(CudaPath, Bf16AndFp16AutocastKeepForcesClose) {
  SKIP_WITHOUT_CUDA();
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    expect_autocast_close(*biased_schnet(), dtype, dtype == at::kHalf ? 0.01 : 0.05);
    expect_autocast_close(*multi_element_mace(), dtype, dtype == at::kHalf ? 0.01 : 0.05);
  }
}

/// One unscale/step/update round on `device`; returns the gradients after
/// unscale (parameters are not stepped when a gradient is inf).
struct ScalerRound {
  std::vector<at::Tensor> grads;
  double scale = 0;
  bool found_inf = false;
  int64_t tracker = 0;
};

ScalerRound scaler_round(at::Device device, bool with_inf) {
  GradScalerOptions o;
  o.init_scale = 1024.0;
  o.growth_interval = 1;
  GradScaler scaler(o);
  std::vector<at::Tensor> params;
  for (int64_t n : {5, 7}) params.push_back(at::arange(n, at::TensorOptions(at::kFloat)).to(device).requires_grad_());
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));
  const at::Tensor loss = (params[0] * params[0]).sum() + (3.0 * params[1]).sum();
  scaler.scale(loss).backward();
  if (with_inf) {
    at::NoGradGuard no_grad;
    params[1].mutable_grad()[2] = std::numeric_limits<float>::infinity();
  }
  scaler.unscale(sgd);
  ScalerRound r;
  for (auto& p : params) r.grads.push_back(p.grad().cpu().clone());
  scaler.step(sgd);
  r.found_inf = scaler.found_inf(sgd).value();
  scaler.update();
  r.scale = scaler.get_scale();
  r.tracker = scaler.get_growth_tracker();
  return r;
}

TEST(CudaPath, GradScalerFusedOpsEqualTheCpuPath) {
  SKIP_WITHOUT_CUDA();
  for (bool with_inf : {false, true}) {
    SCOPED_TRACE(with_inf ? "inf gradient" : "finite gradients");
    const ScalerRound cpu = scaler_round(at::Device(at::kCPU), with_inf);
    const ScalerRound gpu = scaler_round(at::Device(at::kCUDA, 0), with_inf);
    EXPECT_EQ(gpu.found_inf, with_inf);
    EXPECT_EQ(cpu.found_inf, with_inf);
    EXPECT_DOUBLE_EQ(gpu.scale, cpu.scale);
    EXPECT_DOUBLE_EQ(gpu.scale, with_inf ? 512.0 : 2048.0);
    EXPECT_EQ(gpu.tracker, cpu.tracker);
    // d/dp0 of sum(p0^2) = 2 p0, unscaled exactly (1024 is a power of two).
    EXPECT_TRUE(at::equal(gpu.grads[0], 2.0 * at::arange(5, at::kFloat)));
    for (size_t i = 0; i < cpu.grads.size(); ++i)
      EXPECT_TRUE(at::allclose(gpu.grads[i], cpu.grads[i], 0, 0, /*equal_nan=*/true)) << "param " << i;
  }
}

}  // namespace
}  // namespace crucible

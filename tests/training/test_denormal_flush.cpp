// Denormals flush to zero in every stage of a training step and inside
// compute_outputs, and the caller's setting is back after them
// (common/denormals.h; on Intel CPUs a denormal costs ~100 cycles).

#include "crucible/common/denormals.h"
#include "crucible/training/strategy.h"
#include "crucible/training/thread_choice.h"
#include "toy_model.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <set>

namespace crucible {
namespace {

using testing::energy_forces_loss;
using testing::ToyModel;
using testing::ToyModelImpl;
using testing::toy_dataset;

/// The toy model, recording whether its energy ran with denormals flushed,
/// and whether each backward through that energy did.
struct ProbeModel : ToyModelImpl {
  int calls = 0, flushed_calls = 0, backward_calls = 0, flushed_backward_calls = 0;
  at::Tensor energy(const Batch& batch) override {
    ++calls;
    if (denormals_flushed_on_this_thread()) ++flushed_calls;
    at::Tensor e = ToyModelImpl::energy(batch);
    e.register_hook([this](const at::Tensor& grad) {
      ++backward_calls;
      if (denormals_flushed_on_this_thread()) ++flushed_backward_calls;
      return grad;
    });
    return e;
  }
};

class DenormalFlush : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!denormal_flush_supported()) GTEST_SKIP() << "no MXCSR on this architecture";
    unsetenv("CRUCIBLE_KEEP_DENORMALS");
    ASSERT_FALSE(denormals_flushed_on_this_thread());
  }
};

TEST_F(DenormalFlush, EveryStageOfRunAndTrainBatch) {
  auto ds = toy_dataset(4);
  DataLoader loader(ds, {2, true, 0, false});
  StrategyOptions o;
  o.num_steps = 2;
  o.optimizer.lr = 0.01;
  std::map<TrainingStage, int> flushed, seen;
  const std::set<TrainingStage> stages{TrainingStage::SETUP, TrainingStage::BEFORE_FORWARD,
                                       TrainingStage::AFTER_BACKWARD, TrainingStage::AFTER_OPTIMIZER_STEP,
                                       TrainingStage::AFTER_TRAINING};
  TrainingStrategy s(ToyModel().ptr(), o, energy_forces_loss(),
                     {std::make_shared<LambdaHook>("probe", stages, [&](TrainContext&, TrainingStage stage) {
                       ++seen[stage];
                       if (denormals_flushed_on_this_thread()) ++flushed[stage];
                     })});
  s.run(loader);
  EXPECT_FALSE(denormals_flushed_on_this_thread());
  EXPECT_EQ(seen[TrainingStage::BEFORE_FORWARD], 2);
  EXPECT_EQ(seen[TrainingStage::AFTER_OPTIMIZER_STEP], 2);
  EXPECT_EQ(flushed, seen);

  s.train_batch(ds->collate({0, 1}));
  EXPECT_FALSE(denormals_flushed_on_this_thread());
  EXPECT_EQ(seen[TrainingStage::BEFORE_FORWARD], 3);
  EXPECT_EQ(flushed, seen);
}

TEST_F(DenormalFlush, ComputeOutputsFlushesInsideAndRestores) {
  auto model = std::make_shared<ProbeModel>();
  const Batch batch = toy_dataset(2)->collate({0, 1});
  ComputeOptions co;
  co.forces = true;
  const ModelOutputs out = compute_outputs(*model, batch, co);
  EXPECT_EQ(model->calls, 1);
  EXPECT_EQ(model->flushed_calls, 1);
  EXPECT_FALSE(denormals_flushed_on_this_thread());
  EXPECT_EQ(out.forces.size(0), batch.positions.size(0));

  setenv("CRUCIBLE_KEEP_DENORMALS", "1", 1);
  compute_outputs(*model, batch, co);
  unsetenv("CRUCIBLE_KEEP_DENORMALS");
  EXPECT_EQ(model->calls, 2);
  EXPECT_EQ(model->flushed_calls, 1);
}

// training.num_threads 0 times this pass to pick the thread count; its loss
// backward ran outside compute_outputs' guard, so on an Intel Xeon the pass
// paid for denormals that the training step does not (SchNet default model:
// pass 19.5 ms, whole training step 13 ms).
TEST_F(DenormalFlush, ThreadChoicePassFlushesItsBackward) {
  auto model = std::make_shared<ProbeModel>();
  const Batch batch = toy_dataset(2)->collate({0, 1});
  const auto pass = training_pass(*model, batch);
  pass();
  EXPECT_EQ(model->calls, 1);
  EXPECT_EQ(model->flushed_calls, 1);
  // Once for the forces inside compute_outputs, once for the loss backward.
  EXPECT_EQ(model->backward_calls, 2);
  EXPECT_EQ(model->flushed_backward_calls, 2);
  EXPECT_FALSE(denormals_flushed_on_this_thread());
}

}  // namespace
}  // namespace crucible

// Issue 47: the parts of the training memory estimate. The estimate against
// measured peaks is tests/training/test_memory_peak.py.

#include "crucible/training/memory_estimate.h"
#include "crucible/common/error.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace crucible {
namespace {

TEST(MemoryEstimate, StateCopiesCountWeightsGradientsMomentsBestCheckpointAndTransients) {
  // weights + gradients + 2 moments + best copy = 5 live; checkpoint archives of weights,
  // gradients and moments = 4; transients 3.5.
  EXPECT_DOUBLE_EQ(training_state_copies("adam", false, 0, false, false), 12.5);
  EXPECT_DOUBLE_EQ(training_state_copies("adamw", true, 0, false, false), 14.5);  // max_exp_avg_sq, twice
  EXPECT_DOUBLE_EQ(training_state_copies("adam", false, 0, false, true), 14.5);   // EMA copy, twice
  EXPECT_DOUBLE_EQ(training_state_copies("sgd", false, 0, false, false), 8.5);
  EXPECT_DOUBLE_EQ(training_state_copies("sgd", false, 0.9, false, false), 10.5);
  EXPECT_DOUBLE_EQ(training_state_copies("rmsprop", false, 0.9, true, false), 14.5);
  EXPECT_DOUBLE_EQ(training_state_copies("adagrad", false, 0, false, false), 10.5);
  EXPECT_THROW(training_state_copies("lbfgs", false, 0, false, false), std::invalid_argument);
}

TEST(MemoryEstimate, LargestBatchIsTheMaximumOverBatchesOfEdgeAndAtomTerms) {
  ActivationEstimate a;
  a.per_edge = 10;
  a.per_atom = 100;
  const std::vector<int64_t> edges{5, 40, 1, 7}, atoms{2, 3, 30, 1};
  // batch {0,1}: 10*45 + 100*5 = 950; batch {2,3}: 10*8 + 100*31 = 3180 (the atoms decide).
  EXPECT_DOUBLE_EQ(largest_batch_activations(a, 1.0, 8.0, edges, atoms, {{0, 1}, {2, 3}}), 8.0 * 3180);
  EXPECT_DOUBLE_EQ(largest_batch_activations(a, 0.1, 4.0, edges, atoms, {{0, 1}}), 0.1 * 4.0 * 950);
  EXPECT_DOUBLE_EQ(largest_batch_activations(a, 1.0, 8.0, edges, atoms, {}), 0.0);
  EXPECT_THROW(largest_batch_activations(a, 1.0, 8.0, edges, atoms, {{4}}), std::out_of_range);
}

TEST(MemoryEstimate, StructuresCostAFrameHeaderAndTheirAtoms) {
  EXPECT_DOUBLE_EQ(structures_bytes(0, 0), 0.0);
  EXPECT_DOUBLE_EQ(structures_bytes(40000, 120000), 40000 * 4096.0 + 120000 * 56.0);
  EXPECT_GT(resident_memory_bytes(), 1 << 20);  // this test binary holds LibTorch
}

TEST(MemoryEstimate, RefusalNamesTheBreakdownAndTheSettingOfTheLargestPart) {
  MemoryEstimate e;
  e.process = 0.2e9;
  e.structures = 0.1e9;
  e.neighbor_lists = 0.3e9;
  e.state_copies = 12.5;
  e.training_state = 1.0e9;
  e.activations = 5.0e9;
  EXPECT_DOUBLE_EQ(e.total(), 6.6e9);
  EXPECT_EQ(e.describe(int64_t{8} * 1000 * 1000 * 1000),
            "about 6.60 GB at peak (process 0.20, structures 0.10, neighbor lists 0.30, weights/gradients/optimizer "
            "1.00 (12.5 copies), activations 5.00 for the largest batch) of 8.20 GB");
  // The process is already resident: only what comes on top must fit.
  EXPECT_NO_THROW(check_training_memory(e, int64_t{6400} * 1000 * 1000, "schnet"));
  try {
    check_training_memory(e, int64_t{6399} * 1000 * 1000, "schnet");
    ADD_FAILURE() << "6.4 GB on top of the process must not fit in 6.399 GB";
  } catch (const ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("lower training.batch_size"), std::string::npos) << err.what();
  }
  e.activations = 0;
  e.training_state = 9e9;
  try {
    check_training_memory(e, int64_t{1} * 1000 * 1000 * 1000, "mace");
    ADD_FAILURE() << "must refuse";
  } catch (const ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("choose smaller model.mace values"), std::string::npos) << err.what();
  }
  e.training_state = 0;
  e.neighbor_lists = 9e9;
  e.not_counted = "the weights, optimizer and activations on cuda:0";
  try {
    check_training_memory(e, int64_t{1} * 1000 * 1000 * 1000, "mace");
    ADD_FAILURE() << "must refuse";
  } catch (const ConfigError& err) {
    const std::string what = err.what();
    EXPECT_NE(what.find("lower model.cutoff"), std::string::npos) << what;
    EXPECT_NE(what.find("; not counted: the weights, optimizer and activations on cuda:0)"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace crucible

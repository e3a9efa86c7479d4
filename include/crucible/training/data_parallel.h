#pragma once
// Gradient averaging across data-parallel workers (issue 6), as a training
// update hook (seed 001) so it composes with accumulation, mixed precision,
// clipping and spike skipping.

#include "crucible/distributed/communicator.h"
#include "crucible/training/update_hook.h"

#include <cstdint>
#include <memory>
#include <string>

namespace crucible {

namespace update_priority {
/// After accumulation (whose veto on non-stepping batches it respects),
/// before mixed precision unscales, clipping clips and spike skipping judges:
/// all of them then see the averaged gradients and the averaged loss.
inline constexpr int kDataParallel = 15;
}  // namespace update_priority

/// Options of DataParallelHook.
struct DataParallelOptions {
  /// Gradients are flattened into buckets of at most this many MiB, one
  /// all-reduce each (PyTorch DDP bucket_cap_mb). > 0. Default 25.
  double bucket_cap_mb = 25.0;
};

/// PyTorch DistributedDataParallel's meaning over a Communicator:
/// - SETUP: every model's parameters and buffers are broadcast from rank 0
///   (in module order), so all workers start identical.
/// - DO_OPTIMIZER_STEP (not vetoed, i.e. a batch that steps): the gradients
///   of every optimizer's parameters (each once, in optimizer/group order;
///   an undefined gradient counts as zeros) are summed over the workers and
///   divided by the world size, in buckets; float64 gradients reduce in
///   float64, every other dtype in float32 (Gloo cannot reduce bfloat16) and
///   is copied back in its own dtype. The batch loss (`ctx.loss`) rides in
///   the first bucket (with the stop flag: TrainingStrategy::agree_stop)
///   and is replaced by its mean over the workers, so
///   spike skipping decides identically everywhere; an inf/NaN gradient on
///   one worker makes the sum non-finite on all, so a gradient scaler or the
///   spike hook skips the same steps on every worker.
/// - Batches vetoed by gradient accumulation communicate nothing.
/// Buckets are reduced after backward, one after the other: LibTorch 1.13's
/// C++ API has no post-accumulate-grad hook to overlap them with backward
/// (documented limitation). Requires identical parameter shapes on all
/// workers (else the collective fails).
class DataParallelHook : public TrainingUpdateHook {
 public:
  /// @throws std::invalid_argument for a null communicator or bucket_cap_mb <= 0.
  DataParallelHook(std::shared_ptr<Communicator> communicator, DataParallelOptions options = {});
  std::string name() const override { return "DataParallelHook"; }
  int priority() const override { return update_priority::kDataParallel; }
  std::optional<std::string> exclusive_update_key() const override { return name(); }
  using TrainingUpdateHook::operator();
  /// @throws DistributedError when a collective fails.
  UpdateDecision operator()(TrainContext& ctx, TrainingStage stage, bool will_skip) override;

  /// Gradient all-reduces issued so far (one per bucket).
  int64_t num_allreduces() const { return num_allreduces_; }
  /// Steps whose gradients were averaged.
  int64_t num_reduced_steps() const { return num_reduced_steps_; }
  /// Wall time spent inside gradient all-reduces (including waiting for
  /// slower workers), s.
  double communication_seconds() const { return communication_seconds_; }
  const Communicator& communicator() const { return *communicator_; }

 private:
  void broadcast_models(TrainContext& ctx);
  void average_gradients(TrainContext& ctx);
  std::shared_ptr<Communicator> communicator_;
  DataParallelOptions options_;
  int64_t num_allreduces_ = 0;
  int64_t num_reduced_steps_ = 0;
  double communication_seconds_ = 0;
};

}  // namespace crucible

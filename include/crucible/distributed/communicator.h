#pragma once
// The collectives data-parallel training needs (issue 6), as an interface
// the training library uses without linking c10d. The implementation over
// PyTorch's c10d process groups (Gloo on CPU, NCCL on CUDA) is in
// crucible/distributed/process_group.h.

#include <ATen/ATen.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace crucible {

/// A collective failed: a worker died, hung past the timeout, or the
/// connection broke. The message names this rank and, when known, the
/// rank(s) that stopped answering.
class DistributedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Collectives over the workers of one data-parallel run. Every worker must
/// call the same collectives in the same order with tensors of the same
/// shape and dtype (as with torch.distributed).
class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This worker's global rank, in [0, size()).
  virtual int rank() const = 0;
  /// Number of workers (world size), >= 1.
  virtual int size() const = 0;
  /// In-place element-wise sum over all workers of a dense, contiguous
  /// tensor (float32, float64 or int64; Gloo cannot reduce bfloat16, so
  /// callers reduce in float32). Blocks until done.
  /// @throws DistributedError when a worker died or the timeout passed.
  virtual void allreduce_sum(at::Tensor& tensor) = 0;
  /// In-place copy of `root`'s tensor to every worker (same shape/dtype).
  /// @throws DistributedError as allreduce_sum.
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  /// Waits until every worker has called it. @throws DistributedError.
  virtual void barrier() = 0;
};

}  // namespace crucible

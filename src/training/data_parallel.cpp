// DataParallelHook: broadcast at SETUP, bucketed gradient averaging (issue 6).

#include "crucible/training/data_parallel.h"

#include "crucible/models/energy_model.h"

#include <torch/optim/optimizer.h>

#include "crucible/training/strategy.h"

#include <chrono>
#include <set>
#include <stdexcept>
#include <vector>

namespace crucible {

DataParallelHook::DataParallelHook(std::shared_ptr<Communicator> communicator,
                                   DataParallelOptions options)
    : communicator_(std::move(communicator)), options_(options) {
  if (!communicator_) throw std::invalid_argument("DataParallelHook needs a communicator, got null");
  if (!(options_.bucket_cap_mb > 0)) {
    throw std::invalid_argument("DataParallelHook: bucket_cap_mb must be > 0");
  }
}

UpdateDecision DataParallelHook::operator()(TrainContext& ctx, TrainingStage stage,
                                            bool will_skip) {
  if (stage == TrainingStage::SETUP) {
    broadcast_models(ctx);
  } else if (stage == TrainingStage::DO_OPTIMIZER_STEP && !will_skip) {
    average_gradients(ctx);
  }
  return {true, ctx.loss};
}

void DataParallelHook::broadcast_models(TrainContext& ctx) {
  if (communicator_->size() == 1) return;
  at::NoGradGuard no_grad;
  for (auto& [name, model] : ctx.models) {
    (void)name;
    auto& m = model->module();
    std::vector<at::Tensor> tensors;
    for (const auto& p : m.parameters(true)) tensors.push_back(p);
    for (const auto& b : m.buffers(true)) tensors.push_back(b);
    for (auto& t : tensors) {
      if (!t.defined() || t.numel() == 0) continue;
      // Gloo: one dense tensor per collective; bf16 travels as float32.
      const bool low = t.scalar_type() != at::kDouble && t.scalar_type() != at::kFloat &&
                       t.scalar_type() != at::kLong;
      at::Tensor buf = low ? t.to(at::kFloat).contiguous() : t.contiguous().clone();
      communicator_->broadcast(buf, 0);
      t.copy_(buf.to(t.scalar_type()));
    }
  }
}

void DataParallelHook::average_gradients(TrainContext& ctx) {
  const int world = communicator_->size();
  if (world == 1) return;
  // Parameters in a fixed order, each once.
  std::vector<at::Tensor> params = optimizer_parameters(ctx);
  const int64_t cap_bytes = std::max<int64_t>(
      1, static_cast<int64_t>(options_.bucket_cap_mb * 1024.0 * 1024.0));
  auto reduce_dtype = [](const at::Tensor& p) {
    return p.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  };
  at::NoGradGuard no_grad;
  bool loss_sent = false;
  size_t i = 0;
  while (i < params.size()) {
    // One bucket: consecutive parameters of one reduce dtype up to the cap.
    const at::ScalarType dt = reduce_dtype(params[i]);
    const int64_t elem = dt == at::kDouble ? 8 : 4;
    size_t j = i;
    int64_t numel = 0;
    while (j < params.size() && reduce_dtype(params[j]) == dt &&
           (j == i || (numel + params[j].numel()) * elem <= cap_bytes)) {
      numel += params[j].numel();
      ++j;
    }
    // The first bucket also carries the loss and the stop flag.
    const bool first = !loss_sent;
    const bool carry_loss = first && ctx.loss.defined();
    const int64_t extra = first ? 2 : 0;
    at::Tensor flat = at::zeros({numel + extra},
                                at::TensorOptions().dtype(dt).device(params[i].device()));
    int64_t offset = 0;
    for (size_t k = i; k < j; ++k) {
      const auto& g = params[k].grad();
      const int64_t n = params[k].numel();
      if (g.defined()) flat.narrow(0, offset, n).copy_(g.detach().reshape({-1}));
      offset += n;
    }
    if (carry_loss) flat.narrow(0, numel, 1).copy_(ctx.loss.detach().reshape({1}).to(dt));
    if (first && ctx.strategy && ctx.strategy->stop_requested()) flat[numel + 1].fill_(1.0);
    const auto t0 = std::chrono::steady_clock::now();
    communicator_->allreduce_sum(flat);
    communication_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++num_allreduces_;
    if (first && ctx.strategy) ctx.strategy->agree_stop(flat[numel + 1].item<double>() > 0.5);
    flat.div_(static_cast<double>(world));
    offset = 0;
    for (size_t k = i; k < j; ++k) {
      at::Tensor& p = params[k];
      const int64_t n = p.numel();
      at::Tensor avg = flat.narrow(0, offset, n).view(p.sizes()).to(p.scalar_type());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(avg);
      } else {
        p.mutable_grad() = avg.clone();
      }
      offset += n;
    }
    if (carry_loss) ctx.loss = flat.narrow(0, numel, 1).reshape({}).to(ctx.loss.scalar_type());
    loss_sent = true;
    i = j;
  }
  // (No parameters: nothing reduced; the strategy agrees on stops itself.)
  ++num_reduced_steps_;
}

}  // namespace crucible

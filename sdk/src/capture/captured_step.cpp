// train::CapturedStep: warm-up steps run eagerly, then one capture on a side
// stream (what torch.cuda.graph does), then replays with the batch copied into
// the graph's static inputs. Everything CUDA is compiled only against a
// LibTorch built with CUDA and NCCL (USE_C10D_NCCL, which its CMake package
// defines); elsewhere every step runs eagerly and says why.

#include <train/capture.h>

#include <c10/core/Event.h>
#include <torch/version.h>

#include <exception>
#include <iostream>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/capturing.h"
#include "core/collectives.h"
#include "ddp/reducer.h"

#ifdef USE_C10D_NCCL
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace train {

#ifdef USE_C10D_NCCL
namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string shape_of(const torch::Tensor& t) { return c10::str(t.sizes()); }

std::string what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 15
// A graph whose capture failed, before LibTorch 2.15: never destroyed, since
// the allocators may still hold a filter that reads it.
void keep_for_good(std::unique_ptr<at::cuda::CUDAGraph> graph) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::unique_ptr<at::cuda::CUDAGraph>>();  // never freed
  const std::lock_guard<std::mutex> lock(mutex);
  kept->push_back(std::move(graph));
}

// Before LibTorch 2.15, capture_end may throw on a failed capture before it
// ends what capture_begin began (2.15 ends it first):
// - the caching allocator's routing to the capture's pool, which left on
//   holds back every block freed with another stream's uses (each batch's
//   copy) and processes no event again: ended here, and the pool released;
// - the pinned-memory allocator's routing, where the line has one, whose
//   filter reads the graph: the graph is kept for good;
// - the CUDA generator's capture mode, in which every eager random op throws
//   ("Offset increment outside graph capture"): a capture that succeeds, of
//   one small kernel, ends it.
void end_failed_capture(std::unique_ptr<at::cuda::CUDAGraph> failed, bool begun,
                        c10::DeviceIndex device, at::cuda::MempoolId_t pool,
                        const c10::cuda::CUDAStream& side) {
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
  } catch (const std::exception&) {
    // capture_end ended the routing before it threw (some 2.x builds do)
  }
  if (begun) {
    try {
      // The graph is never reset, so nothing else releases its pool.
      c10::cuda::CUDACachingAllocator::releasePool(device, pool);
    } catch (const std::exception&) {
    }
  }
  keep_for_good(std::move(failed));
  try {
    const c10::cuda::CUDAStreamGuard guard(side);
    auto scratch = torch::zeros({1}, torch::TensorOptions().device(torch::kCUDA, device));
    auto ending = std::make_unique<at::cuda::CUDAGraph>();
    try {
      ending->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      scratch.fill_(1);
      ending->capture_end();
    } catch (const std::exception&) {
      keep_for_good(std::move(ending));
    }
  } catch (const std::exception&) {
    // the eager step says what is wrong, if anything is
  }
}
#endif

}  // namespace
#endif

struct CapturedStep::Impl {
  Step step;
  CaptureOptions options;
  bool decided = false;
  std::string reason;  // why every step runs eagerly; "" while capture is possible
  int eager_steps = 0;
  std::vector<int64_t> warmed_data, warmed_target;  // the shapes the warm-up steps ran
  bool told_other_shape = false;                    // said once per capture
  bool capturing = false;                           // the step function runs under capture
  std::set<std::string> told;                       // the lines already said
  torch::Tensor static_data, static_target, static_loss;
#ifdef USE_C10D_NCCL
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::unique_ptr<at::cuda::CUDAGraph> failed;  // a capture that threw
#endif

  void tell(const std::string& line) {
    if (told.insert(line).second) std::cerr << "train::CapturedStep: " << line << std::endl;
  }

  // Whether this run can capture at all, from the first batch's device.
  void decide(const torch::Tensor& data) {
    decided = true;
    reason = why_eager(data);
    if (!reason.empty() && options.enabled()) tell("steps run eagerly: " + reason);
  }

  std::string why_eager(const torch::Tensor& data) const {
    if (!options.enabled()) return "capture is off (CaptureOptions::enabled)";
    if (!data.is_cuda()) {
      return "the batch is on " + data.device().str() + ": a CUDA graph captures GPU work";
    }
#ifndef USE_C10D_NCCL
    return "this LibTorch was built without CUDA graphs";
#else
    auto group = detail::run_group_or_null();
    if (!group || group->getSize() == 1) return "";
    std::string backend;
    try {
      backend = group->getBackendName();
    } catch (const c10::Error&) {
    }
    if (backend == "nccl") return "";
    return "the process group is " + (backend.empty() ? std::string("not NCCL") : backend) +
           " across " + std::to_string(group->getSize()) +
           " ranks: a captured step needs NCCL or one worker";
#endif
  }

  torch::Tensor capture(const torch::Tensor& data, const torch::Tensor& target);

  // A step run eagerly. Its loss is returned detached: a loss the caller
  // kept would keep the step's autograd graph, whose nodes (made on the
  // loop's stream) a later capture would then meet.
  torch::Tensor eager(const torch::Tensor& data, const torch::Tensor& target) {
    auto loss = step(data, target);
    return loss.defined() ? loss.detach() : loss;
  }
};

#ifdef USE_C10D_NCCL
torch::Tensor CapturedStep::Impl::capture(const torch::Tensor& data, const torch::Tensor& target) {
  static_data = data.clone();
  static_target = target.clone();
  auto fresh = std::make_unique<at::cuda::CUDAGraph>();
  const auto device = data.device();
  auto current = c10::cuda::getCurrentCUDAStream(device.index());
  auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  // The side stream starts after what is queued, and the loop's stream after
  // the capture, as torch.cuda.graph orders them.
  c10::Event queued(c10::DeviceType::CUDA);
  queued.record(current);
  queued.block(side);
  torch::Tensor loss;
#if TORCH_VERSION_MAJOR >= 2
  // The capture's memory pool, named here so that a failed capture's routing
  // to it can be ended (end_failed_capture).
  const auto pool = at::cuda::graph_pool_handle();
#endif
  [[maybe_unused]] bool begun = false;  // capture_begin returned (read before 2.15)
  bool ended = false;  // capture_end returned: the graph is whole, what it began ended
  try {
    c10::cuda::CUDAStreamGuard guard(side);
    // The reducers' gradient accumulators, made by prepare_model on the
    // loop's stream, made again on this one (their streams would fail the
    // capture; as DDP is made on a side stream for torch.cuda.graph).
    detail::renew_prepared_accumulators();
    // Thread-local: the loader's threads may allocate (pinned memory) while
    // this thread captures; the backward pass runs on autograd's thread but
    // on the captured stream, which is what is captured.
#if TORCH_VERSION_MAJOR >= 2
    fresh->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
#else
    fresh->capture_begin();  // 1.13 captures in the global mode only
#endif
    begun = true;
    const bool outer = detail::capturing_step();  // a step of an enclosing CapturedStep
    try {
      capturing = true;
      detail::set_capturing_step(true);
      loss = step(static_data, static_target);
      capturing = false;
      detail::set_capturing_step(outer);
    } catch (...) {
      capturing = false;
      detail::set_capturing_step(outer);
      try {
        fresh->capture_end();
        ended = true;  // the step threw, not CUDA: the capture itself was valid
      } catch (...) {
        // the capture was invalid already; what the step threw says why
      }
      throw;
    }
    fresh->capture_end();
  } catch (...) {
    reason = "the capture failed (" + first_line(what_of(std::current_exception())) + ")";
    tell("steps run eagerly: " + reason);
    static_data = static_target = torch::Tensor();
    if (ended) {
      fresh.reset();  // an ordinary graph, never replayed: destroyed, its pool released
    } else {
      // What capture_begin began is ended: LibTorch 2.15's capture_end does
      // before it throws, and reset() cleans up; before 2.15,
      // end_failed_capture. The graph is kept until the next capture or
      // reset() (before 2.15, for good).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
      try {
        fresh->reset();
      } catch (...) {
      }
      failed = std::move(fresh);
#elif TORCH_VERSION_MAJOR == 2
      end_failed_capture(std::move(fresh), begun, device.index(), pool, side);
#else
      failed = std::move(fresh);  // LibTorch 1.x: left as it is (docs/gpu.md)
#endif
    }
    // This batch, eagerly. The failed capture ran the step's host code once
    // already (gradients set to none, a counter in the user's code): the step
    // must be safe to run again. LibTorch's calls are; GradScaler::step puts
    // its state back when the host read it needs throws. A backward that
    // threw part-way left its reducers mid-iteration: they start again.
    detail::abandon_prepared_iterations(/*wait_for_collectives=*/false);
    return eager(data, target);
  }
  c10::Event captured(c10::DeviceType::CUDA);
  captured.record(side);
  captured.block(current);
  graph = std::move(fresh);
  // Detached: a caller who kept it would keep the captured graph's nodes.
  // The same storage, which every replay writes.
  static_loss = loss.defined() ? loss.detach() : loss;
  tell("captured the step (batch " + shape_of(data) + ") after " + std::to_string(eager_steps) +
       " eager steps");
  graph->replay();  // the capture ran nothing: this batch's step
  return static_loss;
}
#else
torch::Tensor CapturedStep::Impl::capture(const torch::Tensor& data, const torch::Tensor& target) {
  return step(data, target);  // not reached: decide() gave a reason
}
#endif

CapturedStep::CapturedStep(Step step, CaptureOptions options) : impl_(std::make_unique<Impl>()) {
  if (!step) throw std::invalid_argument("train::CapturedStep: the step function is empty");
  if (options.warmup_steps() < 1) {
    throw std::invalid_argument("train::CapturedStep: warmup_steps must be at least 1, got " +
                                std::to_string(options.warmup_steps()));
  }
  impl_->step = std::move(step);
  impl_->options = options;
}

CapturedStep::~CapturedStep() = default;

torch::Tensor CapturedStep::operator()(const torch::Tensor& data, const torch::Tensor& target) {
  auto& impl = *impl_;
  if (!impl.decided) impl.decide(data);
  if (!impl.reason.empty()) return impl.eager(data, target);
#ifdef USE_C10D_NCCL
  if (impl.graph) {
    if (data.sizes() != impl.static_data.sizes() || target.sizes() != impl.static_target.sizes() ||
        data.scalar_type() != impl.static_data.scalar_type() ||
        target.scalar_type() != impl.static_target.scalar_type()) {
      if (!std::exchange(impl.told_other_shape, true)) {
        impl.tell("a batch of another shape than the captured " + shape_of(impl.static_data) +
                  " runs eagerly, as do any others (" + shape_of(data) +
                  " first; LoaderOptions::drop_last keeps every batch whole)");
      }
      return impl.eager(data, target);
    }
    impl.static_data.copy_(data, /*non_blocking=*/true);
    impl.static_target.copy_(target, /*non_blocking=*/true);
    impl.graph->replay();
    return impl.static_loss;
  }
#endif
  // The warm-up counts batches of one shape in a row, and the capture takes
  // the next of that shape: a partial batch would leave a graph that every
  // whole batch then misses.
  const bool same_shape = data.sizes() == c10::IntArrayRef(impl.warmed_data) &&
                          target.sizes() == c10::IntArrayRef(impl.warmed_target);
  if (!same_shape) {
    impl.warmed_data = data.sizes().vec();
    impl.warmed_target = target.sizes().vec();
    impl.eager_steps = 0;
  }
  if (impl.eager_steps < impl.options.warmup_steps()) {
    ++impl.eager_steps;
    return impl.eager(data, target);
  }
  return impl.capture(data, target);
}

bool CapturedStep::captured() const {
#ifdef USE_C10D_NCCL
  return impl_->graph != nullptr;
#else
  return false;
#endif
}

bool CapturedStep::capturing() const { return impl_->capturing; }

const std::string& CapturedStep::eager_reason() const { return impl_->reason; }

void CapturedStep::reset() {
#ifdef USE_C10D_NCCL
  impl_->graph.reset();
#endif
#ifdef USE_C10D_NCCL
  impl_->failed.reset();
#endif
  impl_->static_data = impl_->static_target = impl_->static_loss = torch::Tensor();
  impl_->eager_steps = 0;
  impl_->told_other_shape = false;
  // Decided again at the next batch: a failed capture may succeed now.
  impl_->decided = false;
  impl_->reason.clear();
}

}  // namespace train

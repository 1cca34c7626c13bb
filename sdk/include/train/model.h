#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <utility>

namespace train {

/// How gradients travel in their allreduce (DDP's compress hooks).
enum class Compression {
  kNone,  ///< in their own type
  kBF16,  ///< bfloat16: half the bytes, float32's range, 8 bits of precision
  kFP16,  ///< float16: half the bytes, 11 bits of precision, values up to 65504
};

/// Options of prepare_model, the counterpart of DistributedDataParallel's arguments.
struct ModelOptions {
  /// Size of the gradient buckets allreduced together, in MiB (DDP's bucket_cap_mb).
  TORCH_ARG(double, bucket_cap_mb) = 25;
  /// Size of the first bucket, in MiB: small, so that communication starts early
  /// (with find_unused_parameters, DDP's layout: the bucket of the first
  /// parameters registered, launched last).
  TORCH_ARG(double, first_bucket_cap_mb) = 1;
  /// Allow parameters that get no gradient in an iteration: their gradient counts
  /// as zero on that rank. When false, such an iteration fails with an error that
  /// names the parameters.
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// After every synchronised backward, overwrite buffers (BatchNorm running
  /// statistics) with rank 0's, as DDP's broadcast_buffers does.
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// At every train::report, check that every rank's parameters still hold the
  /// same values (an exact checksum per parameter, one small collective per
  /// report); if not, train::report throws std::runtime_error on every rank
  /// naming the first parameter that differs and the ranks.
  TORCH_ARG(bool, check_divergence) = true;
  /// Allreduce float32 gradients as bf16 or fp16, like DDP's
  /// bf16_compress_hook and fp16_compress_hook: each bucket is divided by the
  /// world size (in float32, before the cast, where DDP casts first), cast,
  /// averaged, and cast back into the gradients. Halves the bytes on the wire
  /// for a second buffer of half the gradients' size, and precision: with
  /// fp16 an average beyond 65504 becomes inf and one below about 6e-8
  /// becomes 0. Pays when the allreduce is the bottleneck (many workers, a
  /// slow network), not on one machine. kBF16 on Gloo (which has no bfloat16
  /// allreduce) travels as a reduce-scatter (an alltoall) and an allgather of
  /// bf16, summed in float32: the same bytes per rank as a ring allreduce, the
  /// same result on every rank, more buffers (the pieces received), and with
  /// many ranks per node more traffic between nodes than a ring.
  TORCH_ARG(Compression, compression) = Compression::kNone;
};

namespace detail {
void prepare_module(const std::shared_ptr<torch::nn::Module>& module, const ModelOptions& options);
bool set_gradient_sync(const torch::nn::Module& module, bool enabled);
}  // namespace detail

/// Makes a model data-parallel, like Ray Train's `prepare_model` (PyTorch's
/// DistributedDataParallel, which LibTorch's C++ API lacks).
///
/// Moves parameters and buffers to this worker's device and broadcasts them from
/// rank 0, so every replica starts identical. From then on, every `backward()`
/// averages gradients across ranks: bucketed in reverse registration order, each
/// bucket allreduced asynchronously as soon as its gradients are ready, so that
/// communication overlaps the rest of backward; `.grad` holds the average when
/// backward returns. The training loop does not change. Parameters with
/// requires_grad=false are skipped. With one worker it only moves the model.
/// Every rank must call it, in the same order for each model. Throws
/// std::logic_error outside a train function started by trainrun.
///
/// Every rank must build the same model and pass the same options: first of
/// all, prepare_model compares every rank's parameters and buffers (names,
/// order, shapes, dtypes, requires_grad) and options, and if they differ throws
/// std::runtime_error on every rank naming the first difference and the ranks.
///
/// Loading parameters afterwards is fine: after `torch::load(model, path)` on
/// every rank, gradients are still averaged. A load that changes a parameter's
/// shape, dtype or device makes the next `backward()` throw std::runtime_error
/// naming the parameter; load such a model before prepare_model (or pass the
/// model's device to torch::load). A load on some ranks only makes the replicas
/// differ, which the next train::report finds (ModelOptions::check_divergence).
template <typename Holder, typename = decltype(std::declval<Holder&>().ptr())>
Holder prepare_model(Holder model, const ModelOptions& options = {}) {
  detail::prepare_module(model.ptr(), options);
  return model;
}

/// The same for a module held by std::shared_ptr.
template <typename ModuleType>
std::shared_ptr<ModuleType> prepare_model(std::shared_ptr<ModuleType> model,
                                          const ModelOptions& options = {}) {
  detail::prepare_module(model, options);
  return model;
}

/// While alive, backward passes of the model accumulate gradients locally
/// without synchronising, for gradient accumulation (DDP's no_sync()); the
/// first backward after it ends synchronises the accumulated gradients.
class NoSync {
 public:
  explicit NoSync(const torch::nn::Module& module)
      : module_(&module), previous_(detail::set_gradient_sync(module, false)) {}
  ~NoSync() { detail::set_gradient_sync(*module_, previous_); }
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;

 private:
  const torch::nn::Module* module_;
  bool previous_;
};

/// `auto guard = train::no_sync(model);` see NoSync.
template <typename ModuleType>
NoSync no_sync(const torch::nn::ModuleHolder<ModuleType>& model) {
  return NoSync(*model);
}

}  // namespace train

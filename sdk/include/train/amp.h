#pragma once

/// Automatic mixed precision, as Python's torch.autocast and
/// torch.amp.GradScaler give it: train::Autocast runs the forward pass of its
/// scope in bfloat16 or float16 where that is safe, and train::GradScaler
/// scales the loss so that float16 gradients do not underflow, skipping the
/// steps whose gradients overflowed. LibTorch's C++ API has neither as a class.
///
///   train::GradScaler scaler;                      // float16 on CUDA
///   for (auto& batch : *loader) {
///     optimizer.zero_grad();
///     torch::Tensor loss;
///     {
///       train::Autocast autocast(torch::kCUDA);      // float16 by default
///       loss = criterion(model->forward(batch.data), batch.target);
///     }
///     scaler.scale(loss).backward();
///     scaler.step(optimizer);                         // skipped on inf or NaN, on every rank
///     scaler.update();
///   }
///
/// bfloat16 (the default on CPU) has float32's range: it needs no GradScaler.

#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <unordered_map>

namespace train {

namespace detail {
/// Counts the live GradScalers: a loop over loader.epochs() takes no
/// replacement while one lives (its scale is not sent to it).
struct LiveScaler {
  LiveScaler();
  LiveScaler(const LiveScaler&);
  LiveScaler& operator=(const LiveScaler&) = default;
  ~LiveScaler();
};
}  // namespace detail

/// Autocast for one device type for the lifetime of the object (Python's
/// `with torch.autocast(device_type, dtype, enabled)`): ops that autocast
/// knows run in `dtype` (matrix products, convolutions), the rest in float32.
/// Scopes nest; each restores what the one outside it had set, and leaving the
/// outermost clears autocast's cache of cast weights, as Python does. Use it on
/// one thread (autocast's state is per thread), around the forward pass and
/// the loss, not the backward pass.
class Autocast {
 public:
  /// `device`: torch::kCPU or torch::kCUDA. `dtype`: torch::kBFloat16 or
  /// torch::kFloat16; none: what the thread casts to on that device already
  /// (bfloat16 on CPU, float16 on CUDA, unless a scope outside chose another).
  /// Throws std::invalid_argument for another device type or dtype.
  explicit Autocast(torch::DeviceType device, std::optional<torch::Dtype> dtype = std::nullopt,
                    bool enabled = true);
  /// Restores the state outside the scope.
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

  /// Whether autocast is on for `device` on this thread.
  static bool is_enabled(torch::DeviceType device);

 private:
  torch::DeviceType device_;
  bool previous_enabled_;
  torch::Dtype previous_dtype_;
};

/// Options of GradScaler (torch.amp.GradScaler's arguments).
struct GradScalerOptions {
  /// The first scale.
  TORCH_ARG(double, init_scale) = 65536.0;
  /// The scale is multiplied by this after `growth_interval` steps in a row
  /// without inf or NaN...
  TORCH_ARG(double, growth_factor) = 2.0;
  /// ... and by this after a step with them (which is skipped).
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Good steps in a row before the scale grows.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// When false, scale() returns its argument and step() only steps: one code
  /// path for float32 and float16 runs.
  TORCH_ARG(bool, enabled) = true;
  /// The ranks that agree whether a step is skipped: one small allreduce
  /// (MAX) per step. None: the group the run's collectives use at each step
  /// (with --recovery in-place, the survivors' after a rank is lost, the
  /// allreduce done again there as train::all_reduce does), no agreement
  /// outside a train function of more than one worker.
  TORCH_ARG(c10::intrusive_ptr<c10d::ProcessGroup>, process_group) = {};
};

/// Loss scaling for float16 training (torch.amp.GradScaler). A step whose
/// gradients hold inf or NaN on any rank is skipped on every rank, and the
/// scale backs off; a run of good steps grows it again. Its state (scale and
/// growth tracker) goes into a checkpoint with save() and comes back with
/// load(). Not thread-safe: one per training loop. A process group given in
/// its options is held: let it go with the train function.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  /// `loss` times the current scale (unchanged when disabled).
  torch::Tensor scale(const torch::Tensor& loss);
  /// Divides the gradients of `optimizer`'s parameters by the scale, and finds
  /// out whether any is inf or NaN on any rank. Call it before clipping
  /// gradients; step() calls it when you did not. Throws std::logic_error when
  /// called twice for the same optimizer, or after its step(), before
  /// update(); std::invalid_argument for float16 or sparse gradients (keep
  /// the parameters in float32: Autocast casts for the forward pass).
  void unscale_(torch::optim::Optimizer& optimizer);
  /// Steps `optimizer` unless its gradients held inf or NaN on some rank;
  /// returns false when it did not. With train::optim's SGD, Adam or AdamW on
  /// fused kernels (train::optim::AmpStep), and the scale on the device, the
  /// device decides without the host waiting for it: the kernel skips the
  /// update, and step() returns true having queued it. Once per optimizer
  /// between two update()s (std::logic_error otherwise).
  bool step(torch::optim::Optimizer& optimizer);
  /// Adjusts the scale after the step(s) of one iteration: backs off when any
  /// was skipped, grows after `growth_interval` good iterations in a row.
  /// Throws std::logic_error when no step() or unscale_() came since the last.
  void update();

  /// The current scale (1 when disabled). Waits for the device when the
  /// scale lives there.
  double get_scale() const;
  /// Whether it scales at all (GradScalerOptions::enabled).
  bool is_enabled() const { return options_.enabled(); }
  /// Iterations in a row without inf or NaN, since the scale last changed.
  /// Waits for the device when the scale lives there.
  int64_t growth_tracker() const;
  /// Whether the scale lives on a device and is updated there: from the first
  /// scale() or unscale_() on a device whose LibTorch has the AMP kernels
  /// (CUDA; the CPU too from LibTorch 2.3), as Python's GradScaler keeps it.
  bool on_device() const { return scale_tensor_.defined(); }

  /// Writes the scale and growth tracker, for a checkpoint.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Reads what save() wrote. Throws c10::Error when the archive lacks it.
  void load(torch::serialize::InputArchive& archive);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };  // per optimizer, within an iteration
  struct OptimizerState {
    Stage stage = Stage::kReady;
    bool found_inf = false;      // on the host
    torch::Tensor found;         // on the device: one float, nonzero for inf or NaN
    bool under_capture = false;  // stage set while a CapturedStep captured the step
  };

  // This optimizer's state, made fresh where a CapturedStep's capture set it
  // and failed before update(): the eager step that follows does it again.
  OptimizerState& state_of(const torch::optim::Optimizer& optimizer);

  // Decides, once, where the scale lives, from the first device it meets.
  void place(torch::Device device);
  // Every rank's inf or NaN in `optimizer`'s gradients, multiplied first by
  // `inverse` (one float on the scale's device; 1 only checks), on the device.
  torch::Tensor find_inf(torch::optim::Optimizer& optimizer, const torch::Tensor& inverse);
  void check_gradients(torch::optim::Optimizer& optimizer) const;
  void agree(torch::Tensor& found) const;

  GradScalerOptions options_;
  double scale_;  // on the host, until place() moves it
  int64_t growth_tracker_ = 0;
  bool placed_ = false;
  torch::Tensor scale_tensor_;    // float32 {1}, once on a device
  torch::Tensor tracker_tensor_;  // int32 {1}, beside it
  std::unordered_map<const torch::optim::Optimizer*, OptimizerState> per_optimizer_;
  detail::LiveScaler live_;  // a replacement cannot be sent its state yet
};

/// What Ray Train's enable_reproducibility does, for LibTorch: seeds LibTorch's
/// generators (CPU and every CUDA device) with `seed`, the same on every rank;
/// makes LibTorch use deterministic algorithms (an op that has none then
/// throws); turns cuDNN's benchmark off and its deterministic mode on; and sets
/// CUBLAS_WORKSPACE_CONFIG=:4096:8 unless it holds the other accepted value,
/// :16:8 (it counts only if CUDA has not started yet: call it first in the
/// train function). These switches are the worker process's, not only the
/// calling thread's. train's samplers already
/// shuffle the same way on every rank for a given seed (LoaderOptions::seed).
/// Two runs of the same code on the same data and hardware then compute the
/// same losses; it costs speed.
void enable_reproducibility(uint64_t seed = 0);

}  // namespace train

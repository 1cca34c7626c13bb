#pragma once

/// Optimizers that update every parameter in a few kernel launches: SGD, Adam
/// and AdamW with the options, state and saved form of LibTorch's
/// torch::optim ones, so that swapping `torch::optim::Adam` for
/// `train::optim::Adam` is a one-line change and a checkpoint saved with one
/// loads into the other.
///
///   train::optim::Adam optimizer(model->parameters(), train::optim::AdamOptions(1e-3));
///   ...
///   optimizer.zero_grad();
///   loss.backward();
///   optimizer.step();
///
/// LibTorch's C++ optimizers update one parameter at a time: about eight
/// kernels per tensor, some 500 launches per ResNet-18 step, which on a GPU
/// costs more than the step's arithmetic. These choose their path per step,
/// inside, never in the caller's loop (see Kernels::kAuto): on a CUDA device
/// one fused ATen kernel per dtype (`_fused_adam_`, `_fused_adamw_`,
/// `_fused_sgd_`), elsewhere the multi-tensor `_foreach_*` ops, which compute
/// on the CPU exactly what torch::optim computes. Each is a torch::optim optimizer (it derives
/// from torch::optim::Adam, ...): LR schedulers, train::GradScaler,
/// torch::save and torch::load take it as they take LibTorch's. Not
/// thread-safe, like LibTorch's.

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace train {

/// While alive, makes `optimizer` known to the SDK (a torch::optim optimizer,
/// or one of your own deriving from torch::optim::Optimizer that overrides
/// save() and load(), whose base versions write nothing): a replacement of a
/// lost rank then gets its state from a peer (docs/fault-tolerance.md,
/// "Replacements in your own loop"). train::optim's optimizers are known from
/// construction to destruction; others, from register_optimizer until the
/// handle it returns is destroyed: keep the handle beside the optimizer.
/// Known optimizers are sent in the order they became known, as save() writes
/// them. The handle is not movable: the optimizer is known by its address.
///
///   torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
///   auto known = train::register_optimizer(optimizer);
class [[nodiscard]] KnownOptimizer {
 public:
  explicit KnownOptimizer(torch::optim::Optimizer& optimizer);
  /// Makes `optimizer` known in `moved`'s place (an optimizer moved to it).
  KnownOptimizer(torch::optim::Optimizer& optimizer, KnownOptimizer& moved);
  ~KnownOptimizer();
  KnownOptimizer(const KnownOptimizer&) = delete;
  KnownOptimizer& operator=(const KnownOptimizer&) = delete;

 private:
  torch::optim::Optimizer* optimizer_;
};

/// Makes `optimizer` known to the SDK while the handle returned lives.
inline KnownOptimizer register_optimizer(torch::optim::Optimizer& optimizer) {
  return KnownOptimizer(optimizer);
}

namespace detail {
/// A known optimizer updated its parameters (or a train::GradScaler step
/// decided on the device whether to): the gradients of the last synchronised
/// backward were used, so a replacement may join before the next.
void note_optimizer_step();
}  // namespace detail

}  // namespace train

namespace train::optim {

/// The options and per-parameter state are LibTorch's own types: that is what
/// makes the saved form the same.
using SGDOptions = torch::optim::SGDOptions;
using SGDParamState = torch::optim::SGDParamState;
using AdamOptions = torch::optim::AdamOptions;
using AdamParamState = torch::optim::AdamParamState;
using AdamWOptions = torch::optim::AdamWOptions;
using AdamWParamState = torch::optim::AdamWParamState;

/// How an optimizer updates its parameters (PyTorch's `foreach` and `fused`
/// arguments); the others force a path, for comparisons.
enum class Kernels {
  /// The default. On a CUDA device the fused kernel (where the LibTorch line
  /// has one for the dtype): one launch per step, and the only path a step
  /// captured in a CUDA graph can take. Its values differ from torch::optim's
  /// in the last bits, as PyTorch's `fused=True` does (PyTorch's own default
  /// there is foreach). Elsewhere kForeach, which on the CPU is bit for bit
  /// torch::optim's (LibTorch 2.4 and later have fused CPU kernels, faster
  /// but not bit-equal: ask for kFused).
  kAuto,
  /// One parameter at a time, the ops of torch::optim, in its order.
  kPerTensor,
  /// `_foreach_*` ops over every parameter of a device and dtype at once.
  kForeach,
  /// One fused kernel per device and dtype; where there is none for a
  /// device, that device's tensors take kForeach.
  kFused,
};

/// The name of a path, for logs: "auto", "per-tensor", "foreach", "fused".
const char* to_string(Kernels kernels);

/// Whether this LibTorch has the fused kernel of `optimizer` ("sgd", "adam" or
/// "adamw") for tensors on `device_type`.
bool has_fused_kernel(const char* optimizer, c10::DeviceType device_type);

namespace detail {
/// Adam's and AdamW's step counts on the device, by parameter (its
/// TensorImpl): the fused kernels read them there, and a step the device may
/// skip, or a step replayed from a CUDA graph, counts them there.
struct DeviceSteps {
  std::unordered_map<void*, torch::Tensor> counts;  // float, one element
};
}  // namespace detail

/// What train::GradScaler asks of an optimizer so that a float16 step needs no
/// host synchronisation: the decision to skip a step whose gradients held inf
/// or NaN is taken on the device, by the fused kernel (PyTorch's optimizers
/// with `_step_supports_amp_scaling`). SGD, Adam and AdamW here have it.
class AmpStep {
 public:
  virtual ~AmpStep() = default;
  /// Updates every parameter that has a gradient unless `found_inf` (one
  /// float on the parameters' device, 0 or 1) is 1, decided on the device;
  /// `grad_scale`, when defined, first divides the gradients, which were not
  /// unscaled. Returns false, having changed nothing, where some parameter's
  /// path has no fused kernel that can skip (the caller then decides on the
  /// host and calls step()).
  virtual bool step_unless_inf(const torch::Tensor& grad_scale, const torch::Tensor& found_inf) = 0;
};

/// SGD with momentum, dampening, Nesterov and weight decay, as torch::optim::SGD
/// computes it.
class SGD : public torch::optim::SGD, public AmpStep {
 public:
  /// Throws c10::Error for an invalid option, as torch::optim::SGD does.
  explicit SGD(std::vector<torch::optim::OptimizerParamGroup> param_groups, SGDOptions defaults,
               Kernels kernels = Kernels::kAuto);
  explicit SGD(std::vector<torch::Tensor> params, SGDOptions defaults,
               Kernels kernels = Kernels::kAuto);
  SGD(SGD&& other)
      : torch::optim::SGD(std::move(other)),
        kernels_(other.kernels_),
        last_path_(other.last_path_),
        known_(*this, other.known_) {}

  /// One update of every parameter that has a gradient; a sparse gradient
  /// (an embedding's) is taken one tensor at a time, as torch::optim::SGD
  /// takes it.
  torch::Tensor step(LossClosure closure = nullptr) override;
  bool step_unless_inf(const torch::Tensor& grad_scale, const torch::Tensor& found_inf) override;
  /// The path asked for at construction.
  Kernels kernels() const { return kernels_; }
  /// The path the last step took for most parameters (kForeach or kFused, or
  /// kPerTensor when asked), kAuto before the first step.
  Kernels last_path() const { return last_path_; }

 private:
  Kernels kernels_;
  Kernels last_path_ = Kernels::kAuto;
  KnownOptimizer known_{*this};
};

namespace detail {

/// Adam and AdamW, which differ only in how weight decay applies (added to the
/// gradient, or `kDecoupled`: the parameter shrinks). Use train::optim::Adam
/// and train::optim::AdamW.
template <typename LibTorchAdam, typename Options, typename State, bool kDecoupled>
class AdamFamily : public LibTorchAdam, public AmpStep {
 public:
  /// Throws c10::Error for an invalid option, as LibTorch's does.
  explicit AdamFamily(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                      Options defaults = {}, Kernels kernels = Kernels::kAuto);
  explicit AdamFamily(std::vector<torch::Tensor> params, Options defaults = {},
                      Kernels kernels = Kernels::kAuto);
  AdamFamily(AdamFamily&& other)
      : LibTorchAdam(std::move(other)),
        kernels_(other.kernels_),
        last_path_(other.last_path_),
        device_steps_(std::move(other.device_steps_)),
        known_(*this, other.known_) {}

  /// One update of every parameter that has a gradient. Throws c10::Error for
  /// a sparse gradient.
  torch::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override;
  /// A step of train::GradScaler (AmpStep).
  bool step_unless_inf(const torch::Tensor& grad_scale, const torch::Tensor& found_inf) override;
  /// Fused steps count each parameter's steps on the device (so that a step
  /// reads nothing from the host and can be captured in a CUDA graph); this
  /// writes those counts into state() (one host synchronisation). save() does
  /// it first. The counts are float32 there, exact up to 2^24 steps, as
  /// PyTorch's fused optimizers keep them.
  void sync_steps();
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  /// The path asked for at construction.
  Kernels kernels() const { return kernels_; }
  /// The path the last step took for most parameters (kForeach or kFused, or
  /// kPerTensor when asked), kAuto before the first step.
  Kernels last_path() const { return last_path_; }

 private:
  Kernels kernels_;
  Kernels last_path_ = Kernels::kAuto;
  DeviceSteps device_steps_;
  KnownOptimizer known_{*this};
};

extern template class AdamFamily<torch::optim::Adam, AdamOptions, AdamParamState, false>;
extern template class AdamFamily<torch::optim::AdamW, AdamWOptions, AdamWParamState, true>;

}  // namespace detail

/// Adam (with amsgrad and L2 weight decay), as torch::optim::Adam computes it.
class Adam : public detail::AdamFamily<torch::optim::Adam, AdamOptions, AdamParamState, false> {
 public:
  using AdamFamily::AdamFamily;
};

/// AdamW (decoupled weight decay), as torch::optim::AdamW computes it.
class AdamW : public detail::AdamFamily<torch::optim::AdamW, AdamWOptions, AdamWParamState, true> {
 public:
  using AdamFamily::AdamFamily;
};

}  // namespace train::optim

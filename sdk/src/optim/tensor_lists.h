#pragma once

// What the SDK's optimizers share: a parameter's key in Optimizer::state() on
// either LibTorch line, the lists a multi-tensor kernel takes (one per device
// and dtype), which fused kernels this LibTorch has, and whether a CUDA graph
// is being captured. Stateless but for a table of fused kernels filled once
// per process.

#include <train/optim.h>

#include <torch/types.h>

#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace train::optim::detail {

/// The key of `param` in Optimizer::state(): its TensorImpl's address, as
/// text in LibTorch 1.13 (as c10::guts::to_string writes it) and as a pointer
/// in 2.x.
template <typename StateMap>
typename StateMap::key_type state_key(const torch::Tensor& param) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << param.unsafeGetTensorImpl();
    return text.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

/// Tensors that one multi-tensor or fused call updates together: the same
/// device and dtype. `state` holds up to three lists of optimizer
/// state (Adam: exp_avg, exp_avg_sq, max_exp_avg_sq; SGD: momentum_buffer).
struct TensorLists {
  c10::Device device;
  c10::ScalarType dtype;
  std::vector<torch::Tensor> params, grads;
  std::vector<torch::Tensor> state[3];
  /// Each tensor's step count on the device, where a fused kernel reads it from there.
  std::vector<torch::Tensor> steps;
  /// Whether the tensors at each position (a parameter, its gradient, its
  /// state) are laid out alike, as fused kernels need (see laid_out_alike).
  bool alike = true;
  /// Whether the gradients are sparse (SGD takes them one at a time, as
  /// torch::optim::SGD does).
  bool sparse = false;
};

/// Whether `param` and the tensors a fused kernel reads at its position
/// (`with`: its gradient, its state; undefined ones, made later like `param`,
/// skipped) are dense and non-overlapping, with the same sizes, dtype, device
/// and strides (but where a dimension has size 1): fused kernels walk them all
/// by one flat index, and PyTorch's check_fast_path_restrictions asks the
/// same. A channels_last parameter whose gradient is contiguous is not.
bool laid_out_alike(const torch::Tensor& param, std::initializer_list<torch::Tensor> with);

/// The lists for `param` among `lists`, added when there are none yet.
TensorLists& lists_for(std::vector<TensorLists>& lists, const torch::Tensor& param,
                       bool sparse = false);

/// The fused kernels an optimizer may use.
enum class Fused { kSGD, kAdam, kAdamW };

/// Whether this LibTorch has `fused`'s kernel for tensors on `device_type`
/// (looked up in the dispatcher once per process).
bool has_fused(Fused fused, c10::DeviceType device_type);

/// The path one set of lists takes when `asked` was asked for: the fused
/// kernel for kAuto and kFused where there is one for their device and dtype
/// and the tensors are laid out alike, else the multi-tensor ops; kPerTensor as asked,
/// and for sparse gradients.
Kernels path_for(Kernels asked, Fused fused, const TensorLists& lists);

/// Whether a CUDA graph is being captured on `device`'s current stream.
bool capturing(const torch::Device& device);

/// Throws c10::Error when `what` (state, a count) would be made for `param`
/// inside a CUDA graph's capture, where every replay would make it again.
void check_not_capturing(const torch::Tensor& param, const char* what);

/// Throws c10::Error, as torch::optim does, for a sparse gradient.
void check_dense(const torch::Tensor& grad, const char* optimizer);

/// The state of `param` in `state`, of type State, or null.
template <typename State, typename StateMap>
State* find_state(StateMap& state, const torch::Tensor& param) {
  auto it = state.find(state_key<StateMap>(param));
  return it == state.end() ? nullptr : static_cast<State*>(it->second.get());
}

}  // namespace train::optim::detail

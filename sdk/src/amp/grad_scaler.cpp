// train::GradScaler. Its scale lives on the host until it meets a device whose
// LibTorch has the AMP kernels; from then on, as in Python's GradScaler, it is
// a tensor there, the inf check and the scale's update run there, and with an
// optimizer that can skip a step on the device (train::optim::AmpStep) a step
// needs no host synchronisation at all.

#include <train/amp.h>
#include <train/optim.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/capturing.h"
#include "core/collectives.h"

namespace train {
namespace {

bool has_kernel(const char* name, c10::DeviceType device_type) {
  auto key = device_type == c10::DeviceType::CUDA  ? c10::DispatchKey::CUDA
             : device_type == c10::DeviceType::CPU ? c10::DispatchKey::CPU
                                                   : c10::DispatchKey::Undefined;
  if (key == c10::DispatchKey::Undefined) return false;
  auto handle = c10::Dispatcher::singleton().findSchema({name, ""});
  return handle.has_value() && handle->hasKernelForDispatchKey(key);
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options)
    : options_(std::move(options)), scale_(options_.init_scale()) {
  if (!(options_.init_scale() > 0) || !(options_.growth_factor() > 1) ||
      !(options_.backoff_factor() > 0 && options_.backoff_factor() < 1) ||
      options_.growth_interval() < 1) {
    throw std::invalid_argument(
        "train::GradScaler: needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 "
        "and growth_interval >= 1");
  }
}

void GradScaler::place(torch::Device device) {
  if (placed_ || !options_.enabled()) return;
  placed_ = true;
  if (!has_kernel("aten::_amp_update_scale_", device.type()) ||
      !has_kernel("aten::_amp_foreach_non_finite_check_and_unscale_", device.type())) {
    return;  // LibTorch 1.13 on the CPU: the scale stays on the host
  }
  const auto options = torch::TensorOptions().device(device);
  scale_tensor_ = torch::full({1}, scale_, options.dtype(torch::kFloat32));
  tracker_tensor_ = torch::full({1}, growth_tracker_, options.dtype(torch::kInt32));
}

double GradScaler::get_scale() const {
  if (!options_.enabled()) return 1.0;
  return on_device() ? scale_tensor_.item<double>() : scale_;
}

int64_t GradScaler::growth_tracker() const {
  return on_device() ? tracker_tensor_.item<int64_t>() : growth_tracker_;
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (!options_.enabled()) return loss;
  place(loss.device());
  // In float32, as Python's float32 scale tensor promotes a half loss.
  const bool half = loss.scalar_type() == torch::kHalf || loss.scalar_type() == torch::kBFloat16;
  const auto& value = half ? loss.to(torch::kFloat32) : loss;
  if (!on_device()) return value * scale_;
  // A view of the one element, so that a scalar loss stays a scalar.
  return value * scale_tensor_.to(loss.device(), /*non_blocking=*/true).reshape({});
}

void GradScaler::check_gradients(torch::optim::Optimizer& optimizer) const {
  // Checked before any is touched: a refusal leaves every gradient as it was.
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      const auto& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.is_sparse()) {
        throw std::invalid_argument("train::GradScaler does not unscale sparse gradients");
      }
      if (grad.scalar_type() == torch::kHalf) {
        throw std::invalid_argument(
            "train::GradScaler: attempting to unscale float16 gradients; keep the parameters "
            "in float32 and let train::Autocast cast for the forward pass");
      }
    }
  }
}

void GradScaler::agree(torch::Tensor& found) const {
  // Every rank skips the step if one found inf or NaN: gradients outside the
  // reducer (or accumulated without synchronisation) may differ by rank.
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  const auto& group = options_.process_group();
  if (!group) {
    // The run's group as it is now: a rank lost in place leaves the
    // survivors' (the group it was built in has ended).
    detail::allreduce_surviving(found, max);
  } else if (group->getSize() > 1) {
    std::vector<torch::Tensor> tensors{found};
    group->allreduce(tensors, max)->wait();
  }
}

torch::Tensor GradScaler::find_inf(torch::optim::Optimizer& optimizer,
                                   const torch::Tensor& inverse) {
  const auto device = scale_tensor_.device();
  auto found = torch::zeros({1}, torch::TensorOptions().device(device));
  // One fused kernel per device unscales its gradients and records inf or
  // NaN, without a synchronisation.
  std::unordered_map<torch::Device, std::vector<torch::Tensor>> by_device;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      if (param.grad().defined()) by_device[param.grad().device()].push_back(param.grad());
    }
  }
  for (auto& [where, list] : by_device) {
    if (where == device) {
      at::_amp_foreach_non_finite_check_and_unscale_(list, found, inverse);
      continue;
    }
    auto found_here = torch::zeros({1}, torch::TensorOptions().device(where));
    at::_amp_foreach_non_finite_check_and_unscale_(list, found_here, inverse.to(where));
    found = torch::maximum(found, found_here.to(device));
  }
  agree(found);
  return found;
}

GradScaler::OptimizerState& GradScaler::state_of(const torch::optim::Optimizer& optimizer) {
  auto& state = per_optimizer_[&optimizer];
  // A capture that succeeded ran update() too, and a replay runs no host
  // code: a stage left from a capture, met outside one, is a failed capture's.
  if (state.under_capture && !detail::capturing_step()) state = OptimizerState{};
  return state;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) return;
  auto& state = state_of(optimizer);
  if (state.stage == Stage::kUnscaled) {
    throw std::logic_error(
        "train::GradScaler::unscale_ was already called for this optimizer since the last "
        "update()");
  }
  if (state.stage == Stage::kStepped) {
    throw std::logic_error("train::GradScaler::unscale_ called after step(); call update() first");
  }
  check_gradients(optimizer);
  // Where every rank keeps its finding: its first parameter's device.
  std::optional<torch::Device> device;
  for (auto& group : optimizer.param_groups()) {
    if (!group.params().empty()) {
      device = group.params().front().device();
      break;
    }
  }
  place(device.value_or(torch::kCPU));
  torch::NoGradGuard no_grad;
  if (on_device()) {
    // inv_scale as Python computes it: the reciprocal in double, then float32.
    state.found =
        find_inf(optimizer, scale_tensor_.to(torch::kDouble).reciprocal().to(torch::kFloat));
    state.stage = Stage::kUnscaled;
    state.under_capture = detail::capturing_step();
    return;
  }
  // On the host: CUDA gradients by the fused kernel per device, CPU ones one by one.
  const float inverse = static_cast<float>(1.0 / scale_);
  torch::Tensor found =
      torch::zeros({1}, torch::TensorOptions().device(device.value_or(torch::kCPU)));
  std::unordered_map<torch::Device, std::vector<torch::Tensor>> by_device;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      auto grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.is_cuda()) {
        by_device[grad.device()].push_back(grad);
      } else {
        grad.mul_(inverse);
        if (!torch::isfinite(grad).all().item<bool>()) found.fill_(1);
      }
    }
  }
  for (auto& [cuda, list] : by_device) {
    auto options = torch::TensorOptions().device(cuda).dtype(torch::kFloat32);
    auto found_here = torch::zeros({1}, options);
    at::_amp_foreach_non_finite_check_and_unscale_(list, found_here,
                                                   torch::full({1}, inverse, options));
    found = torch::maximum(found, found_here.to(found.device()));
  }
  agree(found);
  state.found_inf = found.item<float>() > 0;
  state.stage = Stage::kUnscaled;
  state.under_capture = detail::capturing_step();
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return true;
  }
  auto& state = state_of(optimizer);
  if (state.stage == Stage::kStepped) {
    throw std::logic_error(
        "train::GradScaler::step was already called for this optimizer since the last update()");
  }
  auto* on_device_step = dynamic_cast<optim::AmpStep*>(&optimizer);
  if (on_device_step != nullptr && state.stage == Stage::kReady) {
    check_gradients(optimizer);
    for (auto& group : optimizer.param_groups()) {
      if (!group.params().empty()) {
        place(group.params().front().device());
        break;
      }
    }
  }
  if (on_device_step != nullptr && on_device()) {
    torch::NoGradGuard no_grad;
    // Not unscaled yet: only checked here, and the kernel unscales (Python's
    // _check_inf_per_device with the scale handed to the optimizer).
    const bool unscaled = state.stage == Stage::kUnscaled;
    auto found = unscaled ? state.found : find_inf(optimizer, torch::ones_like(scale_tensor_));
    if (on_device_step->step_unless_inf(unscaled ? torch::Tensor() : scale_tensor_, found)) {
      state.found = found;
      state.stage = Stage::kStepped;
      state.under_capture = detail::capturing_step();
      return true;
    }
    // The optimizer cannot skip on the device: the host decides, below.
  }
  // The host decides. A read the device refuses (inside a CUDA graph's
  // capture, where nothing ran) leaves this optimizer's state as it was, so
  // that the step can run again eagerly.
  const OptimizerState before = state;
  bool found_inf = false;
  try {
    if (state.stage == Stage::kReady) unscale_(optimizer);
    found_inf = on_device() ? state.found.item<float>() > 0 : state.found_inf;
  } catch (...) {
    per_optimizer_[&optimizer] = before;
    throw;
  }
  state.stage = Stage::kStepped;
  state.under_capture = detail::capturing_step();
  if (found_inf) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  if (!detail::capturing_step()) {  // what a failed capture left, not done again
    for (auto it = per_optimizer_.begin(); it != per_optimizer_.end();) {
      it = it->second.under_capture ? per_optimizer_.erase(it) : std::next(it);
    }
  }
  if (per_optimizer_.empty()) {
    throw std::logic_error(
        "train::GradScaler::update: no step() or unscale_() since the last update(), so no "
        "inf checks were recorded");
  }
  if (on_device()) {
    auto found = torch::zeros_like(scale_tensor_);
    for (const auto& [optimizer, state] : per_optimizer_) {
      if (state.found.defined()) found = found + state.found.to(found.device());
    }
    per_optimizer_.clear();
    // On the device, as Python: a growth past float32's range keeps the scale.
    at::_amp_update_scale_(scale_tensor_, tracker_tensor_, found, options_.growth_factor(),
                           options_.backoff_factor(), options_.growth_interval());
    return;
  }
  bool found_inf = false;
  for (const auto& [optimizer, state] : per_optimizer_) found_inf = found_inf || state.found_inf;
  per_optimizer_.clear();
  // In float32, as Python's scale tensor: a growth past float32's range keeps
  // the scale as it was.
  if (found_inf) {
    scale_ = static_cast<float>(scale_ * options_.backoff_factor());
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= options_.growth_interval()) {
    const float grown = static_cast<float>(scale_ * options_.growth_factor());
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", torch::tensor(on_device() ? get_scale() : scale_, torch::kFloat64));
  archive.write("growth_tracker", torch::tensor(growth_tracker(), torch::kInt64));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor scale, growth_tracker;
  archive.read("scale", scale);
  archive.read("growth_tracker", growth_tracker);
  const double loaded = scale.item<double>();
  if (!(std::isfinite(loaded) && loaded > 0) || growth_tracker.item<int64_t>() < 0) {
    throw std::invalid_argument("train::GradScaler::load: the archive's scale (" +
                                std::to_string(loaded) + ") or growth tracker is not valid");
  }
  scale_ = loaded;
  growth_tracker_ = growth_tracker.item<int64_t>();
  if (on_device()) {
    scale_tensor_.fill_(scale_);
    tracker_tensor_.fill_(growth_tracker_);
  }
  per_optimizer_.clear();
}

}  // namespace train

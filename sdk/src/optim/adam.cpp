// Adam and AdamW: one step over a param group, by the path each device and
// dtype takes. The per-tensor path is torch::optim's own arithmetic in its
// order; the multi-tensor path the same arithmetic as _foreach_* ops over
// every tensor of a device at once (PyTorch's _multi_tensor_adam); the fused
// path one ATen kernel per device (_fused_adam).

#include <train/optim.h>

#include <ATen/ATen.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "optim/tensor_lists.h"

namespace train::optim {
namespace {

using detail::DeviceSteps;
using detail::TensorLists;

// What Adam and AdamW share of their options; they differ only in how weight
// decay applies (added to the gradient, or decoupled: the parameter shrinks).
struct Hyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad, decoupled;
};

template <typename Options>
Hyper hyper_of(const Options& options, bool decoupled) {
  return {options.lr(),  std::get<0>(options.betas()), std::get<1>(options.betas()),
          options.eps(), options.weight_decay(),       options.amsgrad(),
          decoupled};
}

// `counts`: each tensor's step count, this step included.
void per_tensor(const TensorLists& lists, const Hyper& h, const std::vector<int64_t>& counts) {
  for (size_t i = 0; i < lists.params.size(); ++i) {
    const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(counts[i]));
    const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(counts[i]));
    auto p = lists.params[i];
    auto grad = lists.grads[i];
    auto exp_avg = lists.state[0][i];
    auto exp_avg_sq = lists.state[1][i];
    if (h.weight_decay != 0) {
      if (h.decoupled) {
        p.mul_(1 - h.lr * h.weight_decay);
      } else {
        grad = grad.add(p, h.weight_decay);
      }
    }
    exp_avg.mul_(h.beta1).add_(grad, 1 - h.beta1);
    exp_avg_sq.mul_(h.beta2).addcmul_(grad, grad, 1 - h.beta2);
    torch::Tensor denom;
    if (h.amsgrad) {
      auto max_exp_avg_sq = lists.state[2][i];
      torch::max_out(max_exp_avg_sq, exp_avg_sq, max_exp_avg_sq);
      denom = (max_exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(h.eps);
    } else {
      denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(h.eps);
    }
    p.addcdiv_(exp_avg, denom, -(h.lr / bias_correction1));
  }
}

void foreach (const TensorLists& lists, const Hyper& h, const std::vector<int64_t>& counts) {
  // Each tensor's bias corrections: the counts differ where a tensor had no
  // gradient in some steps.
  std::vector<c10::Scalar> root_correction2, step_size;
  for (const auto count : counts) {
    const auto c = static_cast<double>(count);
    root_correction2.emplace_back(std::sqrt(1 - std::pow(h.beta2, c)));
    step_size.emplace_back(-(h.lr / (1 - std::pow(h.beta1, c))));
  }
  const auto& params = lists.params;
  auto& exp_avgs = lists.state[0];
  auto& exp_avg_sqs = lists.state[1];
  std::vector<torch::Tensor> grads = lists.grads;
  if (h.weight_decay != 0) {
    if (h.decoupled) {
      at::_foreach_mul_(params, 1 - h.lr * h.weight_decay);
    } else {
      grads = at::_foreach_add(grads, params, h.weight_decay);
    }
  }
  at::_foreach_mul_(exp_avgs, h.beta1);
  at::_foreach_add_(exp_avgs, grads, 1 - h.beta1);
  at::_foreach_mul_(exp_avg_sqs, h.beta2);
  at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - h.beta2);
  if (h.amsgrad) at::_foreach_maximum_(lists.state[2], exp_avg_sqs);
  auto denom = at::_foreach_sqrt(h.amsgrad ? lists.state[2] : exp_avg_sqs);
  at::_foreach_div_(denom, root_correction2);
  at::_foreach_add_(denom, h.eps);
  at::_foreach_addcdiv_(params, exp_avgs, denom, step_size);
}

// `steps`: the step count of each tensor, on the device, as the kernel reads
// it; `grad_scale` and `found_inf`, when defined, GradScaler's (the kernel
// then unscales, and skips everything when found_inf is nonzero).
void fused(const TensorLists& lists, const Hyper& h, const std::vector<torch::Tensor>& steps,
           const c10::optional<torch::Tensor>& grad_scale = c10::nullopt,
           const c10::optional<torch::Tensor>& found_inf = c10::nullopt) {
  const std::vector<torch::Tensor> none;
  const auto& max_exp_avg_sqs = h.amsgrad ? lists.state[2] : none;
#if TORCH_VERSION_MAJOR >= 2
  if (h.decoupled) {
    at::_fused_adamw_(lists.params, lists.grads, lists.state[0], lists.state[1], max_exp_avg_sqs,
                      steps, h.lr, h.beta1, h.beta2, h.weight_decay, h.eps, h.amsgrad,
                      /*maximize=*/false, grad_scale, found_inf);
    return;
  }
#else
  // 1.13 has Adam's kernel only: AdamW's decay first, then Adam without decay
  // (so a step the device may skip cannot take this path: amp_fusable).
  if (h.decoupled) {
    if (h.weight_decay != 0) at::_foreach_mul_(lists.params, 1 - h.lr * h.weight_decay);
    at::_fused_adam_(lists.params, lists.grads, lists.state[0], lists.state[1], max_exp_avg_sqs,
                     steps, h.lr, h.beta1, h.beta2, /*weight_decay=*/0, h.eps, h.amsgrad,
                     /*maximize=*/false, grad_scale, found_inf);
    return;
  }
#endif
  at::_fused_adam_(lists.params, lists.grads, lists.state[0], lists.state[1], max_exp_avg_sqs,
                   steps, h.lr, h.beta1, h.beta2, h.weight_decay, h.eps, h.amsgrad,
                   /*maximize=*/false, grad_scale, found_inf);
}

// Whether a step the device may skip can take the fused kernel for every list.
bool amp_fusable(const std::vector<TensorLists>& all, [[maybe_unused]] const Hyper& h,
                 detail::Fused kind, Kernels asked) {
#if TORCH_VERSION_MAJOR < 2
  if (h.decoupled && h.weight_decay != 0) return false;
#endif
  for (const auto& lists : all) {
    if (detail::path_for(asked, kind, lists) != Kernels::kFused) return false;
  }
  return true;
}

template <typename State, typename StateMap>
State& state_of(StateMap& state, const torch::Tensor& p, bool amsgrad) {
  auto* s = detail::find_state<State>(state, p);
  if (s == nullptr) {
    detail::check_not_capturing(p, "the first state");
    auto fresh = std::make_unique<State>();
    fresh->step(0);
    fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    s = fresh.get();
    state[detail::state_key<StateMap>(p)] = std::move(fresh);
  }
  if (amsgrad && !s->max_exp_avg_sq().defined()) {
    detail::check_not_capturing(p, "amsgrad's state");
    s->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
  }
  return *s;
}

// A group's lists: the tensors with gradients and their state (made where
// missing), by device and dtype.
template <typename State, typename StateMap>
std::vector<TensorLists> lists_of(torch::optim::OptimizerParamGroup& group, StateMap& state,
                                  const Hyper& h, const char* name) {
  std::vector<TensorLists> all;
  for (auto& p : group.params()) {
    if (!p.grad().defined()) continue;
    detail::check_dense(p.grad(), name);
    auto& s = state_of<State>(state, p, h.amsgrad);
    auto& lists = detail::lists_for(all, p);
    lists.params.push_back(p);
    lists.grads.push_back(p.grad());
    lists.state[0].push_back(s.exp_avg());
    lists.state[1].push_back(s.exp_avg_sq());
    if (h.amsgrad) lists.state[2].push_back(s.max_exp_avg_sq());
    lists.alike = lists.alike &&
                  detail::laid_out_alike(p, {p.grad(), s.exp_avg(), s.exp_avg_sq(),
                                             h.amsgrad ? s.max_exp_avg_sq() : torch::Tensor()});
  }
  return all;
}

// The step counts of a fused list, on the device, where they stay from one
// step to the next (made from the host's counts where missing): a fused step
// then reads no count from the host, and so can be captured in a CUDA graph.
template <typename State, typename Optimizer>
void device_steps_of(TensorLists& lists, Optimizer& optimizer, DeviceSteps& device_steps) {
  lists.steps.clear();
  for (const auto& p : lists.params) {
    auto it = device_steps.counts.find(p.unsafeGetTensorImpl());
    if (it == device_steps.counts.end()) {
      detail::check_not_capturing(p, "the step count on the device");
      const auto& s = *detail::find_state<State>(optimizer.state(), p);
      auto step = torch::full({}, static_cast<double>(s.step()),
                              torch::TensorOptions().dtype(torch::kFloat).device(p.device()));
      it = device_steps.counts.emplace(p.unsafeGetTensorImpl(), std::move(step)).first;
    }
    lists.steps.push_back(it->second);
  }
}

// Writes the step counts kept on the device into the state: one copy to the
// host per device. They stay on the device for the next fused step. Always
// copied, never trusted to be unchanged: a CUDA graph's replays count there
// without any host code running.
template <typename State, typename Optimizer>
void sync_device_steps(Optimizer& optimizer, const DeviceSteps& device_steps) {
  if (device_steps.counts.empty()) return;
  std::unordered_map<torch::Device, std::vector<torch::Tensor>> values;
  std::unordered_map<torch::Device, std::vector<State*>> states;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      auto it = device_steps.counts.find(p.unsafeGetTensorImpl());
      if (it == device_steps.counts.end()) continue;
      auto* s = detail::find_state<State>(optimizer.state(), p);
      if (s == nullptr) continue;
      values[it->second.device()].push_back(it->second);
      states[it->second.device()].push_back(s);
    }
  }
  for (auto& [device, list] : values) {
    torch::Tensor host = torch::stack(list).to(torch::kCPU, torch::kDouble);
    const auto* counts = host.data_ptr<double>();
    auto& targets = states[device];
    for (size_t i = 0; i < targets.size(); ++i) {
      targets[i]->step(static_cast<int64_t>(counts[i]));
    }
  }
}

// One step of every param group of an Adam or AdamW; returns the path most
// tensors took.
template <typename Options, typename State, typename Optimizer>
Kernels adam_step(Optimizer& optimizer, Kernels asked, bool decoupled, DeviceSteps& device_steps) {
  const char* name = decoupled ? "AdamW" : "Adam";
  const auto fused_kind = decoupled ? detail::Fused::kAdamW : detail::Fused::kAdam;
  size_t fused_tensors = 0, other_tensors = 0;
  for (auto& group : optimizer.param_groups()) {
    const Hyper h = hyper_of(static_cast<const Options&>(group.options()), decoupled);
    for (auto& lists : lists_of<State>(group, optimizer.state(), h, name)) {
      const auto path = detail::path_for(asked, fused_kind, lists);
      if (path == Kernels::kFused) {
        device_steps_of<State>(lists, optimizer, device_steps);
        at::_foreach_add_(lists.steps, 1);
        try {
          fused(lists, h, lists.steps);
        } catch (...) {
          at::_foreach_sub_(lists.steps, 1);  // the step did not happen
          throw;
        }
        fused_tensors += lists.params.size();
        continue;
      }
      // Captured, host counts would be replayed as they were at the capture.
      TORCH_CHECK(!detail::capturing(lists.device), "train::optim::", name,
                  ": a step captured in a CUDA graph needs the fused kernel, which counts steps ",
                  "on the device; the ", to_string(path), " path counts them on the host");
      // The host's counts, brought up to date first where the device kept them.
      if (std::any_of(lists.params.begin(), lists.params.end(), [&](const torch::Tensor& p) {
            return device_steps.counts.count(p.unsafeGetTensorImpl()) > 0;
          })) {
        sync_device_steps<State>(optimizer, device_steps);
      }
      std::vector<int64_t> counts;
      for (const auto& p : lists.params) {
        auto& s = *detail::find_state<State>(optimizer.state(), p);
        s.step(s.step() + 1);
        counts.push_back(s.step());
        device_steps.counts.erase(p.unsafeGetTensorImpl());  // the host's is the count now
      }
      if (path == Kernels::kPerTensor) {
        per_tensor(lists, h, counts);
      } else {
        foreach (lists, h, counts)
          ;
      }
      other_tensors += lists.params.size();
    }
  }
  if (asked == Kernels::kPerTensor) return asked;
  return fused_tensors > other_tensors ? Kernels::kFused : Kernels::kForeach;
}

// GradScaler's step: every list fused, the step counts on the device, raised
// by one unless found_inf. Returns false, having changed nothing (the state it
// made to tell is dropped again), when some list cannot take it.
template <typename Options, typename State, typename Optimizer>
bool adam_step_unless_inf(Optimizer& optimizer, Kernels asked, bool decoupled,
                          DeviceSteps& device_steps, const torch::Tensor& grad_scale,
                          const torch::Tensor& found_inf) {
  const char* name = decoupled ? "AdamW" : "Adam";
  const auto fused_kind = decoupled ? detail::Fused::kAdamW : detail::Fused::kAdam;
  auto& state = optimizer.state();
  using StateMap = std::decay_t<decltype(state)>;
  // The parameters without state: lists_of makes theirs.
  std::vector<typename StateMap::key_type> stateless;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      const auto key = detail::state_key<StateMap>(p);
      if (p.grad().defined() && state.count(key) == 0) stateless.push_back(key);
    }
  }
  std::vector<std::pair<Hyper, std::vector<TensorLists>>> groups;
  for (auto& group : optimizer.param_groups()) {
    const Hyper h = hyper_of(static_cast<const Options&>(group.options()), decoupled);
    auto all = lists_of<State>(group, state, h, name);
    if (!amp_fusable(all, h, fused_kind, asked)) {
      for (const auto& key : stateless) state.erase(key);
      return false;
    }
    groups.emplace_back(h, std::move(all));
  }
  for (auto& [h, all] : groups) {
    for (auto& lists : all) {
      device_steps_of<State>(lists, optimizer, device_steps);
      const auto found = found_inf.to(lists.device);
      c10::optional<torch::Tensor> scale;
      if (grad_scale.defined()) scale = grad_scale.to(lists.device);
      // As PyTorch's _fused_adam: the counts go up, the kernel skips on inf,
      // and the counts of a skipped step come back down.
      at::_foreach_add_(lists.steps, 1);
      try {
        fused(lists, h, lists.steps, scale, found);
      } catch (...) {
        at::_foreach_sub_(lists.steps, 1);
        throw;
      }
      at::_foreach_sub_(lists.steps,
                        std::vector<torch::Tensor>(lists.steps.size(), found.reshape({})));
    }
  }
  return true;
}

template <typename Closure>
torch::Tensor run_closure(const Closure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace

namespace detail {

template <typename LibTorchAdam, typename Options, typename State, bool kDecoupled>
AdamFamily<LibTorchAdam, Options, State, kDecoupled>::AdamFamily(
    std::vector<torch::optim::OptimizerParamGroup> param_groups, Options defaults, Kernels kernels)
    : LibTorchAdam(std::move(param_groups), defaults), kernels_(kernels) {}

template <typename LibTorchAdam, typename Options, typename State, bool kDecoupled>
AdamFamily<LibTorchAdam, Options, State, kDecoupled>::AdamFamily(std::vector<torch::Tensor> params,
                                                                 Options defaults, Kernels kernels)
    : LibTorchAdam(std::move(params), defaults), kernels_(kernels) {}

template <typename LibTorchAdam, typename Options, typename State, bool kDecoupled>
torch::Tensor AdamFamily<LibTorchAdam, Options, State, kDecoupled>::step(
    torch::optim::Optimizer::LossClosure closure) {
  torch::NoGradGuard no_grad;
  auto loss = run_closure(closure);
  last_path_ = adam_step<Options, State>(*this, kernels_, kDecoupled, device_steps_);
  train::detail::note_optimizer_step();
  return loss;
}

template <typename LibTorchAdam, typename Options, typename State, bool kDecoupled>
bool AdamFamily<LibTorchAdam, Options, State, kDecoupled>::step_unless_inf(
    const torch::Tensor& grad_scale, const torch::Tensor& found_inf) {
  torch::NoGradGuard no_grad;
  if (!adam_step_unless_inf<Options, State>(*this, kernels_, kDecoupled, device_steps_, grad_scale,
                                            found_inf)) {
    return false;
  }
  last_path_ = Kernels::kFused;
  train::detail::note_optimizer_step();
  return true;
}

template <typename LibTorchAdam, typename Options, typename State, bool kDecoupled>
void AdamFamily<LibTorchAdam, Options, State, kDecoupled>::sync_steps() {
  sync_device_steps<State>(*this, device_steps_);
}

template <typename LibTorchAdam, typename Options, typename State, bool kDecoupled>
void AdamFamily<LibTorchAdam, Options, State, kDecoupled>::save(
    torch::serialize::OutputArchive& archive) const {
  // The saved counts are the host's: the device's first (a const save of a
  // state that is, logically, already this).
  const_cast<AdamFamily*>(this)->sync_steps();
  LibTorchAdam::save(archive);
}

template <typename LibTorchAdam, typename Options, typename State, bool kDecoupled>
void AdamFamily<LibTorchAdam, Options, State, kDecoupled>::load(
    torch::serialize::InputArchive& archive) {
  // The device's counts into the state first: a parameter the archive has no
  // state for keeps its own, which must be its real count.
  sync_steps();
  LibTorchAdam::load(archive);
  device_steps_ = {};
}

template class AdamFamily<torch::optim::Adam, AdamOptions, AdamParamState, false>;
template class AdamFamily<torch::optim::AdamW, AdamWOptions, AdamWParamState, true>;

}  // namespace detail
}  // namespace train::optim

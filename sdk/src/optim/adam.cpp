// Adam and AdamW: one step over a param group, by the path each device and
// dtype takes. The per-tensor path is torch::optim's own arithmetic in its
// order; the multi-tensor path the same arithmetic as _foreach_* ops over
// every tensor of a device at once (PyTorch's _multi_tensor_adam); the fused
// path one ATen kernel per device (_fused_adam).

#include <train/optim.h>

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "optim/tensor_lists.h"

namespace train::optim {
namespace {

using detail::TensorLists;

// What Adam and AdamW share of their options; they differ only in how weight
// decay applies (added to the gradient, or decoupled: the parameter shrinks).
struct Hyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad, decoupled;
};

template <typename Options>
Hyper hyper_of(const Options& options, bool decoupled) {
  return {options.lr(),     std::get<0>(options.betas()), std::get<1>(options.betas()),
          options.eps(),    options.weight_decay(),       options.amsgrad(),
          decoupled};
}

void per_tensor(const TensorLists& lists, const Hyper& h) {
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(lists.step));
  const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(lists.step));
  for (size_t i = 0; i < lists.params.size(); ++i) {
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

void foreach(const TensorLists& lists, const Hyper& h) {
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(lists.step));
  const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(lists.step));
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
  at::_foreach_div_(denom, std::sqrt(bias_correction2));
  at::_foreach_add_(denom, h.eps);
  at::_foreach_addcdiv_(params, exp_avgs, denom, -(h.lr / bias_correction1));
}

void fused(const TensorLists& lists, const Hyper& h) {
  // The kernel reads each tensor's step count from a tensor on its device.
  auto step = torch::full({}, static_cast<double>(lists.step),
                          torch::TensorOptions().dtype(torch::kFloat).device(lists.device));
  const std::vector<torch::Tensor> steps(lists.params.size(), step);
  const std::vector<torch::Tensor> none;
  const auto& max_exp_avg_sqs = h.amsgrad ? lists.state[2] : none;
#if TORCH_VERSION_MAJOR >= 2
  if (h.decoupled) {
    at::_fused_adamw_(lists.params, lists.grads, lists.state[0], lists.state[1], max_exp_avg_sqs,
                      steps, h.lr, h.beta1, h.beta2, h.weight_decay, h.eps, h.amsgrad,
                      /*maximize=*/false);
    return;
  }
#else
  // 1.13 has Adam's kernel only: AdamW's decay first, then Adam without decay.
  if (h.decoupled) {
    if (h.weight_decay != 0) at::_foreach_mul_(lists.params, 1 - h.lr * h.weight_decay);
    at::_fused_adam_(lists.params, lists.grads, lists.state[0], lists.state[1], max_exp_avg_sqs,
                     steps, h.lr, h.beta1, h.beta2, /*weight_decay=*/0, h.eps, h.amsgrad,
                     /*maximize=*/false);
    return;
  }
#endif
  at::_fused_adam_(lists.params, lists.grads, lists.state[0], lists.state[1], max_exp_avg_sqs,
                   steps, h.lr, h.beta1, h.beta2, h.weight_decay, h.eps, h.amsgrad,
                   /*maximize=*/false);
}

// One step of every param group of an Adam or AdamW; returns the path most
// tensors took.
template <typename Options, typename State, typename Optimizer>
Kernels adam_step(Optimizer& optimizer, Kernels asked, bool decoupled) {
  const char* name = decoupled ? "AdamW" : "Adam";
  const auto fused_kind = decoupled ? detail::Fused::kAdamW : detail::Fused::kAdam;
  auto& state = optimizer.state();
  size_t fused_tensors = 0, other_tensors = 0;
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const Options&>(group.options());
    const Hyper h = hyper_of(options, decoupled);
    std::vector<TensorLists> all;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      detail::check_dense(p.grad(), name);
      auto* s = detail::find_state<State>(state, p);
      if (s == nullptr) {
        auto fresh = std::make_unique<State>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        s = fresh.get();
        state[detail::state_key<std::decay_t<decltype(state)>>(p)] = std::move(fresh);
      }
      if (h.amsgrad && !s->max_exp_avg_sq().defined()) {
        s->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      }
      s->step(s->step() + 1);
      auto& lists = detail::lists_for(all, p, s->step());
      lists.params.push_back(p);
      lists.grads.push_back(p.grad());
      lists.state[0].push_back(s->exp_avg());
      lists.state[1].push_back(s->exp_avg_sq());
      if (h.amsgrad) lists.state[2].push_back(s->max_exp_avg_sq());
      lists.dense = lists.dense && p.is_non_overlapping_and_dense() &&
                    p.grad().is_non_overlapping_and_dense() &&
                    s->exp_avg().is_non_overlapping_and_dense() &&
                    s->exp_avg_sq().is_non_overlapping_and_dense();
    }
    for (const auto& lists : all) {
      switch (detail::path_for(asked, fused_kind, lists)) {
        case Kernels::kPerTensor: per_tensor(lists, h); break;
        case Kernels::kFused:
          fused(lists, h);
          fused_tensors += lists.params.size();
          continue;
        default: foreach(lists, h); break;
      }
      other_tensors += lists.params.size();
    }
  }
  if (asked == Kernels::kPerTensor) return asked;
  return fused_tensors > other_tensors ? Kernels::kFused : Kernels::kForeach;
}

template <typename Closure>
torch::Tensor run_closure(const Closure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace

Adam::Adam(std::vector<torch::optim::OptimizerParamGroup> param_groups, AdamOptions defaults,
           Kernels kernels)
    : torch::optim::Adam(std::move(param_groups), defaults), kernels_(kernels) {}

Adam::Adam(std::vector<torch::Tensor> params, AdamOptions defaults, Kernels kernels)
    : torch::optim::Adam(std::move(params), defaults), kernels_(kernels) {}

torch::Tensor Adam::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  auto loss = run_closure(closure);
  last_path_ = adam_step<AdamOptions, AdamParamState>(*this, kernels_, /*decoupled=*/false);
  return loss;
}

AdamW::AdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups, AdamWOptions defaults,
             Kernels kernels)
    : torch::optim::AdamW(std::move(param_groups), defaults), kernels_(kernels) {}

AdamW::AdamW(std::vector<torch::Tensor> params, AdamWOptions defaults, Kernels kernels)
    : torch::optim::AdamW(std::move(params), defaults), kernels_(kernels) {}

torch::Tensor AdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  auto loss = run_closure(closure);
  last_path_ = adam_step<AdamWOptions, AdamWParamState>(*this, kernels_, /*decoupled=*/true);
  return loss;
}

}  // namespace train::optim

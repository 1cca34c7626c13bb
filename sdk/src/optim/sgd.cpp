// SGD: one step over a param group, by the path each device and dtype takes
// (see adam.cpp). A parameter's first step with momentum makes its buffer
// from its gradient, as torch::optim::SGD does; later steps update it.

#include <train/optim.h>

#include <ATen/ATen.h>
#include <torch/version.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "optim/tensor_lists.h"

namespace train::optim {
namespace {

using detail::TensorLists;

// In a TensorLists of SGD: state[0] holds the momentum buffers of the
// parameters that had one before this step, undefined for the others.
void per_tensor(TensorLists& lists, const SGDOptions& o) {
  for (size_t i = 0; i < lists.params.size(); ++i) {
    auto p = lists.params[i];
    auto d_p = lists.grads[i];
    if (o.weight_decay() != 0) d_p = d_p.add(p, o.weight_decay());
    if (o.momentum() != 0) {
      auto& buf = lists.state[0][i];
      if (!buf.defined()) {
        detail::check_not_capturing(p, "the momentum buffer");
        buf = torch::clone(d_p).detach();
      } else {
        buf.mul_(o.momentum()).add_(d_p, 1 - o.dampening());
      }
      d_p = o.nesterov() ? d_p.add(buf, o.momentum()) : buf;
    }
    p.add_(d_p, -1 * o.lr());
  }
}

void foreach (TensorLists& lists, const SGDOptions& o) {
  std::vector<torch::Tensor> d_p = lists.grads;
  if (o.weight_decay() != 0) d_p = at::_foreach_add(d_p, lists.params, o.weight_decay());
  if (o.momentum() != 0) {
    std::vector<torch::Tensor> old_bufs, old_d_p;
    auto& bufs = lists.state[0];
    for (size_t i = 0; i < bufs.size(); ++i) {
      if (bufs[i].defined()) {
        old_bufs.push_back(bufs[i]);
        old_d_p.push_back(d_p[i]);
      } else {
        detail::check_not_capturing(lists.params[i], "the momentum buffer");
        bufs[i] = torch::clone(d_p[i]).detach();  // the first step of this parameter
      }
    }
    if (!old_bufs.empty()) {
      at::_foreach_mul_(old_bufs, o.momentum());
      at::_foreach_add_(old_bufs, old_d_p, 1 - o.dampening());
    }
    if (o.nesterov()) {
      d_p = at::_foreach_add(d_p, bufs, o.momentum());
    } else {
      d_p = bufs;
    }
  }
  at::_foreach_add_(lists.params, d_p, -1 * o.lr());
}

// A group's lists: the tensors with gradients and their momentum buffers
// (undefined where there is none yet).
template <typename StateMap>
std::vector<TensorLists> lists_of(torch::optim::OptimizerParamGroup& group, StateMap& states) {
  std::vector<TensorLists> all;
  for (auto& p : group.params()) {
    if (!p.grad().defined()) continue;
    // A sparse gradient (an embedding's) goes the per-tensor way, as LibTorch's SGD takes it.
    auto& lists = detail::lists_for(all, p, p.grad().is_sparse());
    lists.params.push_back(p);
    lists.grads.push_back(p.grad());
    auto* s = detail::find_state<SGDParamState>(states, p);
    lists.state[0].push_back(s != nullptr ? s->momentum_buffer() : torch::Tensor());
    lists.alike = lists.alike && detail::laid_out_alike(p, {p.grad(), lists.state[0].back()});
  }
  return all;
}

// Whether the fused kernel can take these lists: with momentum, every buffer
// is new (its first step) or every one exists.
bool fusable(const TensorLists& lists, const SGDOptions& o) {
  if (o.momentum() == 0) return true;
  size_t defined = 0;
  for (const auto& buf : lists.state[0]) defined += buf.defined() ? 1 : 0;
  return defined == 0 || defined == lists.state[0].size();
}

void fused([[maybe_unused]] TensorLists& lists, [[maybe_unused]] const SGDOptions& o,
           [[maybe_unused]] const c10::optional<torch::Tensor>& grad_scale = c10::nullopt,
           [[maybe_unused]] const c10::optional<torch::Tensor>& found_inf = c10::nullopt) {
#if TORCH_VERSION_MAJOR >= 2
  const std::vector<torch::Tensor> none;
  bool first_step = false;
  if (o.momentum() != 0) {
    for (size_t i = 0; i < lists.params.size(); ++i) {
      if (!lists.state[0][i].defined()) {
        detail::check_not_capturing(lists.params[i], "the momentum buffer");
        // The kernel copies the first step's update into it.
        lists.state[0][i] = torch::empty_like(lists.params[i], torch::MemoryFormat::Preserve);
        first_step = true;
      }
    }
  }
  at::_fused_sgd_(lists.params, lists.grads, o.momentum() != 0 ? lists.state[0] : none,
                  o.weight_decay(), o.momentum(), o.lr(), o.dampening(), o.nesterov(),
                  /*maximize=*/false, first_step, grad_scale, found_inf);
#else
  TORCH_CHECK(false, "train::optim::SGD: this LibTorch has no fused SGD kernel");
#endif
}

}  // namespace

SGD::SGD(std::vector<torch::optim::OptimizerParamGroup> param_groups, SGDOptions defaults,
         Kernels kernels)
    : torch::optim::SGD(std::move(param_groups), defaults), kernels_(kernels) {}

SGD::SGD(std::vector<torch::Tensor> params, SGDOptions defaults, Kernels kernels)
    : torch::optim::SGD(std::move(params), defaults), kernels_(kernels) {}

torch::Tensor SGD::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  auto& states = state();
  using StateMap = std::decay_t<decltype(states)>;
  size_t fused_tensors = 0, other_tensors = 0;
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const SGDOptions&>(group.options());
    for (auto& lists : lists_of(group, states)) {
      auto path = detail::path_for(kernels_, detail::Fused::kSGD, lists);
      if (path == Kernels::kFused && !fusable(lists, options)) path = Kernels::kForeach;
      switch (path) {
        case Kernels::kPerTensor: per_tensor(lists, options); break;
        case Kernels::kFused: fused(lists, options); break;
        default:
          foreach (lists, options)
            ;
          break;
      }
      (path == Kernels::kFused ? fused_tensors : other_tensors) += lists.params.size();
      if (options.momentum() == 0) continue;
      // New buffers become the parameters' state, as torch::optim::SGD keeps
      // them (in a state of their own, or one loaded without a buffer).
      for (size_t i = 0; i < lists.params.size(); ++i) {
        auto* s = detail::find_state<SGDParamState>(states, lists.params[i]);
        if (s != nullptr && s->momentum_buffer().defined()) continue;
        if (s == nullptr) {
          auto fresh = std::make_unique<SGDParamState>();
          s = fresh.get();
          states[detail::state_key<StateMap>(lists.params[i])] = std::move(fresh);
        }
        s->momentum_buffer(lists.state[0][i]);
      }
    }
  }
  if (kernels_ == Kernels::kPerTensor) {
    last_path_ = kernels_;
  } else {
    last_path_ = fused_tensors > other_tensors ? Kernels::kFused : Kernels::kForeach;
  }
  train::detail::note_optimizer_step();
  return loss;
}

bool SGD::step_unless_inf(const torch::Tensor& grad_scale, const torch::Tensor& found_inf) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<const SGDOptions*, std::vector<TensorLists>>> groups;
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const SGDOptions&>(group.options());
    auto all = lists_of(group, state());
    for (const auto& lists : all) {
      // A first step with momentum makes the buffers from the gradients: a
      // step the device may skip would leave them unmade, so it is the host's.
      const bool new_buffers = options.momentum() != 0 &&
                               std::any_of(lists.state[0].begin(), lists.state[0].end(),
                                           [](const torch::Tensor& buf) { return !buf.defined(); });
      if (new_buffers ||
          detail::path_for(kernels_, detail::Fused::kSGD, lists) != Kernels::kFused) {
        return false;
      }
    }
    groups.emplace_back(&options, std::move(all));
  }
  for (auto& [options, all] : groups) {
    for (auto& lists : all) {
      c10::optional<torch::Tensor> scale;
      if (grad_scale.defined()) scale = grad_scale.to(lists.device);
      fused(lists, *options, scale, found_inf.to(lists.device));
    }
  }
  last_path_ = Kernels::kFused;
  train::detail::note_optimizer_step();
  return true;
}

const char* to_string(Kernels kernels) {
  switch (kernels) {
    case Kernels::kAuto: return "auto";
    case Kernels::kPerTensor: return "per-tensor";
    case Kernels::kForeach: return "foreach";
    case Kernels::kFused: return "fused";
  }
  return "?";
}

bool has_fused_kernel(const char* optimizer, c10::DeviceType device_type) {
  const std::string name = optimizer;
  if (name == "sgd") return detail::has_fused(detail::Fused::kSGD, device_type);
  if (name == "adam") return detail::has_fused(detail::Fused::kAdam, device_type);
  if (name == "adamw") return detail::has_fused(detail::Fused::kAdamW, device_type);
  return false;
}

}  // namespace train::optim

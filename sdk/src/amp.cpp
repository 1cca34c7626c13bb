#include <train/amp.h>
#include <train/torch_compat.h>

#include <ATen/autocast_mode.h>
#include <torch/utils.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "host.h"

namespace train {
namespace {

torch::Dtype checked_dtype(torch::DeviceType device, std::optional<torch::Dtype> dtype) {
  if (device != torch::kCPU && device != torch::kCUDA) {
    throw std::invalid_argument("train::Autocast: autocast on " +
                                c10::DeviceTypeName(device, /*lower_case=*/true) +
                                " is not supported; use torch::kCPU or torch::kCUDA");
  }
  auto chosen = dtype.value_or(device == torch::kCPU ? torch::kBFloat16 : torch::kFloat16);
  if (chosen != torch::kBFloat16 && chosen != torch::kFloat16) {
    throw std::invalid_argument(std::string("train::Autocast: autocast casts to bfloat16 or "
                                            "float16, not ") +
                                c10::toString(chosen));
  }
  return chosen;
}

// The ranks that must agree on a skipped step: the run's group when the train
// function has peers.
c10::intrusive_ptr<c10d::ProcessGroup> default_group() {
  const auto* host = detail::current_host_or_null();
  if (host == nullptr || host->world_size <= 1) return {};
  auto* group = static_cast<c10d::ProcessGroup*>(host->process_group);
  return c10::intrusive_ptr<c10d::ProcessGroup>::unsafe_reclaim_from_nonowning(group);
}

}  // namespace

Autocast::Autocast(torch::DeviceType device, std::optional<torch::Dtype> dtype, bool enabled)
    : device_(device), previous_enabled_(false), previous_dtype_(torch::kFloat32) {
  auto chosen = checked_dtype(device, dtype);
  previous_enabled_ = compat::autocast_enabled(device);
  previous_dtype_ = compat::autocast_dtype(device);
  compat::set_autocast_enabled(device, enabled);
  compat::set_autocast_dtype(device, chosen);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  // As torch.autocast's __exit__: the outermost scope drops the cast weights
  // it cached, then the state outside is restored.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(device_, previous_enabled_);
  compat::set_autocast_dtype(device_, previous_dtype_);
}

bool Autocast::is_enabled(torch::DeviceType device) { return compat::autocast_enabled(device); }

GradScaler::GradScaler(GradScalerOptions options)
    : options_(std::move(options)), scale_(options_.init_scale()) {
  if (!(options_.init_scale() > 0) || !(options_.growth_factor() > 1) ||
      !(options_.backoff_factor() > 0 && options_.backoff_factor() < 1) ||
      options_.growth_interval() < 1) {
    throw std::invalid_argument(
        "train::GradScaler: needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 "
        "and growth_interval >= 1");
  }
  if (!options_.process_group()) options_.process_group(default_group());
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (!options_.enabled()) return loss;
  return loss * scale_;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) return;
  auto& state = per_optimizer_[&optimizer];
  if (state.unscaled) {
    throw std::logic_error(
        "train::GradScaler::unscale_ was already called for this optimizer since the last "
        "update()");
  }
  const double inverse = 1.0 / scale_;
  // CUDA gradients are unscaled by one fused kernel that also records inf or
  // NaN, without a synchronisation per tensor; CPU ones one by one.
  std::vector<torch::Tensor> cuda_grads;
  bool found_on_cpu = false;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      auto& grad = param.mutable_grad();
      if (!grad.defined()) continue;
      if (grad.is_sparse()) {
        throw std::invalid_argument("train::GradScaler does not unscale sparse gradients");
      }
      if (grad.is_cuda()) {
        cuda_grads.push_back(grad);
      } else {
        grad.mul_(inverse);
        found_on_cpu = found_on_cpu || !torch::isfinite(grad).all().item<bool>();
      }
    }
  }
  // One element, where the group's collective takes it: on the GPU with CUDA gradients.
  torch::Tensor found =
      torch::zeros({1}, cuda_grads.empty() ? torch::TensorOptions()
                                           : cuda_grads[0].options().dtype(torch::kFloat32));
  if (!cuda_grads.empty()) {
    auto inverse_tensor = torch::full({1}, inverse, found.options());
    at::_amp_foreach_non_finite_check_and_unscale_(cuda_grads, found, inverse_tensor);
  }
  if (found_on_cpu) found.fill_(1);
  // Every rank skips the step if one found inf or NaN: gradients outside the
  // reducer (or accumulated without synchronisation) may differ by rank.
  if (const auto& group = options_.process_group(); group && group->getSize() > 1) {
    std::vector<torch::Tensor> tensors{found};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    group->allreduce(tensors, max)->wait();
  }
  state.found_inf = found.item<float>() > 0;
  state.unscaled = true;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return true;
  }
  auto& state = per_optimizer_[&optimizer];
  if (!state.unscaled) unscale_(optimizer);
  if (per_optimizer_[&optimizer].found_inf) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  bool found_inf = false;
  for (const auto& [optimizer, state] : per_optimizer_) found_inf = found_inf || state.found_inf;
  per_optimizer_.clear();
  if (found_inf) {
    scale_ *= options_.backoff_factor();
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= options_.growth_interval()) {
    scale_ *= options_.growth_factor();
    growth_tracker_ = 0;
  }
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", torch::tensor(scale_, torch::kFloat64));
  archive.write("growth_tracker", torch::tensor(growth_tracker_, torch::kInt64));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor scale, growth_tracker;
  archive.read("scale", scale);
  archive.read("growth_tracker", growth_tracker);
  scale_ = scale.item<double>();
  growth_tracker_ = growth_tracker.item<int64_t>();
}

void enable_reproducibility(uint64_t seed) {
  // Before CUDA starts: cuBLAS reads it when its handle is made.
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  torch::manual_seed(seed);  // the CPU generator and every CUDA device's
  auto& context = at::globalContext();
  context.setDeterministicAlgorithms(true, /*warn_only=*/false);
  context.setBenchmarkCuDNN(false);
  context.setDeterministicCuDNN(true);
}

}  // namespace train

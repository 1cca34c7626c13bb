#include <train/amp.h>
#include <train/torch_compat.h>

#include <ATen/autocast_mode.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/collectives.h"

namespace train {
namespace {

torch::Dtype checked_dtype(torch::DeviceType device, std::optional<torch::Dtype> dtype) {
  if (device != torch::kCPU && device != torch::kCUDA) {
    throw std::invalid_argument("train::Autocast: autocast on " +
                                c10::DeviceTypeName(device, /*lower_case=*/true) +
                                " is not supported; use torch::kCPU or torch::kCUDA");
  }
  // As Python: the type the thread's autocast already casts to on this device
  // (bfloat16 on CPU, float16 on CUDA unless a scope outside chose another).
  auto chosen = dtype.value_or(compat::autocast_dtype(device));
  if (chosen != torch::kBFloat16 && chosen != torch::kFloat16) {
    throw std::invalid_argument(std::string("train::Autocast: autocast casts to bfloat16 or "
                                            "float16, not ") +
                                c10::toString(chosen));
  }
  return chosen;
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
  if (!options_.process_group()) options_.process_group(detail::run_group_or_null());
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (!options_.enabled()) return loss;
  // In float32, as Python's float32 scale tensor promotes a half loss.
  const bool half = loss.scalar_type() == torch::kHalf || loss.scalar_type() == torch::kBFloat16;
  return (half ? loss.to(torch::kFloat32) : loss) * scale_;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) return;
  auto& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::kUnscaled) {
    throw std::logic_error(
        "train::GradScaler::unscale_ was already called for this optimizer since the last "
        "update()");
  }
  if (state.stage == Stage::kStepped) {
    throw std::logic_error("train::GradScaler::unscale_ called after step(); call update() first");
  }
  // Checked before any is touched: a refusal leaves every gradient as it was.
  std::vector<torch::Tensor> grads;
  // Where every rank keeps its finding for the allreduce: its first parameter's device.
  std::optional<torch::Device> device;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      if (!device) device = param.device();
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
      grads.push_back(grad);
    }
  }
  torch::NoGradGuard no_grad;
  // inv_scale as Python computes it: the double's reciprocal, in float32.
  const float inverse = static_cast<float>(1.0 / scale_);
  torch::Tensor found =
      torch::zeros({1}, torch::TensorOptions().device(device.value_or(torch::kCPU)));
  // CUDA gradients: one fused kernel per device unscales them and records inf
  // or NaN without a synchronisation per tensor. CPU ones one by one.
  std::unordered_map<torch::Device, std::vector<torch::Tensor>> by_device;
  for (auto& grad : grads) {
    if (grad.is_cuda()) {
      by_device[grad.device()].push_back(grad);
    } else {
      grad.mul_(inverse);
      if (!torch::isfinite(grad).all().item<bool>()) found.fill_(1);
    }
  }
  for (auto& [cuda, list] : by_device) {
    auto options = torch::TensorOptions().device(cuda).dtype(torch::kFloat32);
    auto found_here = torch::zeros({1}, options);
    at::_amp_foreach_non_finite_check_and_unscale_(list, found_here,
                                                   torch::full({1}, inverse, options));
    found = torch::maximum(found, found_here.to(found.device()));
  }
  // Every rank skips the step if one found inf or NaN: gradients outside the
  // reducer (or accumulated without synchronisation) may differ by rank.
  if (const auto& group = options_.process_group(); group && group->getSize() > 1) {
    std::vector<torch::Tensor> tensors{found};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    group->allreduce(tensors, max)->wait();
  }
  state.found_inf = found.item<float>() > 0;
  state.stage = Stage::kUnscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return true;
  }
  if (per_optimizer_[&optimizer].stage == Stage::kStepped) {
    throw std::logic_error(
        "train::GradScaler::step was already called for this optimizer since the last update()");
  }
  if (per_optimizer_[&optimizer].stage == Stage::kReady) unscale_(optimizer);
  auto& state = per_optimizer_[&optimizer];
  state.stage = Stage::kStepped;
  if (state.found_inf) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  if (per_optimizer_.empty()) {
    throw std::logic_error(
        "train::GradScaler::update: no step() or unscale_() since the last update(), so no "
        "inf checks were recorded");
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
  archive.write("scale", torch::tensor(scale_, torch::kFloat64));
  archive.write("growth_tracker", torch::tensor(growth_tracker_, torch::kInt64));
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
  per_optimizer_.clear();
}

void enable_reproducibility(uint64_t seed) {
  // Before CUDA starts: cuBLAS reads it when its handle is made. Only its two
  // deterministic values pass LibTorch's check; any other is replaced.
  const char* workspace = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  if (workspace == nullptr ||
      (std::string(workspace) != ":4096:8" && std::string(workspace) != ":16:8")) {
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/1);
  }
  torch::manual_seed(seed);  // the CPU generator and every CUDA device's
  auto& context = at::globalContext();
  context.setDeterministicAlgorithms(true, /*warn_only=*/false);
  context.setBenchmarkCuDNN(false);
  context.setDeterministicCuDNN(true);
}

}  // namespace train

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

#include "optim/tensor_lists.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <algorithm>
#include <array>

#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace train::optim::detail {
namespace {

// The schema names of the fused kernels. LibTorch 1.13 has only Adam's (for
// CUDA); AdamW's there is Adam's after a decoupled decay.
const char* schema_of(Fused fused) {
#if TORCH_VERSION_MAJOR >= 2
  switch (fused) {
    case Fused::kSGD: return "aten::_fused_sgd_";
    case Fused::kAdam: return "aten::_fused_adam_";
    case Fused::kAdamW: return "aten::_fused_adamw_";
  }
  return "";
#else
  return fused == Fused::kSGD ? "" : "aten::_fused_adam_";
#endif
}

bool lookup(Fused fused, c10::DispatchKey key) {
  const char* name = schema_of(fused);
  if (*name == '\0') return false;
  auto handle = c10::Dispatcher::singleton().findSchema({name, ""});
  return handle.has_value() && handle->hasKernelForDispatchKey(key);
}

}  // namespace

bool laid_out_alike(const torch::Tensor& param, std::initializer_list<torch::Tensor> with) {
  if (!param.is_non_overlapping_and_dense()) return false;
  // The stride of a dimension of size 1 is never stepped over: it may differ.
  auto same_strides = [&](const torch::Tensor& t) {
    for (int64_t d = 0; d < param.dim(); ++d) {
      if (param.size(d) > 1 && t.stride(d) != param.stride(d)) return false;
    }
    return true;
  };
  return std::all_of(with.begin(), with.end(), [&](const torch::Tensor& t) {
    return !t.defined() ||
           (t.layout() == torch::kStrided && t.scalar_type() == param.scalar_type() &&
            t.device() == param.device() && t.sizes() == param.sizes() && same_strides(t));
  });
}

TensorLists& lists_for(std::vector<TensorLists>& lists, const torch::Tensor& param, bool sparse) {
  for (auto& candidate : lists) {
    if (candidate.device == param.device() && candidate.dtype == param.scalar_type() &&
        candidate.sparse == sparse) {
      return candidate;
    }
  }
  lists.push_back(TensorLists{param.device(), param.scalar_type(), {}, {}, {}, {}, true, sparse});
  return lists.back();
}

bool has_fused(Fused fused, c10::DeviceType device_type) {
  // Filled once: the dispatcher's tables do not change after LibTorch loads.
  static const std::array<std::array<bool, 2>, 3> table = [] {
    std::array<std::array<bool, 2>, 3> found{};
    for (auto f : {Fused::kSGD, Fused::kAdam, Fused::kAdamW}) {
      found[static_cast<int>(f)] = {lookup(f, c10::DispatchKey::CPU),
                                    lookup(f, c10::DispatchKey::CUDA)};
    }
    return found;
  }();
  if (device_type == c10::DeviceType::CPU) return table[static_cast<int>(fused)][0];
  if (device_type == c10::DeviceType::CUDA) return table[static_cast<int>(fused)][1];
  return false;
}

Kernels path_for(Kernels asked, Fused fused, const TensorLists& lists) {
  if (asked == Kernels::kPerTensor || lists.sparse) return Kernels::kPerTensor;
  if (asked == Kernels::kForeach) return asked;
  const bool floating = lists.dtype == torch::kFloat || lists.dtype == torch::kDouble ||
                        lists.dtype == torch::kHalf || lists.dtype == torch::kBFloat16;
  // Automatically only on CUDA: elsewhere the fused kernels are not bit-equal
  // to torch::optim, which a one-line swap of optimizers should keep.
  const bool wanted = asked == Kernels::kFused || lists.device.is_cuda();
  if (wanted && floating && lists.alike && has_fused(fused, lists.device.type())) {
    return Kernels::kFused;
  }
  return Kernels::kForeach;
}

bool capturing([[maybe_unused]] const torch::Device& device) {
#ifdef USE_C10D_NCCL
  return device.is_cuda() &&
         c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#else
  return false;
#endif
}

void check_not_capturing(const torch::Tensor& param, const char* what) {
  TORCH_CHECK(!capturing(param.device()), "train::optim: ", what, " of a parameter of shape ",
              param.sizes(), " would be made inside a CUDA graph's capture, and made again at ",
              "every replay; warm up until every parameter has had a gradient");
}

void check_dense(const torch::Tensor& grad, const char* optimizer) {
  TORCH_CHECK(!grad.is_sparse(), optimizer, " does not support sparse gradients");
}

}  // namespace train::optim::detail

#pragma once

// What differs between the LibTorch lines trainrun builds against, in one
// place: 1.13 (Debian 12's libtorch-dev) and 2.6 or later (pip's torch wheels,
// pytorch.org's downloads, Debian 13). The SDK, the worker and the tests are
// written once, against what both lines share plus these few names.
//
// - From 2.0 a c10d::ProcessGroup is a front that dispatches each collective
//   to a c10d::Backend chosen by the tensors' device type; ProcessGroupGloo and
//   ProcessGroupNCCL are backends. In 1.13 they are process groups themselves.
//   From 2.6 a ProcessGroup is built from a store, a rank and a size (2.0 to
//   2.5 took options instead, and are refused here).
// - Autograd's nodes are std::shared_ptr in 1.13 and c10::intrusive_ptr in
//   later 2.x; NodePtr is whichever grad_accumulator returns.
// - ProcessGroup::alltoall_base became all_to_all_single (the old name is
//   deprecated in later 2.x).
// - c10::optional is std::optional from 2.x on; code written with c10::optional
//   (as a sampler's reset and next are) compiles on both.
// - Autocast's state is kept per device type in 2.x (is_autocast_enabled(type),
//   get_autocast_dtype(type)); 1.13 has a function per device (is_enabled for
//   CUDA, is_cpu_enabled, get_autocast_gpu_dtype, get_autocast_cpu_dtype).
// Header-only and free of state, so the SDK (inside each plugin) and the worker
// each get their own copy without sharing a symbol.

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL  // a LibTorch built with CUDA and NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/version.h>

#include <chrono>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 6
#error \
    "trainrun builds against LibTorch 1.13 or 2.6 and later; LibTorch 2.0 to 2.5 are not supported"
#endif

namespace train::compat {

/// What ProcessGroupGloo and ProcessGroupNCCL derive from: c10d::Backend from
/// LibTorch 2.0, c10d::ProcessGroup before.
#if TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif

/// An autograd node as grad_accumulator returns it (shared or intrusive).
using NodePtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

/// A backend and the device types whose tensors it takes.
struct BackendFor {
  c10::intrusive_ptr<Backend> backend;
  std::vector<c10::DeviceType> devices;
};

namespace detail {
template <typename Group, typename = void>
struct has_bound_device : std::false_type {};
template <typename Group>
struct has_bound_device<Group, std::void_t<decltype(std::declval<Group&>().setBoundDeviceId(
                                   std::declval<c10::Device>()))>> : std::true_type {};
}  // namespace detail

/// The process group over `store` that sends each collective to the backend
/// for its tensors' device type, as torch.distributed builds one; the first
/// backend is the default (its name is the group's). `bound_device`, where
/// given, is this rank's CUDA device, which NCCL then uses for collectives
/// without tensors (a barrier) instead of guessing from the rank, as
/// init_process_group(device_id=...) does. On 1.13 a process group has one
/// backend: the first is the group.
inline c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<BackendFor>& backends,
    c10::optional<c10::Device> bound_device = c10::nullopt) {
#if TORCH_VERSION_MAJOR >= 2
  const auto& first = backends.front().backend;
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, first->getRank(), first->getSize());
  if constexpr (detail::has_bound_device<c10d::ProcessGroup>::value) {
    if (bound_device) group->setBoundDeviceId(*bound_device);  // before the backends take it
  }
  group->setDefaultBackend(c10d::ProcessGroup::strToBackendType(first->getBackendName()));
  for (const auto& [backend, devices] : backends) {
    const auto type = c10d::ProcessGroup::strToBackendType(backend->getBackendName());
    for (auto device : devices) group->setBackend(device, type, backend);
  }
  return group;
#else
  (void)store;
  (void)bound_device;
  return backends.front().backend;
#endif
}

/// A Gloo backend of `size` ranks over `store`, listening on `device`, each
/// collective bounded by `timeout`.
inline c10::intrusive_ptr<Backend> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::shared_ptr<::gloo::transport::Device> device, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(std::move(device));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

/// A Gloo process group: CPU tensors, and CUDA tensors (staged through host
/// memory) where LibTorch was built with CUDA.
inline c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::shared_ptr<::gloo::transport::Device> device, std::chrono::milliseconds timeout) {
  return make_process_group(store,
                            {{make_gloo_backend(store, rank, size, std::move(device), timeout),
                              {c10::DeviceType::CPU, c10::DeviceType::CUDA}}});
}

#ifdef USE_C10D_NCCL
/// The process group of a GPU run, as torch.distributed's default on a GPU
/// machine: NCCL for CUDA tensors, Gloo (listening on `gloo_device`) for CPU
/// tensors such as metrics; each under its own prefix of `store`. Collectives
/// are bounded by `timeout` (NCCL's watchdog then aborts the process). On 1.13
/// NCCL alone: CPU tensors are refused there. Only where LibTorch was built
/// with NCCL; the NCCL communicator is made on `device` (this rank's) at the
/// first collective.
inline c10::intrusive_ptr<c10d::ProcessGroup> make_nccl_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, c10::Device device,
    std::shared_ptr<::gloo::transport::Device> gloo_device, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
      c10::make_intrusive<c10d::PrefixStore>("cuda/", store), rank, size, options);
  std::vector<BackendFor> backends{{nccl, {c10::DeviceType::CUDA}}};
#if TORCH_VERSION_MAJOR >= 2
  backends.push_back({make_gloo_backend(c10::make_intrusive<c10d::PrefixStore>("cpu/", store), rank,
                                        size, std::move(gloo_device), timeout),
                      {c10::DeviceType::CPU}});
#else
  (void)gloo_device;
#endif
  return make_process_group(store, backends, device);
}
#endif

namespace detail {
template <typename Group, typename = void>
struct has_all_to_all_single : std::false_type {};
template <typename Group>
struct has_all_to_all_single<
    Group, std::void_t<decltype(std::declval<Group&>().all_to_all_single(
               std::declval<at::Tensor&>(), std::declval<at::Tensor&>(),
               std::declval<std::vector<int64_t>&>(), std::declval<std::vector<int64_t>&>()))>>
    : std::true_type {};
}  // namespace detail

/// An alltoall of equal splits: rank r's piece i (of `input`, world x chunk)
/// lands as piece r of rank i's `output`. Asynchronous; wait on the work.
template <typename Group = c10d::ProcessGroup>
c10::intrusive_ptr<c10d::Work> alltoall_equal(Group& group, at::Tensor& output, at::Tensor& input) {
  std::vector<int64_t> output_split, input_split;  // empty: equal pieces
  if constexpr (detail::has_all_to_all_single<Group>::value) {
    return group.all_to_all_single(output, input, output_split, input_split);
  } else {
    return group.alltoall_base(output, input, output_split, input_split);
  }
}

/// Whether autocast is on for `device` (kCPU or kCUDA) on this thread.
inline bool autocast_enabled(c10::DeviceType device) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled()
                                        : at::autocast::is_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device, bool enabled) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
#endif
}

/// The type autocast casts to on `device` (kCPU or kCUDA) on this thread.
inline at::ScalarType autocast_dtype(c10::DeviceType device) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device, at::ScalarType dtype) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

}  // namespace train::compat

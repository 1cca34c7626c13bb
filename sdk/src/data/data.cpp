#include <train/data.h>
#include <train/distributed.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/catch_up.h"
#include "core/collectives.h"
#include "core/host.h"

namespace train {

DistributedSampler::DistributedSampler(size_t size, const Context& ctx, bool shuffle,
                                       bool allow_duplicates, uint64_t seed)
    : replicas_(static_cast<size_t>(ctx.world_size())),
      rank_(static_cast<size_t>(ctx.world_rank())),
      shuffle_(shuffle),
      allow_duplicates_(allow_duplicates),
      seed_(seed) {
  reset(size);
}

size_t DistributedSampler::local_size() const {
  // DistributedSampler's num_samples: rounded up with padding, down without.
  const size_t size = state_->size;
  return allow_duplicates_ ? (size + replicas_ - 1) / replicas_ : size / replicas_;
}

void DistributedSampler::reset(c10::optional<size_t> new_size) {
  auto& state = *state_;
  if (new_size) state.size = *new_size;
  const size_t size = state.size;
  const size_t local = local_size();
  // The whole range first, shuffled or not; then padded by wrapping round
  // (position i holds order[i % size]) or cut, to local x replicas positions.
  std::vector<int64_t> order;
  if (shuffle_ && size > 0) {
    auto generator = at::detail::createCPUGenerator(seed_ + state.epoch);
    auto permutation = torch::randperm(static_cast<int64_t>(size), generator, torch::kLong);
    const auto* values = permutation.data_ptr<int64_t>();
    order.assign(values, values + size);
  }
  auto at = [&](size_t position) {
    const size_t i = position % size;
    return order.empty() ? i : static_cast<size_t>(order[i]);
  };
  state.indices.clear();
  state.indices.reserve(local);
  for (size_t k = 0; k < local; ++k) {
    // Shuffled, every replicas-th position from rank on (PyTorch's stride);
    // in order, a contiguous block.
    state.indices.push_back(at(shuffle_ ? rank_ + k * replicas_ : rank_ * local + k));
  }
  state.position = 0;
  if (state.resume && state.resume->first == state.epoch) {
    state.position = std::min(state.resume->second, state.indices.size());
  }
  state.start = state.position;
  state.resume.reset();
  state.yielded.reset();
}

size_t DistributedSampler::resume_position() const {
  const auto& resume = state_->resume;
  return resume && resume->first == state_->epoch ? resume->second : 0;
}

void DistributedSampler::yielded(size_t samples) {
  auto& state = *state_;
  // Counted from where the epoch started: its first index, or a resumed position.
  state.yielded = std::min(state.yielded.value_or(state.start) + samples, state.indices.size());
}

c10::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  auto& state = *state_;
  if (state.position >= state.indices.size()) return c10::nullopt;
  const size_t end = std::min(state.indices.size(), state.position + batch_size);
  std::vector<size_t> batch(state.indices.begin() + static_cast<std::ptrdiff_t>(state.position),
                            state.indices.begin() + static_cast<std::ptrdiff_t>(end));
  state.position = end;
  return batch;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  // What the train function was handed: a loader's threads ask for more ahead.
  const size_t used = state_->yielded.value_or(state_->position);
  archive.write("sample_index_", torch::tensor(static_cast<int64_t>(used)), true);
  archive.write("epoch_", torch::tensor(static_cast<int64_t>(state_->epoch)), true);
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  auto value = torch::empty(1, torch::kInt64);
  archive.read("epoch_", value, true);
  state_->epoch = static_cast<size_t>(value.item<int64_t>());
  archive.read("sample_index_", value, true);
  const auto position = static_cast<size_t>(value.item<int64_t>());
  reset();
  state_->position = state_->start = std::min(position, state_->indices.size());
  // The loader resets the sampler as the epoch begins: the position holds then too.
  state_->resume = std::make_pair(state_->epoch, position);
}

TensorDataset::TensorDataset(torch::Tensor data, torch::Tensor target)
    : data_(std::move(data)), target_(std::move(target)) {
  if (!data_.defined() || !target_.defined() || data_.dim() == 0 || target_.dim() == 0) {
    throw std::invalid_argument(
        "train::TensorDataset: data and target must be tensors with a first dimension of samples");
  }
  if (data_.size(0) != target_.size(0)) {
    throw std::invalid_argument("train::TensorDataset: data has " + std::to_string(data_.size(0)) +
                                " samples but target has " + std::to_string(target_.size(0)));
  }
  if (data_.device() != target_.device()) {
    throw std::invalid_argument("train::TensorDataset: data is on " + data_.device().str() +
                                " but target on " + target_.device().str());
  }
}

torch::data::Example<> TensorDataset::get_batch(c10::ArrayRef<size_t> indices) {
  const auto n = static_cast<int64_t>(indices.size());
  auto index = torch::empty({n}, torch::kLong);
  auto* out = index.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (indices[static_cast<size_t>(i)] >= static_cast<size_t>(data_.size(0))) {
      throw std::out_of_range("train::TensorDataset: index " +
                              std::to_string(indices[static_cast<size_t>(i)]) + " of " +
                              std::to_string(data_.size(0)) + " samples");
    }
    out[i] = static_cast<int64_t>(indices[static_cast<size_t>(i)]);
  }
  // Detached: a batch carries no autograd history (and index_select_out
  // refuses a tensor that requires grad).
  auto gather = [&](const torch::Tensor& source) {
    const auto from = source.detach();
    if (!from.is_cpu()) return from.index_select(0, index.to(from.device(), /*non_blocking=*/true));
    auto sizes = from.sizes().vec();
    sizes[0] = n;
    auto batch = torch::empty(sizes, from.options().pinned_memory(pin_));
    torch::index_select_out(batch, from, 0, index);
    return batch;
  };
  return {gather(data_), gather(target_)};
}

size_t TensorDataset::nbytes() const { return data_.nbytes() + target_.nbytes(); }

TensorDataset TensorDataset::to(torch::Device device, double max_fraction) const {
  if (!(max_fraction > 0 && max_fraction <= 1)) {
    throw std::invalid_argument("train::TensorDataset::to: max_fraction must be in (0, 1], got " +
                                std::to_string(max_fraction));
  }
  if (device.is_cuda()) {
    // cudaMemGetInfo from the CUDA runtime LibTorch has loaded; the SDK links
    // no CUDA library of its own (it builds against CPU-only LibTorch too).
    using MemGetInfo = int (*)(size_t*, size_t*);
    auto mem_get_info = reinterpret_cast<MemGetInfo>(::dlsym(RTLD_DEFAULT, "cudaMemGetInfo"));
    size_t free = 0, total = 0;
    std::string why = "no CUDA runtime loaded";
    if (mem_get_info != nullptr) {
      try {
        c10::DeviceGuard guard(device);
        const int status = mem_get_info(&free, &total);
        why = status == 0 ? "" : "cudaMemGetInfo returned " + std::to_string(status);
      } catch (const c10::Error& e) {  // no such device
        why = e.what_without_backtrace();
        why = why.substr(0, why.find('\n'));
      }
    }
    if (!why.empty()) {
      throw std::runtime_error("train::TensorDataset::to: cannot tell the free memory of " +
                               device.str() + " (" + why + "), so the dataset is not moved there");
    }
    // What is on the device already takes no more of it.
    auto more = [&](const torch::Tensor& t) { return t.device() == device ? 0 : t.nbytes(); };
    const auto needed = static_cast<double>(more(data_) + more(target_));
    if (needed > max_fraction * static_cast<double>(free)) {
      throw std::runtime_error("train::TensorDataset::to: the dataset takes " +
                               std::to_string(static_cast<size_t>(needed) >> 20) +
                               " MiB more, more than " + std::to_string(max_fraction) + " of the " +
                               std::to_string(free >> 20) + " MiB free on " + device.str() +
                               "; keep it in host memory (the loader pins and copies batches)");
    }
  }
  return TensorDataset(data_.to(device), target_.to(device));
}

namespace detail {
namespace {

// A batch made on stream `from` to be used on `to`: `to` waits for what
// `from` queued so far, and the caching allocator does not hand the batch's
// memory out again before what `to` queues with it is done.
void hand_over(const torch::data::Example<>& batch, const c10::Stream& from,
               const c10::Stream& to) {
  c10::Event made(from.device_type());
  made.record(from);
  made.block(to);
  for (const auto* tensor : {&batch.data, &batch.target}) {
    if (tensor->defined() && tensor->is_cuda()) tensor->record_stream(to);
  }
}

}  // namespace

torch::data::Example<> to_device(const torch::data::Example<>& batch, c10::Device device) {
  if (device.type() != c10::DeviceType::CUDA) {
    return {batch.data.to(device, /*non_blocking=*/true),
            batch.target.to(device, /*non_blocking=*/true)};
  }
  const c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream compute = impl.getStream(device);
  if (batch.data.device() == device && batch.target.device() == device) {
    // Resident: gathered on the device by a loader thread, on its current
    // stream, the device's default one (loader threads never change it);
    // without loader threads, on this thread's own stream, which then waits
    // needlessly (but briefly) for the default one. A loop on another stream
    // waits for the gather, and the allocator keeps the batch's memory until
    // that stream is done with it.
    const c10::Stream gathered_on = impl.getDefaultStream(device);
    if (compute != gathered_on) hand_over(batch, gathered_on, compute);
    return batch;
  }
  // One copy stream per device for the thread that trains.
  thread_local std::map<c10::DeviceIndex, c10::Stream> copy_streams;
  auto it = copy_streams.find(device.index());
  if (it == copy_streams.end()) {
    it = copy_streams.emplace(device.index(), impl.getStreamFromGlobalPool(device)).first;
  }
  const c10::Stream copy = it->second;
  torch::data::Example<> moved;
  {
    // The batch's device memory is allocated for the copy stream, and its
    // pinned source is kept until the copy is done (PyTorch's pinned-memory
    // allocator records the copy on this stream).
    const c10::StreamGuard on_copy(copy);
    moved = {batch.data.to(device, /*non_blocking=*/true),
             batch.target.to(device, /*non_blocking=*/true)};
  }
  hand_over(moved, copy, compute);
  return moved;
}

namespace {

// Every rank's `value` and world rank, by group rank (after a recovery in
// place the group's ranks are not the world's); none without a group or on a
// replacement before it caught up (the others checked theirs, and are in
// their loop). A collective: one allgather of 16 bytes per rank.
std::vector<std::pair<int64_t, int64_t>> gather_values(int64_t value) {
  auto ctx = get_context();
  if (catching_up()) return {};
  auto group = current_membership().group;
  if (!group) return {};
  auto mine = torch::tensor({value, static_cast<int64_t>(ctx.world_rank())}, torch::kLong)
                  .to(ctx.device());
  std::vector<std::pair<int64_t, int64_t>> values;
  // A rank lost meanwhile: the survivors check again, in their group.
  run_surviving([&](c10d::ProcessGroup& survivors) {
    values.clear();
    for (const auto& t : allgather(survivors, mine)) {
      values.emplace_back(t[0].item<int64_t>(), t[1].item<int64_t>());
    }
  });
  return values;
}

// The first group rank whose value differs from the first's (0: none), and
// the world ranks of all that differ.
std::pair<size_t, std::string> differing(const std::vector<std::pair<int64_t, int64_t>>& values) {
  std::string others;
  size_t first = 0;
  for (size_t r = 1; r < values.size(); ++r) {
    if (values[r].first == values[0].first) continue;
    if (first == 0) first = r;
    others += (others.empty() ? "" : ", ") + std::to_string(values[r].second);
  }
  return {first, others};
}

}  // namespace

void check_same_dataset_size(size_t size, const char* caller) {
  const auto sizes = gather_values(static_cast<int64_t>(size));
  const auto [first, others] = differing(sizes);
  if (first == 0) return;
  const auto rank = [&](size_t r) { return "rank " + std::to_string(sizes[r].second); };
  throw std::runtime_error(std::string(caller) + ": the dataset has " +
                           std::to_string(sizes[0].first) + " samples on " + rank(0) + " and " +
                           std::to_string(sizes[first].first) + " on " + rank(first) +
                           " (ranks whose size differs from " + rank(0) + "'s: " + others +
                           "). Every rank must pass the same dataset: the ranks split it by its "
                           "size, so different sizes skip or repeat samples");
}

void check_same_on_every_rank(int64_t value, const char* caller, const std::string& what) {
  const auto values = gather_values(value);
  const auto [first, others] = differing(values);
  if (first == 0) return;
  throw std::runtime_error(std::string(caller) + ": " + what + " (rank " +
                           std::to_string(values[0].second) + " and ranks " + others + ")");
}

}  // namespace detail
}  // namespace train

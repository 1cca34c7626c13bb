#include "core/collectives.h"

#include <cstring>

#include "core/host.h"

namespace train::detail {

c10::intrusive_ptr<c10d::ProcessGroup> run_group_or_null() { return current_membership().group; }

void allreduce_surviving(torch::Tensor& tensor, const c10d::AllreduceOptions& options) {
  auto membership = current_membership();
  if (!membership.group) return;
  if (!recovers_in_place()) {
    std::vector<torch::Tensor> tensors{tensor};
    membership.group->allreduce(tensors, options)->wait();
    return;
  }
  const int64_t step = next_synchronised_step();
  while (true) {
    // A copy per try: a collective of an ended group may still write into its own.
    std::vector<torch::Tensor> tensors{tensor.clone()};
    bool completed = false;
    try {
      auto work = membership.group->allreduce(tensors, options);
      completed = wait_unless_group_ended(*work, membership.generation);
    } catch (const std::exception&) {  // a group whose peer is gone refuses to start one
    }
    if (completed && vote_step(step, membership.generation)) {
      tensor.copy_(tensors[0]);
      return;
    }
    membership = regroup_after(membership.generation);
  }
}

void run_collective(const std::function<c10::intrusive_ptr<c10d::Work>()>& launch) {
  if (!recovers_in_place()) {
    launch()->wait();
    return;
  }
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = launch();
  } catch (const std::exception&) {  // a group whose peer is gone refuses to start one
    throw GroupEnded();
  }
  if (!wait_unless_group_ended(*work, current_membership().generation)) throw GroupEnded();
}

void run_surviving(const std::function<void(c10d::ProcessGroup&)>& collectives) {
  auto membership = current_membership();
  if (!membership.group) return;
  if (!recovers_in_place()) {
    collectives(*membership.group);
    return;
  }
  const int64_t step = next_synchronised_step();
  while (true) {
    bool completed = false;
    try {
      collectives(*membership.group);
      completed = true;
    } catch (const GroupEnded&) {
    }
    if (completed && vote_step(step, membership.generation)) return;
    membership = regroup_after(membership.generation);
  }
}

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

std::vector<torch::Tensor> allgather(c10d::ProcessGroup& group, const torch::Tensor& mine) {
  std::vector<std::vector<torch::Tensor>> outputs(1);
  for (int rank = 0; rank < group.getSize(); ++rank) outputs[0].push_back(torch::empty_like(mine));
  std::vector<torch::Tensor> inputs{mine};
  run_collective([&] { return group.allgather(outputs, inputs); });
  std::vector<torch::Tensor> gathered;
  for (const auto& t : outputs[0]) gathered.push_back(t.cpu());
  return gathered;
}

std::optional<std::vector<std::string>> texts_if_different(c10d::ProcessGroup& group,
                                                           torch::Device device,
                                                           const std::string& text) {
  auto digest = torch::tensor(
      {static_cast<int64_t>(fnv1a(text)), static_cast<int64_t>(text.size())}, torch::kLong);
  auto digests = allgather(group, digest.to(device));
  bool differ = false;
  int64_t longest = 0;
  for (const auto& d : digests) {
    differ = differ || !torch::equal(d, digests[0]);
    longest = std::max(longest, d[1].item<int64_t>());
  }
  if (!differ) return std::nullopt;
  // Every rank takes the slow path together: the texts themselves.
  auto padded = torch::zeros({std::max<int64_t>(longest, 1)}, torch::kByte);
  std::memcpy(padded.data_ptr(), text.data(), text.size());
  auto texts = allgather(group, padded.to(device));
  std::vector<std::string> result;
  for (size_t rank = 0; rank < texts.size(); ++rank) {
    const auto* bytes = static_cast<const char*>(texts[rank].data_ptr());
    result.emplace_back(bytes, static_cast<size_t>(digests[rank][1].item<int64_t>()));
  }
  return result;
}

}  // namespace train::detail

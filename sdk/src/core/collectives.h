#pragma once

// Small collectives the SDK's checks share: an allgather to the CPU, and the
// check that every rank holds the same text (a digest first, the texts only
// when they differ), so that a mismatch fails on every rank with the same
// error instead of hanging one. Stateless; every rank calls them in the same
// order on a process group.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace train::detail {

/// The run's process group inside a train function of more than one worker;
/// null otherwise.
c10::intrusive_ptr<c10d::ProcessGroup> run_group_or_null();

/// An allreduce of `tensor` in place that survives a lost rank (in-place
/// recovery): it runs on a copy, is applied once every rank voted that its
/// copy completed, and otherwise runs again in the survivors' group. Without
/// recovery, a plain allreduce. On the current group of the running entry.
void allreduce_surviving(torch::Tensor& tensor, const c10d::AllreduceOptions& options = {});

/// A collective that ended with its group (in-place recovery): a peer was
/// lost. run_surviving does the collectives again in the survivors' group.
struct GroupEnded : std::runtime_error {
  GroupEnded() : std::runtime_error("a rank of the group was lost") {}
};

/// Starts a collective with `launch` and waits for it; with in-place
/// recovery in slices, throwing GroupEnded when its group ends under it.
void run_collective(const std::function<c10::intrusive_ptr<c10d::Work>()>& launch);

/// Runs `collectives` (read-only ones, such as a check) on the current group;
/// with in-place recovery, once every rank voted they completed, and again in
/// the survivors' group when a rank was lost. Errors of their own propagate.
void run_surviving(const std::function<void(c10d::ProcessGroup&)>& collectives);

/// FNV-1a, 64 bits: a digest to compare texts across ranks (not a defence).
uint64_t fnv1a(const std::string& text);

/// Every rank's `mine` (the same shape on every rank), on the CPU, by rank.
/// A collective.
std::vector<torch::Tensor> allgather(c10d::ProcessGroup& group, const torch::Tensor& mine);

/// Nothing when every rank passes the same `text`; otherwise every rank's
/// text, by rank, on every rank. One allgather of 16 bytes per rank when they
/// agree, a second of the longest text when not. Collective tensors live on
/// `device` (a CUDA device for NCCL).
std::optional<std::vector<std::string>> texts_if_different(c10d::ProcessGroup& group,
                                                           torch::Device device,
                                                           const std::string& text);

}  // namespace train::detail

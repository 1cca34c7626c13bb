#pragma once

// The worker's train thread: loads the plugin, joins the process group and
// calls the entry. It has its own DEALER to the controller, opened with ATTACH,
// for everything the train function says and waits for (REPORT and its
// acknowledgement, checkpoint uploads and fetches; DONE or FAILED at the end):
// a report goes straight to the controller, not through the worker's main
// thread. The process group's store is the controller's (controller_store.h),
// on a third connection. This is the one file of the worker that includes
// LibTorch's distributed headers.

#include <zmq.hpp>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "protocol/messages.h"
#include "worker/worker.h"

namespace trainrun {

/// The groups the controller announces while the train function runs
/// (PEER_LOST, in-place recovery): written by the worker's main thread, read
/// by the train thread when its collectives fail or its step is voted down;
/// a group with a replacement is written by the train thread itself, from
/// the vote that announced it, once it reaches the step boundary.
class GroupAnnouncements {
 public:
  /// A generation and its members' world ranks, by group rank.
  using Group = std::pair<int64_t, std::vector<int32_t>>;

  void announce(int64_t generation, std::vector<int32_t> ranks) {
    std::lock_guard lock(mutex_);
    if (generation <= generation_) return;  // late or repeated
    ranks_ = std::move(ranks);
    generation_ = generation;
  }
  /// The newest generation announced; 0 before any.
  int64_t generation() const { return generation_; }
  Group newest() const {
    std::lock_guard lock(mutex_);
    return {generation_, ranks_};
  }

 private:
  mutable std::mutex mutex_;
  std::atomic<int64_t> generation_{0};
  std::vector<int32_t> ranks_;
};

/// Runs the assigned entry to completion on the calling thread, connected to
/// the controller as `options` say; always ends by sending DONE or FAILED.
/// `returned` is set once the entry has returned (or could not be called).
void run_train_thread(zmq::context_t& context, const WorkerOptions& options,
                      const protocol::Assign& assign, const std::filesystem::path& plugin_path,
                      std::atomic<bool>& returned, GroupAnnouncements& groups);

}  // namespace trainrun

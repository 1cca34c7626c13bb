#pragma once

// Asynchronous checkpoint uploads (train::CheckpointUploadMode::kAsync). The
// train thread hands a checkpoint directory over (hand_over_checkpoint: it is
// renamed out of the caller's way at once), lists it, queues it here and sends
// its REPORT; the report is acknowledged once every rank has done the same,
// while this thread uploads it on a connection of its own (ATTACH with channel
// "upload") exactly as a synchronous upload does (upload_checkpoint), then
// deletes it. The controller commits once every rank's upload is in, and holds
// the next checkpointing REPORT until then, so at most one checkpoint is in
// flight per run (two queued here for a moment at most).
//
// The thread runs at a lower CPU priority (kUploadNice): where training keeps
// every core busy, the copy and its hashing take the time it leaves.

#include <zmq.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "protocol/messages.h"
#include "worker/checkpoint_handover.h"
#include "worker/worker.h"

namespace trainrun {

/// The nice value the upload thread adds to its own.
inline constexpr int kUploadNice = 10;

class CheckpointUploader {
 public:
  /// Starts the thread, which connects and attaches to the controller.
  CheckpointUploader(zmq::context_t& context, const WorkerOptions& options,
                     protocol::Attach attach);
  /// Stops the thread (an upload under way stops at its next wait for the
  /// controller) and deletes what it was given and did not upload.
  ~CheckpointUploader();
  CheckpointUploader(const CheckpointUploader&) = delete;
  CheckpointUploader& operator=(const CheckpointUploader&) = delete;

  /// Queues the upload of a handed-over directory, as the REPORT of
  /// `iteration` lists it.
  void submit(int64_t iteration, std::filesystem::path dir,
              std::vector<protocol::CheckpointFile> files);
  /// Throws Error when an upload failed here (the controller already knows
  /// of one that failed on storage).
  void check();
  /// Waits until every queued upload is done; throws as check() does.
  void wait();

 private:
  struct Job {
    int64_t iteration = 0;
    std::filesystem::path dir;
    std::vector<protocol::CheckpointFile> files;
  };
  void run(zmq::context_t& context, const WorkerOptions& options, protocol::Attach attach);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> jobs_;  // the first is being uploaded
  std::string error_;     // why an upload failed here, or empty
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace trainrun

// Checkpoints, as the controller handles them: a report's checkpoint answered
// with UPLOAD, its chunks and UPLOADED, the commit (at once for a synchronous
// checkpoint, after the report for an asynchronous one, whose later reports
// wait for it), the regroup an elastic run makes at a commit, and the
// checkpoint to resume from served to workers that cannot see the storage.

#include <trainrun/error.h>

#include <algorithm>

#include "controller/controller.h"

namespace trainrun {

// This report's checkpoint is asynchronous when the attempt's async checkpoint
// exists (not yet released), synchronous when something is staged without it.
bool Controller::begin_upload(WorkerSlot& worker, const protocol::Report& report) {
  auto& async_checkpoint = attempt_->async_checkpoint;
  const bool async = async_checkpoint.has_value();
  if (report.async ? checkpoints_.staging() && !async : async) {
    fail(worker, FailureKind::kUsage,
         "rank " + std::to_string(worker.rank) + " passed its checkpoint with upload mode " +
             (report.async ? "async" : "sync") + " where another rank passed " +
             (report.async ? "sync" : "async") +
             ": every rank must pass the same train::CheckpointUploadMode");
    return false;
  }
  try {
    auto upload = checkpoints_.begin_upload(worker.rank, report.iteration, report.files,
                                            /*stream=*/worker.remote && !worker.shares_storage);
    if (report.async) {
      if (!async_checkpoint) async_checkpoint.emplace();
      send_async_upload(worker, upload);
    } else {
      to_train(worker, upload);
    }
  } catch (const UsageError& e) {
    fail(worker, FailureKind::kUsage, e.what());
    return false;
  } catch (const IoError& e) {
    abort_upload(e.what());
    return false;
  }
  return true;
}

void Controller::send_async_upload(const WorkerSlot& worker, const protocol::Upload& upload) {
  if (worker.upload_id) {
    protocol::send(router_, upload, {}, *worker.upload_id);
  } else {
    attempt_->owed_uploads[worker.rank] = upload;
  }
}

void Controller::on_upload_chunk(WorkerSlot& worker, protocol::Incoming& message,
                                 bool upload_channel) {
  if (!records()) return;
  if (upload_channel != attempt_->async_checkpoint.has_value()) {
    throw ProtocolError("UPLOAD_CHUNK on the wrong connection");
  }
  const bool written = upload_step(worker, [&] {
    auto chunk = message.as<protocol::UploadChunk>();
    if (message.blobs().size() != 1) throw ProtocolError("UPLOAD_CHUNK without its bytes");
    checkpoints_.write_chunk(worker.rank, chunk, message.blobs()[0]);
  });
  if (!written) return;
  protocol::send(router_, protocol::UploadCredit{1}, {},
                 upload_channel ? worker.upload_id : worker.train_id);
}

// An upload that goes wrong ends: nothing else would end the wait for it.
bool Controller::upload_step(const WorkerSlot& worker, const std::function<void()>& step) {
  try {
    step();
    return true;
  } catch (const ProtocolError& e) {
    abort_upload(worker.describe() + ": " + e.what());
  } catch (const IoError& e) {
    abort_upload(e.what());
  }
  return false;
}

void Controller::on_uploaded(WorkerSlot& worker, const protocol::Uploaded& uploaded,
                             bool upload_channel) {
  if (!records()) return;
  if (!uploaded.error.empty()) {  // whatever the state, the worker's reason is the one to keep
    abort_upload(uploaded.error);
    return;
  }
  if (upload_channel != attempt_->async_checkpoint.has_value()) {
    throw ProtocolError("UPLOADED on the wrong connection");
  }
  if (!upload_step(worker, [&] { checkpoints_.finish_upload(worker.rank, uploaded); })) return;
  if (attempt_->async_checkpoint) {
    commit_async_checkpoint();
  } else {
    release_report();
  }
}

void Controller::commit_async_checkpoint() {
  auto& attempt = *attempt_;
  if (!attempt.async_checkpoint || !attempt.async_checkpoint->released ||
      checkpoints_.uploading()) {
    return;
  }
  auto pending = std::move(*attempt.async_checkpoint);
  attempt.async_checkpoint.reset();
  if (!commit_async(pending)) return;
  // The reports with a checkpoint that waited for this commit.
  auto deferred = std::move(attempt.deferred_reports);
  attempt.deferred_reports.clear();
  for (const auto& [rank, report] : deferred) {
    WorkerSlot* worker = pool().at_rank(rank);
    if (worker == nullptr) continue;
    try {
      on_report(*worker, report);
    } catch (const ProtocolError& e) {
      log_.warn("dropped a message from {}: {}", worker->describe(), e.what());
    }
  }
}

bool Controller::commit_async(const Attempt::AsyncCheckpoint& pending) {
  std::string name;
  try {
    name = commit_unless_lacking(pending.iteration, pending.metrics, pending.absent);
  } catch (const IoError& e) {
    fail_storage(std::string("checkpoint commit failed: ") + e.what());
    return false;
  }
  if (name.empty()) return true;  // dropped
  try {
    storage_.append_checkpoint(pending.iteration, name, unix_time());
  } catch (const IoError& e) {
    fail_storage(name + " is committed, but result.jsonl cannot record it: " + e.what());
    return false;
  }
  log_.info("{} committed: the checkpoint of report {}, {:.1f} s after it", name, pending.iteration,
            std::chrono::duration<double>(now() - pending.reported).count());
  if (setup_.on_checkpoint) setup_.on_checkpoint(*checkpoints_.latest());
  maybe_regroup(name);
  return true;
}

std::vector<int> Controller::absent_ranks() const {
  const auto& members = attempt_->members;
  std::vector<int> absent;
  for (int rank = 0; rank < world_size(); ++rank) {
    if (std::find(members.begin(), members.end(), rank) == members.end()) absent.push_back(rank);
  }
  return absent;
}

// A checkpoint is the files of every rank that passed one: a train function
// saves on rank 0 alone, or a shard on each rank (train::Trainer's rank-<r>.pt).
// One reported while a rank that writes is lost lacks that rank's files, and
// a restart from it would resume without them. Which ranks write is what the
// last checkpoint of the whole group shows; before one, any rank might.
std::optional<bool> Controller::writes_checkpoints(int rank) const {
  if (writers_world_ == 0 || writers_world_ != world_size()) return std::nullopt;
  return std::find(checkpoint_writers_.begin(), checkpoint_writers_.end(), rank) !=
         checkpoint_writers_.end();
}

std::string Controller::commit_unless_lacking(int64_t iteration, const nlohmann::json& metrics,
                                              const std::vector<int>& absent) {
  if (!checkpoints_.staging()) return "";
  const auto staged = checkpoints_.staged_ranks();
  // Before a checkpoint of the whole group shows which ranks write, this one
  // tells the pattern: where a present rank other than rank 0 wrote files,
  // every rank writes a shard; otherwise rank 0 alone saves.
  const bool shards = std::any_of(staged.begin(), staged.end(), [](int rank) { return rank != 0; });
  std::vector<int> lacking;
  for (int rank : absent) {
    if (writes_checkpoints(rank).value_or(rank == 0 || shards)) lacking.push_back(rank);
  }
  if (!lacking.empty()) {
    drop_checkpoint(iteration, lacking);
    // A rank whose replacement is not on its way leaves no checkpoint whole
    // for the rest of the attempt: the group restarts from the latest.
    auto& attempt = *attempt_;
    for (int rank : lacking) {
      const bool coming = attempt.replacement && attempt.replacement->rank == rank;
      const auto loss = attempt.losses.find(rank);
      if (!coming && loss != attempt.losses.end()) {
        restart_without_writer(rank, loss->second, "could not come");
        break;
      }
    }
    return "";
  }
  auto name = checkpoints_.commit(iteration, metrics);
  if (absent.empty()) {
    // Every rank that ever wrote, at this world size: one that writes every
    // few checkpoints only still writes.
    if (writers_world_ != world_size()) checkpoint_writers_.clear();
    for (int rank : staged) {
      if (std::find(checkpoint_writers_.begin(), checkpoint_writers_.end(), rank) ==
          checkpoint_writers_.end()) {
        checkpoint_writers_.push_back(rank);
      }
    }
    writers_world_ = world_size();
  }
  return name;
}

void Controller::drop_checkpoint(int64_t iteration, const std::vector<int>& lacking) {
  checkpoints_.abort();
  const auto latest = checkpoints_.latest_name();
  std::string ranks;
  for (int rank : lacking) ranks += (ranks.empty() ? "" : ", ") + std::to_string(rank);
  const int first = lacking.front();
  const char* why = writes_checkpoints(first).has_value()
                        ? "which wrote into a checkpoint of the whole group"
                    : first == 0 ? "which saves the checkpoints"
                                 : "which, as the other ranks' files show, writes a shard too";
  log_.warn(
      "the checkpoint of report {} is not kept: it lacks the files of {} {}, lost and not "
      "replaced yet, {} (the latest is {})",
      iteration, lacking.size() == 1 ? "rank" : "ranks", ranks, why,
      latest.empty() ? "none" : latest);
}

// The worker waits for every answer here, so whatever goes wrong fails the run
// rather than leaving it waiting.
void Controller::on_fetch_checkpoint(WorkerSlot& worker, const protocol::FetchCheckpoint& fetch) {
  try {
    to_train(worker, checkpoints_.listing(fetch));
  } catch (const IoError& e) {
    fail(worker, FailureKind::kStorage,
         std::string("cannot send the checkpoint to resume from: ") + e.what());
  }
}

void Controller::on_fetch_chunk(WorkerSlot& worker, const protocol::FetchChunk& fetch) {
  try {
    auto [chunk, bytes] = checkpoints_.read_chunk(fetch);
    std::vector<zmq::message_t> blob;
    blob.push_back(std::move(bytes));
    to_train(worker, chunk, std::move(blob));
  } catch (const IoError& e) {
    fail(worker, FailureKind::kStorage,
         std::string("cannot send the checkpoint to resume from: ") + e.what());
  }
}

void Controller::maybe_regroup(const std::string& checkpoint) {
  if (phase_ == RunPhase::kTraining && !checkpoint.empty() && world_size() < max_workers() &&
      std::any_of(agents_.begin(), agents_.end(),
                  [](const auto& entry) { return entry.second.waiting; })) {
    enter(RunPhase::kRegrouping);
  }
}

}  // namespace trainrun

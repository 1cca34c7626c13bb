#pragma once

// The controller's side of checkpoints, over CheckpointStore: it answers a
// REPORT that carries a checkpoint with UPLOAD (copy into the staging
// directory, or stream it here), writes streamed chunks, checks each rank's
// UPLOADED, commits once the report completes, and serves the checkpoint to
// resume from to workers that cannot see the storage (FETCH_CHECKPOINT and
// FETCH_CHUNK). It decides and answers; the controller sends. Owned by the
// controller's thread.

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "controller/checkpoint_store.h"
#include "protocol/messages.h"
#include "transfer/chunk_pull.h"

namespace trainrun {

class CheckpointService {
 public:
  /// `resume_from`: the checkpoint the run starts from when it has none of its
  /// own (empty: none); with `resume_from_first`, until it commits one of its
  /// own after now. `always_stream`: every worker streams its files, and
  /// fetches the checkpoint it resumes from, through the controller.
  CheckpointService(CheckpointStore& store, const std::filesystem::path& resume_from,
                    bool resume_from_first, bool always_stream);

  /// The checkpoint every worker resumes from (empty: none): the run's latest,
  /// else `resume_from`.
  const std::filesystem::path& resume_dir() const { return resume_dir_; }
  /// A new attempt: drops what a failed one left staged, and resumes from the
  /// latest checkpoint committed by now.
  void begin_attempt(int attempt);
  /// The latest committed checkpoint.
  std::optional<CheckpointInfo> latest() const { return store_.latest(); }
  /// The latest committed checkpoint's name, or empty.
  std::string latest_name() const {
    auto latest = store_.latest();
    return latest ? latest->name : "";
  }
  /// Whether workers stream their files rather than copy them into storage.
  /// Local workers share the controller's filesystem, so only when asked to.
  bool streams() const { return always_stream_; }

  /// A rank's REPORT of `iteration` with these files: makes room for them and
  /// returns the UPLOAD answer. Throws UsageError for a name the rank may not
  /// use, Error when storage fails; then nothing stays staged.
  /// `stream`: this rank streams its files whatever the run's setting (it
  /// does not share the storage's filesystem).
  protocol::Upload begin_upload(int rank, int64_t iteration,
                                const std::vector<protocol::CheckpointFile>& files,
                                bool stream = false);
  /// A streamed chunk. Throws ProtocolError out of order, IoError when it
  /// cannot be written.
  void write_chunk(int rank, const protocol::UploadChunk& chunk, const zmq::message_t& bytes);
  /// A rank's UPLOADED. Throws IoError when its upload failed or its files are
  /// not whole, ProtocolError when they are not the files announced.
  void finish_upload(int rank, const protocol::Uploaded& uploaded);
  /// Whether some rank's files are staged (or being uploaded) for the next commit.
  bool staging() const { return store_.staging(); }
  /// Whether some rank's upload has begun and not ended.
  bool uploading() const { return store_.uploading(); }
  /// The ranks whose files are staged (or being uploaded).
  std::vector<int> staged_ranks() const { return store_.staged_ranks(); }
  /// Commits what was staged for the report of `iteration`, if anything; the
  /// checkpoint's name or empty. Throws IoError; then nothing stays staged.
  std::string commit(int64_t iteration, const nlohmann::json& metrics);
  /// Drops what was staged.
  void abort() { store_.abort_staging(); }

  /// The answer to FETCH_CHECKPOINT. Throws Error when it names another
  /// checkpoint or the manifest cannot be read.
  protocol::CheckpointListing listing(const protocol::FetchCheckpoint& fetch);
  /// The answer to a FETCH_CHUNK of it. Throws ProtocolError when out of range
  /// or before a listing, IoError when a file cannot be read.
  std::pair<protocol::Chunk, zmq::message_t> read_chunk(const protocol::FetchChunk& fetch) const;

 private:
  // The run's latest checkpoint, else resume_from.
  std::filesystem::path own_latest() const;

  CheckpointStore& store_;
  std::filesystem::path resume_from_;
  // The run's own checkpoints count from after this iteration.
  int64_t own_after_ = -1;
  std::filesystem::path resume_dir_;
  bool always_stream_;
  std::optional<ChunkSource> resume_source_;  // once a worker asked for the listing
};

}  // namespace trainrun

#pragma once

// The one way bytes are downloaded from the controller: the worker pulls each
// chunk (FETCH_CHUNK) with at most a credit's worth in flight, and the
// controller answers each with a CHUNK in the order asked (the zguide's
// credit-based file transfer). Used for the plugin and for the checkpoint a
// worker resumes from. ChunkFetcher is the worker's bookkeeping, ChunkSource the
// controller's; neither touches a socket. Each has one owner; not thread-safe.

#include <zmq.hpp>

#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/constants.h"
#include "protocol/messages.h"

namespace trainrun {

class ChunkFetcher {
 public:
  /// Fetches files of these sizes from `source`, in order, `chunk_size` bytes
  /// per request and at most `credit` requests unanswered.
  ChunkFetcher(std::string source, std::vector<uint64_t> sizes, size_t chunk_size = kChunkSize,
               int credit = kChunkCredit);

  /// The requests that may go out now; send them in this order.
  std::vector<protocol::FetchChunk> requests();
  /// Checks that `chunk`, carrying `size` bytes, is the answer to the oldest
  /// request unanswered. Returns its file index. Throws ProtocolError otherwise.
  uint32_t accept(const protocol::Chunk& chunk, size_t size);
  /// Whether every byte has arrived.
  bool complete() const { return received_ == total_; }

 private:
  std::string source_;
  std::vector<uint64_t> sizes_;
  size_t chunk_size_;
  int credit_;
  std::deque<protocol::FetchChunk> in_flight_;  // oldest first
  uint32_t next_file_ = 0;
  uint64_t next_offset_ = 0;
  uint64_t received_ = 0;
  uint64_t total_ = 0;
};

class ChunkSource {
 public:
  /// Serves `bytes` as file 0 (a plugin, kept in memory as it was verified).
  /// Chunks point into it rather than copy it: a thousand workers fetching at
  /// once hold one copy, which lives until the last chunk is sent.
  static ChunkSource from_memory(std::string source, std::shared_ptr<const std::string> bytes);
  /// Serves the files under `dir`, by index, at the sizes given.
  static ChunkSource from_files(std::string source, std::filesystem::path dir,
                                std::vector<protocol::CheckpointFile> files);

  /// The answer to `fetch`: the CHUNK and its bytes. Throws ProtocolError when
  /// it asks for another source or for bytes out of range, IoError when a file
  /// cannot be read whole.
  std::pair<protocol::Chunk, zmq::message_t> read(const protocol::FetchChunk& fetch) const;

 private:
  ChunkSource() = default;
  std::string source_;
  std::shared_ptr<const std::string> memory_;
  std::filesystem::path dir_;
  std::vector<protocol::CheckpointFile> files_;
  size_t chunk_size_ = kChunkSize;
};

}  // namespace trainrun

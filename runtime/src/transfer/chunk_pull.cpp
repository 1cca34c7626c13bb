#include "transfer/chunk_pull.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/atomic_file.h"

namespace trainrun {

ChunkFetcher::ChunkFetcher(std::string source, std::vector<uint64_t> sizes, size_t chunk_size,
                           int credit)
    : source_(std::move(source)), sizes_(std::move(sizes)), chunk_size_(chunk_size),
      credit_(credit) {
  TRAINRUN_CHECK(chunk_size_ > 0 && credit_ > 0, "a chunk fetcher needs a size and a credit");
  for (auto size : sizes_) total_ += size;
  while (next_file_ < sizes_.size() && sizes_[next_file_] == 0) ++next_file_;
}

std::vector<protocol::FetchChunk> ChunkFetcher::requests() {
  std::vector<protocol::FetchChunk> out;
  while (in_flight_.size() < static_cast<size_t>(credit_) &&
         next_file_ < sizes_.size()) {
    uint64_t length = std::min<uint64_t>(chunk_size_, sizes_[next_file_] - next_offset_);
    protocol::FetchChunk fetch{source_, next_file_, next_offset_, length};
    out.push_back(fetch);
    in_flight_.push_back(fetch);
    next_offset_ += length;
    // Empty files need no request: they are complete as soon as they are created.
    while (next_file_ < sizes_.size() && next_offset_ == sizes_[next_file_]) {
      ++next_file_;
      next_offset_ = 0;
    }
  }
  return out;
}

uint32_t ChunkFetcher::accept(const protocol::Chunk& chunk, size_t size) {
  if (in_flight_.empty()) {
    throw ProtocolError("a " + chunk.source + " chunk that was not asked for");
  }
  const auto& expected = in_flight_.front();
  if (chunk.source != expected.source || chunk.file != expected.file ||
      chunk.offset != expected.offset || size != expected.length) {
    throw ProtocolError("a " + chunk.source + " chunk out of order (file " +
                        std::to_string(chunk.file) + ", offset " + std::to_string(chunk.offset) +
                        ", " + std::to_string(size) + " bytes; expected file " +
                        std::to_string(expected.file) + ", offset " +
                        std::to_string(expected.offset) + ")");
  }
  in_flight_.pop_front();
  received_ += size;
  return chunk.file;
}

ChunkSource ChunkSource::from_memory(std::string source,
                                     std::shared_ptr<const std::string> bytes) {
  ChunkSource out;
  out.source_ = std::move(source);
  out.files_.push_back({"", bytes->size(), ""});
  out.memory_ = std::move(bytes);
  return out;
}

ChunkSource ChunkSource::from_files(std::string source, std::filesystem::path dir,
                                    std::vector<protocol::CheckpointFile> files) {
  ChunkSource out;
  out.source_ = std::move(source);
  out.dir_ = std::move(dir);
  out.files_ = std::move(files);
  return out;
}

std::pair<protocol::Chunk, zmq::message_t> ChunkSource::read(
    const protocol::FetchChunk& fetch) const {
  if (fetch.source != source_ || fetch.file >= files_.size() || fetch.length > chunk_size_ ||
      fetch.offset > files_[fetch.file].size ||
      fetch.length > files_[fetch.file].size - fetch.offset) {
    throw ProtocolError("FETCH_CHUNK out of range (" + fetch.source + " file " +
                        std::to_string(fetch.file) + ", offset " + std::to_string(fetch.offset) +
                        ", length " + std::to_string(fetch.length) + ")");
  }
  protocol::Chunk chunk{source_, fetch.file, fetch.offset};
  if (memory_) {
    // Zero-copy: the message keeps the bytes alive until ZeroMQ has sent it.
    auto* keep = new std::shared_ptr<const std::string>(memory_);
    auto release = [](void*, void* hint) {
      delete static_cast<std::shared_ptr<const std::string>*>(hint);
    };
    return {chunk, zmq::message_t(const_cast<char*>(memory_->data()) + fetch.offset, fetch.length,
                                  release, keep)};
  }
  auto path = dir_ / files_[fetch.file].path;
  zmq::message_t bytes(fetch.length);
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ssize_t n = fd.get() < 0 ? -1
                           : ::pread(fd.get(), bytes.data(), fetch.length,
                                     static_cast<off_t>(fetch.offset));
  int saved = errno;
  if (n != static_cast<ssize_t>(fetch.length)) {
    // The worker verifies what it fetched; a short read would only fail there later.
    throw IoError("cannot read " + path.string() + ": " +
                  (n < 0 ? std::strerror(saved) : "it is shorter than its manifest says"));
  }
  return {chunk, std::move(bytes)};
}

}  // namespace trainrun

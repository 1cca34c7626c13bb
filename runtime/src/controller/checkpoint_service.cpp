#include "controller/checkpoint_service.h"

#include <trainrun/error.h>

#include "common/constants.h"
#include "storage/run_directory.h"

namespace trainrun {

CheckpointService::CheckpointService(CheckpointStore& store,
                                     const std::filesystem::path& resume_from,
                                     bool resume_from_first, bool always_stream)
    : store_(store), resume_from_(resume_from), always_stream_(always_stream) {
  auto latest = store_.latest();
  if (resume_from_first && latest && !resume_from.empty()) own_after_ = latest->iteration;
  resume_dir_ = own_latest();
}

std::filesystem::path CheckpointService::own_latest() const {
  auto latest = store_.latest();
  return latest && latest->iteration > own_after_ ? latest->path : resume_from_;
}

void CheckpointService::begin_attempt(int attempt) {
  store_.begin_attempt(attempt);
  resume_dir_ = own_latest();
  resume_source_.reset();
}

protocol::Upload CheckpointService::begin_upload(int rank, int64_t iteration,
                                                 const std::vector<protocol::CheckpointFile>& files,
                                                 bool stream) {
  // In object storage every rank puts its own files, wherever it runs.
  stream = (stream || always_stream_) && store_.objects() == nullptr;
  auto staging = store_.begin_upload(rank, files, stream);
  return protocol::Upload{iteration, stream ? "" : staging.string(), kChunkCredit};
}

void CheckpointService::write_chunk(int rank, const protocol::UploadChunk& chunk,
                                    const zmq::message_t& bytes) {
  store_.write_chunk(rank, chunk.file, chunk.offset, bytes.data(), bytes.size());
}

void CheckpointService::finish_upload(int rank, const protocol::Uploaded& uploaded) {
  if (!uploaded.error.empty()) throw IoError(uploaded.error);
  store_.finish_upload(rank, uploaded.files);
}

std::string CheckpointService::commit(int64_t iteration, const nlohmann::json& metrics) {
  if (!store_.staging()) return "";
  return store_.commit(iteration, metrics).name;
}

protocol::CheckpointListing CheckpointService::listing(const protocol::FetchCheckpoint& fetch) {
  if (fetch.checkpoint_dir != resume_dir_.string()) {
    throw ProtocolError("FETCH_CHECKPOINT of " + fetch.checkpoint_dir + ", which it was not given");
  }
  protocol::CheckpointListing listing;
  if (resume_dir_.empty()) return listing;
  listing.name = resume_dir_.filename().string();
  for (const auto& file : run_directory::read_manifest(resume_dir_).files) {
    listing.files.push_back({file.path, file.size, file.sha256});
  }
  if (!resume_source_) {
    resume_source_ =
        ChunkSource::from_files(protocol::kCheckpointSource, resume_dir_, listing.files);
  }
  return listing;
}

std::pair<protocol::Chunk, zmq::message_t> CheckpointService::read_chunk(
    const protocol::FetchChunk& fetch) const {
  if (!resume_source_) throw ProtocolError("FETCH_CHUNK of a checkpoint before its listing");
  return resume_source_->read(fetch);
}

}  // namespace trainrun

#include "worker/checkpoint_transfer.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/atomic_file.h"
#include "common/constants.h"
#include "common/hash.h"
#include "protocol/message.h"
#include "storage/s3_transfer.h"
#include "transfer/checkpoint_files.h"
#include "transfer/chunk_pull.h"
#include "transfer/chunked_file.h"

namespace trainrun {
namespace {

// The next message from the controller, which must be of type `type`. With
// `stop`, it looks at the flag every kStopCheck while it waits, and throws
// Error once it is set.
constexpr auto kStopCheck = std::chrono::milliseconds(200);

protocol::Incoming expect(zmq::socket_t& controller, const char* type,
                          const std::atomic<bool>* stop = nullptr) {
  if (stop != nullptr) {
    while (true) {
      if (stop->load()) throw Error(std::string("stopped while waiting for ") + type);
      zmq::pollitem_t items[] = {{controller.handle(), 0, ZMQ_POLLIN, 0}};
      if (protocol::poll(items, 1, kStopCheck) > 0 && (items[0].revents & ZMQ_POLLIN)) break;
    }
  }
  auto message = protocol::Incoming::parse(protocol::recv_frames(controller));
  if (message.type() != type) {
    throw Error("the run is stopping (" + message.type() + " while waiting for " + type + ")");
  }
  return message;
}

// Sends `path`'s bytes as UPLOAD_CHUNKs, waiting for UPLOAD_CREDIT whenever the
// credit is spent, and returns their sha256.
std::string stream_file(zmq::socket_t& controller, const std::filesystem::path& path,
                        uint32_t index, uint64_t size, int& credit, const std::atomic<bool>* stop) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    throw IoError("cannot read checkpoint file " + path.string() + ": " + std::strerror(errno));
  }
  Sha256 hash;
  for (uint64_t offset = 0; offset < size;) {
    while (credit == 0) {
      credit += expect(controller, protocol::UploadCredit::kType, stop)
                    .as<protocol::UploadCredit>()
                    .chunks;
    }
    // Read straight into the message that carries it: no copy on the way out.
    size_t length = std::min<uint64_t>(kChunkSize, size - offset);
    std::vector<zmq::message_t> blob;
    blob.emplace_back(length);
    ssize_t n = ::pread(fd.get(), blob[0].data(), length, static_cast<off_t>(offset));
    if (n != static_cast<ssize_t>(length)) {
      throw IoError("cannot read checkpoint file " + path.string() + ": " +
                    (n < 0 ? std::strerror(errno) : "it changed while being uploaded"));
    }
    hash.update(blob[0].data(), length);
    protocol::send(controller, protocol::UploadChunk{index, offset}, std::move(blob));
    offset += length;
    --credit;
  }
  return hash.hex_digest();
}

}  // namespace

void upload_to_objects(const std::string& checkpoint_url, const std::filesystem::path& dir,
                       std::vector<protocol::CheckpointFile>& files,
                       const std::atomic<bool>* stop) {
  auto location = s3::parse_url(checkpoint_url);
  auto config = s3::resolve_config();
  auto options = s3::TransferOptions::from_environment();
  options.client.stop = stop;
  for (auto& file : files) {
    if (stop != nullptr && stop->load()) throw Error("stopped while uploading");
    if (!is_safe_checkpoint_path(file.path)) {
      throw UsageError("the checkpoint names an unsafe path, " + file.path);
    }
    file.sha256 = s3::upload_file(config, location.bucket, dir / file.path, file.size,
                                  location.key(file.path), options);
  }
}

void upload_checkpoint(zmq::socket_t& controller, int64_t iteration,
                       const std::filesystem::path& dir,
                       std::vector<protocol::CheckpointFile> files, const std::atomic<bool>* stop) {
  auto upload = expect(controller, protocol::Upload::kType, stop).as<protocol::Upload>();
  if (upload.iteration != iteration) {
    throw ProtocolError("UPLOAD for report " + std::to_string(upload.iteration) + " while report " +
                        std::to_string(iteration) + " uploads");
  }
  protocol::Uploaded uploaded{iteration, {}, ""};
  if (s3::is_s3_url(upload.staging_dir)) {  // straight to object storage
    try {
      upload_to_objects(upload.staging_dir, dir, files, stop);
      uploaded.files = std::move(files);
    } catch (const IoError& e) {
      uploaded.error = e.what();
    } catch (const UsageError& e) {
      uploaded.error = e.what();
    }
    protocol::send(controller, uploaded);
    return;
  }
  try {
    int credit = upload.credit;
    for (uint32_t i = 0; i < files.size(); ++i) {
      if (stop != nullptr && stop->load()) throw Error("stopped while uploading");
      auto& file = files[i];
      if (upload.staging_dir.empty()) {
        file.sha256 = stream_file(controller, dir / file.path, i, file.size, credit, stop);
      } else {
        file.sha256 =
            copy_and_hash(dir / file.path, std::filesystem::path(upload.staging_dir) / file.path);
      }
    }
    // Every chunk written comes back as a credit; the last ones are collected
    // here, so none arrives once the report is waiting for its acknowledgement.
    while (credit < upload.credit) {
      credit += expect(controller, protocol::UploadCredit::kType, stop)
                    .as<protocol::UploadCredit>()
                    .chunks;
    }
    uploaded.files = std::move(files);
  } catch (const IoError& e) {
    uploaded.error = e.what();  // the controller fails the run as a storage error
  }
  protocol::send(controller, uploaded);
}

std::filesystem::path download_checkpoint(zmq::socket_t& controller,
                                          const std::string& checkpoint_dir,
                                          const std::filesystem::path& parent) {
  protocol::send(controller, protocol::FetchCheckpoint{checkpoint_dir});
  auto listing =
      expect(controller, protocol::CheckpointListing::kType).as<protocol::CheckpointListing>();
  if (listing.name.empty()) return {};
  auto into = parent / listing.name;
  std::error_code ec;
  std::filesystem::remove_all(into, ec);
  std::vector<uint64_t> sizes;
  for (const auto& file : listing.files) {
    if (!is_safe_checkpoint_path(file.path)) {
      throw ProtocolError("the checkpoint names an unsafe path, " + file.path);
    }
    sizes.push_back(file.size);
  }
  ChunkFetcher fetcher(protocol::kCheckpointSource, std::move(sizes));
  auto request_more = [&] {
    for (const auto& fetch : fetcher.requests()) protocol::send(controller, fetch);
  };
  request_more();
  for (uint32_t index = 0; index < listing.files.size(); ++index) {
    const auto& file = listing.files[index];
    auto path = into / file.path;
    std::filesystem::create_directories(path.parent_path(), ec);
    if (ec) throw IoError("cannot create " + path.parent_path().string() + ": " + ec.message());
    ChunkedFile out(path, file.size, ChunkedFile::Hashing::kSha256);
    while (!out.complete()) {
      auto message = expect(controller, protocol::Chunk::kType);
      if (message.blobs().size() != 1) throw ProtocolError("CHUNK without its bytes");
      const auto& bytes = message.blobs()[0];
      auto chunk = message.as<protocol::Chunk>();
      if (fetcher.accept(chunk, bytes.size()) != index) {
        throw ProtocolError("a checkpoint chunk for another file than the one being written");
      }
      out.write(chunk.offset, bytes.data(), bytes.size());
      request_more();
    }
    if (out.finish() != file.sha256) {
      throw IoError("checkpoint file " + file.path + " of " + listing.name +
                    " arrived corrupt (its sha256 differs from the manifest)");
    }
  }
  return into;
}

}  // namespace trainrun

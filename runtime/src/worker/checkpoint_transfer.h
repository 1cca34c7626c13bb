#pragma once

// The worker's half of checkpoint uploads and downloads, run on the train
// thread while train::report or train::get_checkpoint blocks it, on the train
// thread's own connection to the controller, or for an asynchronous upload on
// the upload thread's (worker/checkpoint_uploader.h; protocol/messages.h
// describes the exchange).

#include <zmq.hpp>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "protocol/messages.h"

namespace trainrun {

/// Uploads the files of `dir`, as the REPORT of `iteration` listed them, once
/// the controller's UPLOAD says how: copied into its staging directory, or
/// streamed within its credit. Ends with UPLOADED: the files' sha256s, or the
/// IoError that stopped the upload. Throws Error when the controller answers
/// something else (the run is stopping), or once `stop` (when given) is set
/// while it waits for the controller.
void upload_checkpoint(zmq::socket_t& controller, int64_t iteration,
                       const std::filesystem::path& dir,
                       std::vector<protocol::CheckpointFile> files,
                       const std::atomic<bool>* stop = nullptr);

/// Puts each of `files` (in `dir`) under the s3:// URL of a checkpoint, and
/// records its sha256. Throws IoError (S3Error) when an upload fails, after
/// its retries; each failed multipart upload is aborted.
void upload_to_objects(const std::string& checkpoint_url, const std::filesystem::path& dir,
                       std::vector<protocol::CheckpointFile>& files,
                       const std::atomic<bool>* stop);

/// Fetches the checkpoint ASSIGN named (`checkpoint_dir`, on the controller's
/// side) into a new directory under `parent`, verifying every file's sha256.
/// Returns that directory, or an empty path when there is no checkpoint.
/// Throws Error as upload_checkpoint does, or when a file arrives corrupt.
std::filesystem::path download_checkpoint(zmq::socket_t& controller,
                                          const std::string& checkpoint_dir,
                                          const std::filesystem::path& parent);

}  // namespace trainrun

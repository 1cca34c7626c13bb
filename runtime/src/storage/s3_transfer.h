#pragma once

// Whole files to and from S3, in parallel parts. An upload reads the file in
// order, hashing it as it goes, into a pool of part buffers that `threads`
// connections send at once (multipart; one PUT for a file of one part), so
// its memory is (threads + 1) x part_size whatever the file's size; a failure
// aborts the multipart upload. A download reads `threads` ranges at once
// straight into the file, and hashes it in order behind them. Both return the
// file's sha256, which the manifest records and every download checks.
// Thread-safe: each call makes its own connections.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>

#include "storage/s3_client.h"

namespace trainrun::s3 {

struct TransferOptions {
  int threads = 8;               // parts in flight
  size_t part_size = 16u << 20;  // grown for files of more than 10,000 parts
  ClientOptions client;          // retries, timeouts, the stop flag
};

/// Uploads `file` (of `size` bytes) to `key`; returns its sha256 (hex).
/// Throws S3Error, or IoError when the file cannot be read or is not `size`
/// bytes long.
std::string upload_file(const Config& config, const std::string& bucket,
                        const std::filesystem::path& file, uint64_t size, const std::string& key,
                        const TransferOptions& options = {});

/// Downloads `key` (of `size` bytes) into `file`, created or replaced; returns
/// its sha256 (hex). Throws S3Error, or IoError when the file cannot be
/// written.
std::string download_file(const Config& config, const std::string& bucket, const std::string& key,
                          uint64_t size, const std::filesystem::path& file,
                          const TransferOptions& options = {});

}  // namespace trainrun::s3

#pragma once

// Whole files to and from S3, in parallel parts. An upload reads the file in
// order, hashing it as it goes, into a pool of part buffers that `threads`
// connections send at once (multipart; one PUT for a file of one part), so
// its memory is (threads + 1) x part_size whatever the file's size; a failure
// aborts the multipart upload. A download reads `threads` ranges at once,
// across all of a checkpoint's files, straight into the files, and hashes
// each in order behind them. Both return the
// file's sha256, which the manifest records and every download checks.
// Thread-safe: each call makes its own connections.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "storage/s3_client.h"

namespace trainrun::s3 {

struct TransferOptions {
  int threads = 10;             // parts in flight (boto3 default: 10)
  size_t part_size = 8u << 20;  // boto3 default: 8 MiB; grown past 10,000 parts
  ClientOptions client;         // retries, timeouts, the stop flag

  /// The defaults, with TRAINRUN_S3_CONCURRENCY (threads) and
  /// TRAINRUN_S3_PART_MB (part size in MiB, 5 to 5120) where set. Throws
  /// UsageError for a value out of range.
  static TransferOptions from_environment();
};

/// Uploads `file` (of `size` bytes) to `key`; returns its sha256 (hex).
/// Throws S3Error, or IoError when the file cannot be read or is not `size`
/// bytes long.
std::string upload_file(const Config& config, const std::string& bucket,
                        const std::filesystem::path& file, uint64_t size, const std::string& key,
                        const TransferOptions& options = {});

/// One object to download, and where.
struct Download {
  std::string key;
  uint64_t size = 0;
  std::filesystem::path path;  // created or replaced
};

/// Downloads `files`, `threads` ranges at once across all of them; returns
/// each one's sha256 (hex), in order. Not fsynced: a copy, not the record.
/// Throws S3Error, or IoError when a file cannot be written.
std::vector<std::string> download_files(const Config& config, const std::string& bucket,
                                        const std::vector<Download>& files,
                                        const TransferOptions& options = {});

}  // namespace trainrun::s3

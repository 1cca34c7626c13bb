#pragma once

// A run kept in object storage: s3://BUCKET/PREFIX/<name>/, laid out as a run
// directory is (storage/run_directory.h). The controller works on a local copy
// of the run's small files (run.json, result.jsonl, progress.csv,
// checkpoint_state.json, error.json, logs/, report.html), in the formats the
// local path uses, and puts each whole once written: S3 has no append and no
// rename. Checkpoint files never pass through the copy: each rank uploads its
// own straight to <run>/checkpoint_NNNNNN/, and the controller commits by
// putting the manifest last, then checkpoint_state.json.
//
// Owned by one thread (the controller's, or `trainrun results`); not
// thread-safe.

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "storage/s3_client.h"
#include "storage/s3_config.h"

namespace trainrun {

class RunObjects {
 public:
  /// The run `name` under the storage URL `storage_url` (s3://BUCKET/PREFIX),
  /// reached as s3::resolve_config() says, each call limited by `options`.
  /// Throws UsageError for a malformed URL or configuration.
  RunObjects(const std::string& storage_url, const std::string& name,
             s3::ClientOptions options = {});

  /// Lists the run's prefix: throws UsageError with one line when the bucket
  /// does not exist, the credentials are refused or the endpoint cannot be
  /// reached.
  void check_access();

  /// s3://BUCKET/PREFIX/<name>[/relative].
  std::string url(const std::string& relative = "") const;
  /// The object key of `relative` in the run.
  std::string key(const std::string& relative) const;
  s3::Client& client() { return client_; }
  const s3::Config& config() const { return config_; }
  const std::string& bucket() const { return run_.bucket; }

  /// Replaces `dir`'s run files with the stored ones (an absent one is
  /// removed here too): the store is the truth, the copy may be stale.
  void pull_run_files(const std::filesystem::path& dir);
  /// Puts `dir`/`relative` whole under the run.
  void push(const std::filesystem::path& dir, const std::string& relative);
  /// Deletes `relative` (no error when absent).
  void remove(const std::string& relative);
  /// The bytes of `relative`; nothing when absent.
  std::optional<std::string> get(const std::string& relative);
  /// The objects whose key starts with `relative_prefix`, keys relative to the run.
  std::vector<s3::ObjectInfo> list(const std::string& relative_prefix);

  /// Deletes everything under `relative_prefix` (a checkpoint's directory, with
  /// its trailing '/'): its manifest first, so that what a failure leaves
  /// half-deleted is uncommitted, then the rest, then the multipart uploads
  /// begun there and never completed.
  void discard(const std::string& relative_prefix);

 private:
  s3::Config config_;
  s3::Location run_;
  s3::Client client_;
};

/// The run files the controller keeps, as pull_run_files() copies them.
const std::vector<std::string>& run_file_names();

}  // namespace trainrun

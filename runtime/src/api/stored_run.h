#pragma once

// A run in object storage (s3://BUCKET/PREFIX/NAME) read as a run directory:
// its small files copied into a temporary directory, removed with this
// object. For `trainrun results` and write_html_report. Not thread-safe.

#include <filesystem>
#include <string>

namespace trainrun {

class StoredRun {
 public:
  /// Copies the run's files. Throws UsageError for a URL without a run name,
  /// a missing bucket or refused credentials; IoError (S3Error) when the store
  /// fails.
  explicit StoredRun(const std::string& url);
  ~StoredRun();
  StoredRun(const StoredRun&) = delete;
  StoredRun& operator=(const StoredRun&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  const std::string& url() const { return url_; }

 private:
  std::string url_;
  std::filesystem::path dir_;
};

}  // namespace trainrun

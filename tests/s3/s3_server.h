#pragma once

// A real S3-compatible server for a test: SeaweedFS's `weed mini`, started by
// tests/s3/s3tool.py on loopback with ports the OS chose, and boto3's view of
// its objects, independent of trainrun's own client. Where weed or boto3 is
// not installed (tools/setup_s3.sh), the test case is skipped: its process
// exits 77, which CTest reports as skipped.

#include <sys/types.h>

#include <filesystem>
#include <string>

class S3Server {
 public:
  /// Starts the server with its data in `dir`, and points the AWS_* variables
  /// of this process (which trainrun inherits) at it.
  explicit S3Server(std::filesystem::path dir);
  /// Stops the server.
  ~S3Server();
  S3Server(const S3Server&) = delete;
  S3Server& operator=(const S3Server&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  /// Stops it now (kill -9 of the server), keeping its data.
  void stop();
  /// Starts it again on the same data, at a new endpoint.
  void start();
  /// Runs `s3tool.py ARGS` (ls, uploads, get, mb, put) and returns its stdout;
  /// fails the test case when it exits non-zero.
  std::string tool(const std::string& args) const;

  static constexpr const char* kAccessKey = "trainrun-test-key";
  static constexpr const char* kSecretKey = "trainrun-test-secret";

 private:
  std::filesystem::path dir_;
  std::string endpoint_;
  pid_t pid_ = -1;
  int stdin_ = -1;  // closing it stops the server
};

/// The venv tools/setup_s3.sh installs into.
std::filesystem::path s3_venv();

#pragma once

// A client of one bucket of an S3-compatible store: the object, listing and
// multipart calls trainrun needs, over libcurl, which signs every request
// (AWS Signature Version 4, CURLOPT_AWS_SIGV4) with the credentials of
// s3::Config. Bodies are sent unsigned (x-amz-content-sha256:
// UNSIGNED-PAYLOAD): checkpoint files carry their own sha256 in the manifest,
// checked on every download.
//
// Each call is retried with exponential back-off (and jitter) where S3 says
// to retry: a connection that fails or stalls, 500, 502, 503, 504 and 429.
// Every wait is bounded: a connect timeout, a stall timeout (no byte for
// Options::stall_timeout) and a limit on the whole request. Failures throw
// S3Error (an IoError) naming the call, the s3:// URL and the server's code
// and message; never a credential.
//
// One Client holds one connection and one request at a time: not thread-safe.
// Parallel transfers (storage/s3_transfer.h) use a Client per thread.

#include <trainrun/error.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "storage/s3_config.h"

namespace trainrun::s3 {

/// A call that S3 or the network refused. `status` is the HTTP status (0 when
/// no answer came), `code` S3's error code ("NoSuchBucket", ...) if it gave one.
class S3Error : public IoError {
 public:
  S3Error(const std::string& message, long status, std::string code)
      : IoError(message), status_(status), code_(std::move(code)) {}
  long status() const { return status_; }
  const std::string& code() const { return code_; }

 private:
  long status_;
  std::string code_;
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
};

struct MultipartUpload {
  std::string key;
  std::string upload_id;
};

struct ClientOptions {
  int max_attempts = 5;                          // tries of one call, the first included
  std::chrono::milliseconds first_backoff{250};  // doubled after each retry ...
  std::chrono::milliseconds max_backoff{4000};   // ... up to this
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds stall_timeout{30000};     // no byte moved for this long
  std::chrono::milliseconds request_timeout{600000};  // one request, whole (+1 ms per KiB)
  /// Every try of one call together, back-off included (zero: only the
  /// limits above). The controller's calls have one, so that a slow store
  /// never holds its loop past the workers' heartbeat timeout.
  std::chrono::milliseconds call_timeout{0};
  /// Checked while a request runs and between tries: once set, the call
  /// throws S3Error at once.
  const std::atomic<bool>* stop = nullptr;
};

class Client {
 public:
  Client(Config config, std::string bucket, ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& bucket() const { return bucket_; }
  /// "s3://bucket/key".
  std::string url(const std::string& key) const;

  /// Lists one key of the bucket: throws S3Error when the bucket does not
  /// exist or the credentials are refused.
  void check_access(const std::string& prefix);

  void put(const std::string& key, const void* data, size_t size);
  void put(const std::string& key, const std::string& bytes) {
    put(key, bytes.data(), bytes.size());
  }
  /// The object's bytes; nothing when there is no such key.
  std::optional<std::string> get(const std::string& key);
  /// Reads `size` bytes at `offset` into `out`; throws S3Error when fewer come.
  void get_range(const std::string& key, uint64_t offset, size_t size, void* out);
  /// Writes `size` bytes at `offset` into the file `fd` at the same offset;
  /// throws S3Error when fewer come or they cannot be written.
  void get_range_to_file(const std::string& key, uint64_t offset, size_t size, int fd);
  /// The object's size; nothing when there is no such key.
  std::optional<uint64_t> head(const std::string& key);
  /// Every object whose key starts with `prefix`, in key order.
  std::vector<ObjectInfo> list(const std::string& prefix);
  /// Deletes the object (no error when there is none).
  void remove(const std::string& key);

  /// Deletes the objects (DeleteObjects, a thousand a request); throws
  /// S3Error naming the first the store could not delete.
  void remove_many(const std::vector<std::string>& keys);

  /// Starts a multipart upload; returns its id.
  std::string create_multipart(const std::string& key);
  /// Uploads part `number` (1-based); returns its ETag.
  std::string upload_part(const std::string& key, const std::string& upload_id, int number,
                          const void* data, size_t size);
  /// Joins the parts, ETags in part order.
  void complete_multipart(const std::string& key, const std::string& upload_id,
                          const std::vector<std::string>& etags);
  void abort_multipart(const std::string& key, const std::string& upload_id);
  /// The multipart uploads begun and neither completed nor aborted under `prefix`.
  std::vector<MultipartUpload> list_multipart(const std::string& prefix);

 private:
  struct Request;
  struct Response {
    long status = 0;
    std::string body;
    std::map<std::string, std::string> headers;  // lower-case names
  };
  /// Runs one call with its retries. Throws S3Error for a status that is not
  /// 2xx and not in `accepted`.
  Response call(Request& request, std::vector<long> accepted = {});
  Response perform(Request& request);

  Config config_;
  std::string bucket_;
  ClientOptions options_;
  void* curl_;  // CURL*, reused for its connection
};

/// Percent-encodes as SigV4 wants (RFC 3986 unreserved kept; '/' kept when
/// `keep_slash`).
std::string uri_encode(const std::string& text, bool keep_slash);

}  // namespace trainrun::s3

#include "storage/s3_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <pugixml.hpp>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

namespace trainrun::s3 {
namespace {

// The most an answer held in memory may be: run files, listings, errors.
constexpr size_t kMaxBody = 256u << 20;

std::once_flag curl_initialised;

CURL* handle(void* curl) { return static_cast<CURL*>(curl); }

bool retryable_status(long status) {
  return status == 500 || status == 502 || status == 503 || status == 504 || status == 429;
}

bool retryable_curl(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_COULDNT_RESOLVE_HOST:  // a DNS hiccup (Kubernetes' among them)
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_WEIRD_SERVER_REPLY: return true;
    default: return false;
  }
}

// S3's <Error><Code>..</Code><Message>..</Message></Error>, if the body is one.
std::pair<std::string, std::string> error_of(const std::string& body) {
  pugi::xml_document doc;
  if (!doc.load_buffer(body.data(), body.size())) return {};
  auto error = doc.child("Error");
  return {error.child_value("Code"), error.child_value("Message")};
}

// A request's XML body, without indentation.
std::string xml_text(const pugi::xml_document& doc) {
  struct Writer : pugi::xml_writer {
    std::string text;
    void write(const void* data, size_t size) override {
      text.append(static_cast<const char*>(data), size);
    }
  } writer;
  doc.save(writer, "", pugi::format_raw);
  return writer.text;
}

pugi::xml_node parse_root(pugi::xml_document& doc, const std::string& body, const char* root,
                          const std::string& what) {
  if (!doc.load_buffer(body.data(), body.size()) || !doc.child(root)) {
    throw S3Error(what + ": the server's answer is not a " + root, 0, "");
  }
  return doc.child(root);
}

uint64_t parse_size(const char* text, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  auto value = std::strtoull(text, &end, 10);
  if (*text == '\0' || *end != '\0' || errno != 0 || *text == '-') {
    throw S3Error(what + ": the server gave a malformed size", 0, "");
  }
  return value;
}

}  // namespace

std::string uri_encode(const std::string& text, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

struct Client::Request {
  Request(std::string method_, std::string key_, std::map<std::string, std::string> query_ = {})
      : method(std::move(method_)), key(std::move(key_)), query(std::move(query_)) {}
  std::string method;                        // GET, PUT, POST, DELETE, HEAD
  std::string key;                           // empty: the bucket
  std::map<std::string, std::string> query;  // sorted, as SigV4's canonical query must be
  const char* body = nullptr;
  size_t body_size = 0;
  std::optional<std::pair<uint64_t, size_t>> range;  // offset, size
  char* sink = nullptr;                              // a ranged GET's bytes go here ...
  int sink_fd = -1;                                  // ... or into this file at sink_offset
  uint64_t sink_offset = 0;
  size_t sink_size = 0, sink_used = 0;
  bool sinks() const { return sink != nullptr || sink_fd >= 0; }
  std::string what;  // "PUT s3://bucket/key", for messages
  std::optional<std::chrono::steady_clock::time_point> deadline;  // of the call, all tries
  std::vector<std::string> headers;                               // more, signed with the rest
};

Client::Client(Config config, std::string bucket, ClientOptions options)
    : config_(std::move(config)), bucket_(std::move(bucket)), options_(options) {
  std::call_once(curl_initialised, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  curl_ = curl_easy_init();
  if (curl_ == nullptr) throw IoError("cannot start libcurl");
}

Client::~Client() { curl_easy_cleanup(handle(curl_)); }

std::string Client::url(const std::string& key) const {
  return "s3://" + bucket_ + (key.empty() ? "" : "/" + key);
}

Client::Response Client::perform(Request& request) {
  CURL* curl = handle(curl_);
  curl_easy_reset(curl);
  std::string target = config_.endpoint + "/" + uri_encode(bucket_, false);
  if (!request.key.empty()) target += "/" + uri_encode(request.key, true);
  std::string query;
  for (const auto& [name, value] : request.query) {
    query += (query.empty() ? "?" : "&") + uri_encode(name, false) + "=" + uri_encode(value, false);
  }
  target += query;
  curl_easy_setopt(curl, CURLOPT_URL, target.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options_.connect_timeout.count()));
  // The whole request's limit grows with its size (at least 1 MiB/s), and never
  // passes what is left of the call's deadline.
  auto limit = options_.request_timeout +
               std::chrono::milliseconds(std::max(request.body_size, request.sink_size) >> 10);
  if (request.deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        *request.deadline - std::chrono::steady_clock::now());
    limit = std::max(std::chrono::milliseconds(1), std::min(limit, left));
  }
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(limit.count()));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                   static_cast<long>(std::max<int64_t>(1, options_.stall_timeout.count() / 1000)));
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  // Parts are megabytes: fewer, larger reads and writes than the 16 KiB default.
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, 1L << 20);
  curl_easy_setopt(curl, CURLOPT_UPLOAD_BUFFERSIZE, 1L << 20);

  Response response;
  struct curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  for (const auto& header : request.headers) headers = curl_slist_append(headers, header.c_str());
  if (request.method == "PUT") {  // not the form type libcurl gives a body of its own
    headers = curl_slist_append(headers, "Content-Type: application/octet-stream");
  }
  if (config_.credentials) {
    const auto& credentials = *config_.credentials;
    std::string sigv4 = "aws:amz:" + config_.region + ":s3";
    curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(curl, CURLOPT_USERNAME, credentials.access_key_id.c_str());
    curl_easy_setopt(curl, CURLOPT_PASSWORD, credentials.secret_access_key.c_str());
    if (!credentials.session_token.empty()) {
      headers = curl_slist_append(headers,
                                  ("x-amz-security-token: " + credentials.session_token).c_str());
    }
  }
  std::string range;
  if (request.range) {
    auto [offset, size] = *request.range;
    range = std::to_string(offset) + "-" + std::to_string(offset + size - 1);
    curl_easy_setopt(curl, CURLOPT_RANGE, range.c_str());
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);

  request.sink_used = 0;
  if (request.method == "PUT") {
    // Sent from the caller's buffer as it is: no read callback copying it into
    // libcurl's upload buffer first.
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "PUT");
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body_size));
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body == nullptr ? "" : request.body);
  } else if (request.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body_size));
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body == nullptr ? "" : request.body);
  } else if (request.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (request.method == "DELETE") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "DELETE");
  }

  struct Sink {
    Request* request;
    Response* response;
  } sink{&request, &response};
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION,
      +[](char* data, size_t size, size_t count, void* user) -> size_t {
        auto& s = *static_cast<Sink*>(user);
        size_t n = size * count;
        auto& r = *s.request;
        // A ranged read's bytes go straight to the caller's buffer
        // (when the answer is one: an error's body is kept).
        if (r.sinks() && s.response->status / 100 == 2) {
          if (r.sink_used + n > r.sink_size) return 0;  // more than asked: fail
          if (r.sink != nullptr) {
            std::memcpy(r.sink + r.sink_used, data, n);
          } else {
            for (size_t done = 0; done < n;) {
              auto w = ::pwrite(r.sink_fd, data + done, n - done,
                                static_cast<off_t>(r.sink_offset + r.sink_used + done));
              if (w < 0 && errno == EINTR) continue;
              if (w <= 0) return 0;  // the transfer fails: a write error
              done += static_cast<size_t>(w);
            }
          }
          r.sink_used += n;
          return n;
        }
        if (s.response->body.size() + n > kMaxBody) return 0;
        s.response->body.append(data, n);
        return n;
      });
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &sink);
  curl_easy_setopt(
      curl, CURLOPT_HEADERFUNCTION,
      +[](char* data, size_t size, size_t count, void* user) -> size_t {
        auto& s = *static_cast<Sink*>(user);
        std::string line(data, size * count);
        if (line.rfind("HTTP/", 0) == 0) {
          auto space = line.find(' ');
          if (space != std::string::npos) {
            s.response->status = std::strtol(line.c_str() + space + 1, nullptr, 10);
          }
          s.response->headers.clear();
          return line.size();
        }
        auto colon = line.find(':');
        if (colon != std::string::npos) {
          std::string name = line.substr(0, colon);
          std::transform(name.begin(), name.end(), name.begin(), ::tolower);
          auto value = line.substr(colon + 1);
          auto begin = value.find_first_not_of(" \t");
          auto end = value.find_last_not_of(" \t\r\n");
          s.response->headers[name] =
              begin == std::string::npos ? "" : value.substr(begin, end - begin + 1);
        }
        return line.size();
      });
  if (options_.stop != nullptr) {
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, options_.stop);
    curl_easy_setopt(
        curl, CURLOPT_XFERINFOFUNCTION,
        +[](void* stop, curl_off_t, curl_off_t, curl_off_t, curl_off_t) -> int {
          return static_cast<const std::atomic<bool>*>(stop)->load() ? 1 : 0;
        });
  }
  char error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  CURLcode code = curl_easy_perform(curl);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);  // `error` ends with this call
  curl_slist_free_all(headers);
  // The credentials are copied into the handle: clear them now.
  curl_easy_setopt(curl, CURLOPT_USERNAME, "");
  curl_easy_setopt(curl, CURLOPT_PASSWORD, "");
  if (code != CURLE_OK) {
    if (options_.stop != nullptr && options_.stop->load()) {
      throw S3Error(request.what + ": stopped", 0, "");
    }
    std::string reason = error[0] != '\0' ? error : curl_easy_strerror(code);
    throw S3Error(request.what + " failed: " + reason, 0, retryable_curl(code) ? "retry" : "");
  }
  return response;
}

Client::Response Client::call(Request& request, std::vector<long> accepted) {
  std::minstd_rand jitter(std::random_device{}());
  auto backoff = options_.first_backoff;
  if (options_.call_timeout.count() > 0) {
    request.deadline = std::chrono::steady_clock::now() + options_.call_timeout;
  }
  for (int attempt = 1;; ++attempt) {
    std::string failure;
    bool retry = false;
    long status = 0;
    std::string code;
    try {
      auto response = perform(request);
      status = response.status;
      if (status / 100 == 2 ||
          std::find(accepted.begin(), accepted.end(), status) != accepted.end()) {
        if (status == 404 && error_of(response.body).first == "NoSuchBucket") {
          throw S3Error(
              request.what + " failed: 404 NoSuchBucket (bucket '" + bucket_ + "' does not exist)",
              status, "NoSuchBucket");
        }
        if (request.sinks() && status / 100 == 2 && request.sink_used != request.sink_size) {
          failure = request.what + " failed: " + std::to_string(request.sink_used) + " of " +
                    std::to_string(request.sink_size) + " bytes came";
          retry = true;
        } else {
          return response;
        }
      } else {
        auto [error_code, message] = error_of(response.body);
        code = error_code;
        if (status == 404 && error_code == "NoSuchBucket") {
          throw S3Error(
              request.what + " failed: 404 NoSuchBucket (bucket '" + bucket_ + "' does not exist)",
              status, error_code);
        }
        failure = request.what + " failed: " + std::to_string(status) +
                  (error_code.empty() ? "" : " " + error_code) +
                  (message.empty() ? "" : " (" + message + ")");
        retry = retryable_status(status) || error_code == "SlowDown" ||
                error_code == "InternalError" || error_code == "RequestTimeout";
      }
    } catch (const S3Error& e) {
      if (e.code() != "retry") throw;
      failure = e.what();
      retry = true;
    }
    auto wait = backoff / 2 + std::chrono::milliseconds(jitter() % (backoff.count() / 2 + 1));
    const bool out_of_time =
        request.deadline && std::chrono::steady_clock::now() + wait >= *request.deadline;
    if (!retry || attempt >= options_.max_attempts || out_of_time ||
        (options_.stop != nullptr && options_.stop->load())) {
      if (retry) failure += " (after " + std::to_string(attempt) + " tries)";
      throw S3Error(failure, status, code);
    }
    std::this_thread::sleep_for(wait);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

void Client::check_access(const std::string& prefix) {
  Request request{"GET", "", {{"list-type", "2"}, {"max-keys", "1"}, {"prefix", prefix}}};
  request.what = "list " + url(prefix);
  call(request);
}

void Client::put(const std::string& key, const void* data, size_t size) {
  Request request{"PUT", key};
  request.body = static_cast<const char*>(data);
  request.body_size = size;
  request.what = "PUT " + url(key);
  call(request);
}

std::optional<std::string> Client::get(const std::string& key) {
  Request request{"GET", key};
  request.what = "GET " + url(key);
  auto response = call(request, {404});
  if (response.status == 404) return std::nullopt;
  return std::move(response.body);
}

void Client::get_range(const std::string& key, uint64_t offset, size_t size, void* out) {
  if (size == 0) return;
  Request request{"GET", key};
  request.range = std::make_pair(offset, size);
  request.sink = static_cast<char*>(out);
  request.sink_size = size;
  request.what =
      "GET " + url(key) + " bytes " + std::to_string(offset) + "+" + std::to_string(size);
  call(request);
}

void Client::get_range_to_file(const std::string& key, uint64_t offset, size_t size, int fd) {
  if (size == 0) return;
  Request request{"GET", key};
  request.range = std::make_pair(offset, size);
  request.sink_fd = fd;
  request.sink_offset = offset;
  request.sink_size = size;
  request.what =
      "GET " + url(key) + " bytes " + std::to_string(offset) + "+" + std::to_string(size);
  call(request);
}

std::optional<uint64_t> Client::head(const std::string& key) {
  Request request{"HEAD", key};
  request.what = "HEAD " + url(key);
  auto response = call(request, {404});
  if (response.status == 404) return std::nullopt;
  auto length = response.headers.find("content-length");
  if (length == response.headers.end()) throw S3Error(request.what + ": no Content-Length", 0, "");
  return parse_size(length->second.c_str(), request.what);
}

std::vector<ObjectInfo> Client::list(const std::string& prefix) {
  std::vector<ObjectInfo> objects;
  std::string token;
  // Bounded: every page must move the listing on.
  for (int page = 0; page < 100000; ++page) {
    Request request{"GET", "", {{"list-type", "2"}, {"prefix", prefix}}};
    if (!token.empty()) request.query["continuation-token"] = token;
    request.what = "list " + url(prefix);
    auto response = call(request);
    pugi::xml_document doc;
    auto root = parse_root(doc, response.body, "ListBucketResult", request.what);
    for (auto contents : root.children("Contents")) {
      std::string key = contents.child_value("Key");
      if (key.rfind(prefix, 0) != 0) continue;  // a server that ignored the prefix
      objects.push_back({key, parse_size(contents.child_value("Size"), request.what)});
    }
    std::string next = root.child_value("NextContinuationToken");
    if (std::string(root.child_value("IsTruncated")) != "true") break;
    if (next.empty() || next == token) {
      throw S3Error(request.what + ": a truncated listing without a way on", 0, "");
    }
    token = next;
  }
  std::sort(objects.begin(), objects.end(),
            [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  return objects;
}

void Client::remove(const std::string& key) {
  Request request{"DELETE", key};
  request.what = "DELETE " + url(key);
  call(request, {404});
}

void Client::remove_many(const std::vector<std::string>& keys) {
  // DeleteObjects: up to 1,000 keys a request, its body's MD5 in Content-MD5
  // as S3 requires.
  for (size_t start = 0; start < keys.size(); start += 1000) {
    pugi::xml_document doc;
    auto root = doc.append_child("Delete");
    root.append_child("Quiet").text().set("true");
    for (size_t i = start; i < std::min(keys.size(), start + 1000); ++i) {
      root.append_child("Object").append_child("Key").text().set(keys[i].c_str());
    }
    const std::string body = xml_text(doc);
    unsigned char md5[EVP_MAX_MD_SIZE];
    unsigned int md5_size = 0;
    if (EVP_Digest(body.data(), body.size(), md5, &md5_size, EVP_md5(), nullptr) != 1) {
      throw S3Error("cannot hash a DeleteObjects request", 0, "");
    }
    unsigned char encoded[64];
    EVP_EncodeBlock(encoded, md5, static_cast<int>(md5_size));
    Request request{"POST", "", {{"delete", ""}}};
    request.body = body.data();
    request.body_size = body.size();
    request.headers.push_back(std::string("Content-MD5: ") + reinterpret_cast<char*>(encoded));
    request.what = "delete " + std::to_string(std::min<size_t>(keys.size() - start, 1000)) +
                   " objects under " + url(keys[start]);
    auto response = call(request);
    pugi::xml_document result;
    if (result.load_buffer(response.body.data(), response.body.size())) {
      auto error = result.child("DeleteResult").child("Error");
      if (error) {
        throw S3Error(request.what + " failed: " + error.child_value("Key") + ": " +
                          error.child_value("Code") + " (" + error.child_value("Message") + ")",
                      response.status, error.child_value("Code"));
      }
    }
  }
}

std::string Client::create_multipart(const std::string& key) {
  Request request{"POST", key, {{"uploads", ""}}};
  request.what = "start a multipart upload of " + url(key);
  auto response = call(request);
  pugi::xml_document doc;
  std::string id = parse_root(doc, response.body, "InitiateMultipartUploadResult", request.what)
                       .child_value("UploadId");
  if (id.empty()) throw S3Error(request.what + ": no UploadId in the answer", 0, "");
  return id;
}

std::string Client::upload_part(const std::string& key, const std::string& upload_id, int number,
                                const void* data, size_t size) {
  Request request{"PUT", key, {{"partNumber", std::to_string(number)}, {"uploadId", upload_id}}};
  request.body = static_cast<const char*>(data);
  request.body_size = size;
  request.what = "PUT part " + std::to_string(number) + " of " + url(key);
  auto response = call(request);
  auto etag = response.headers.find("etag");
  if (etag == response.headers.end() || etag->second.empty()) {
    throw S3Error(request.what + ": no ETag in the answer", 0, "");
  }
  return etag->second;
}

void Client::complete_multipart(const std::string& key, const std::string& upload_id,
                                const std::vector<std::string>& etags) {
  pugi::xml_document doc;
  auto root = doc.append_child("CompleteMultipartUpload");
  for (size_t i = 0; i < etags.size(); ++i) {
    auto part = root.append_child("Part");
    part.append_child("PartNumber").text().set(static_cast<unsigned>(i + 1));
    part.append_child("ETag").text().set(etags[i].c_str());
  }
  const std::string body = xml_text(doc);
  Request request{"POST", key, {{"uploadId", upload_id}}};
  request.body = body.data();
  request.body_size = body.size();
  request.what = "complete the multipart upload of " + url(key);
  auto response = call(request);
  // S3 may answer 200 with an error in the body.
  auto [code, message] = error_of(response.body);
  if (!code.empty()) {
    throw S3Error(request.what + " failed: " + code + " (" + message + ")", response.status, code);
  }
}

void Client::abort_multipart(const std::string& key, const std::string& upload_id) {
  Request request{"DELETE", key, {{"uploadId", upload_id}}};
  request.what = "abort the multipart upload of " + url(key);
  call(request, {404});
}

std::vector<MultipartUpload> Client::list_multipart(const std::string& prefix) {
  std::vector<MultipartUpload> uploads;
  std::string key_marker, id_marker;
  for (int page = 0; page < 100000; ++page) {
    Request request{"GET", "", {{"prefix", prefix}, {"uploads", ""}}};
    if (!key_marker.empty()) {
      request.query["key-marker"] = key_marker;
      request.query["upload-id-marker"] = id_marker;
    }
    request.what = "list the multipart uploads of " + url(prefix);
    auto response = call(request);
    pugi::xml_document doc;
    auto root = parse_root(doc, response.body, "ListMultipartUploadsResult", request.what);
    for (auto upload : root.children("Upload")) {
      std::string key = upload.child_value("Key");
      if (key.rfind(prefix, 0) != 0) continue;
      uploads.push_back({key, upload.child_value("UploadId")});
    }
    std::string next_key = root.child_value("NextKeyMarker");
    std::string next_id = root.child_value("NextUploadIdMarker");
    if (std::string(root.child_value("IsTruncated")) != "true" || next_key.empty() ||
        (next_key == key_marker && next_id == id_marker)) {
      break;
    }
    key_marker = next_key;
    id_marker = next_id;
  }
  return uploads;
}

}  // namespace trainrun::s3

#include "storage/run_objects.h"

#include <trainrun/error.h>

#include <fstream>
#include <iterator>

#include "common/atomic_file.h"
#include "storage/run_directory.h"

namespace trainrun {
namespace {

s3::Location run_location(const std::string& storage_url, const std::string& name) {
  auto location = s3::parse_url(storage_url);
  location.prefix = location.key(name);
  return location;
}

}  // namespace

const std::vector<std::string>& run_file_names() {
  static const std::vector<std::string> names = {
      run_directory::kRunInfoFile, run_directory::kResultsFile, run_directory::kProgressFile,
      run_directory::kCheckpointStateFile, run_directory::kErrorFile};
  return names;
}

RunObjects::RunObjects(const std::string& storage_url, const std::string& name,
                       s3::ClientOptions options)
    : config_(s3::resolve_config()),
      run_(run_location(storage_url, name)),
      client_(config_, run_.bucket, options) {}

std::string RunObjects::url(const std::string& relative) const {
  return relative.empty() ? run_.url() : run_.url() + "/" + relative;
}

std::string RunObjects::key(const std::string& relative) const { return run_.key(relative); }

void RunObjects::check_access() {
  try {
    client_.check_access(run_.prefix + "/");
  } catch (const s3::S3Error& e) {
    const auto& code = e.code();
    std::string why;
    if (code == "NoSuchBucket") {
      why = "bucket '" + run_.bucket + "' does not exist at " + config_.endpoint +
            " (create it first)";
    } else if (code == "AccessDenied" && config_.credentials) {
      why = "the credentials from " + config_.credentials_source +
            " are not allowed to list it (AccessDenied: the run needs s3:ListBucket, "
            "s3:GetObject, s3:PutObject, s3:DeleteObject and s3:AbortMultipartUpload)";
    } else if (code == "PermanentRedirect" || code == "AuthorizationHeaderMalformed" ||
               e.status() == 301) {
      why = "the bucket is in another region than " + config_.region +
            ": set AWS_REGION to the bucket's (" + code + ")";
    } else if (e.status() == 403 || code == "InvalidAccessKeyId" ||
               code == "SignatureDoesNotMatch") {
      why = config_.credentials
                ? "the credentials from " + config_.credentials_source + " were refused (" +
                      (code.empty() ? std::to_string(e.status()) : code) + ")"
                : "access denied without credentials: set AWS_ACCESS_KEY_ID and "
                  "AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials";
    } else {
      why = e.what();
    }
    throw UsageError("storage " + url() + ": " + why);
  }
}

void RunObjects::pull_run_files(const std::filesystem::path& dir) {
  for (const auto& name : run_file_names()) {
    auto bytes = get(name);
    std::error_code ec;
    if (bytes) {
      write_file_atomic(dir / name, *bytes);
    } else {
      std::filesystem::remove(dir / name, ec);
    }
  }
}

void RunObjects::push(const std::filesystem::path& dir, const std::string& relative) {
  std::ifstream in(dir / relative, std::ios::binary);
  if (!in) return;  // not written yet
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw IoError("cannot read " + (dir / relative).string());
  client_.put(key(relative), bytes);
}

void RunObjects::remove(const std::string& relative) { client_.remove(key(relative)); }

std::optional<std::string> RunObjects::get(const std::string& relative) {
  return client_.get(key(relative));
}

std::vector<s3::ObjectInfo> RunObjects::list(const std::string& relative_prefix) {
  auto objects = client_.list(key(relative_prefix));
  const auto strip = run_.prefix.size() + 1;
  for (auto& object : objects) object.key = object.key.substr(strip);
  return objects;
}

void RunObjects::discard(const std::string& relative_prefix) {
  remove(relative_prefix + run_directory::kManifestFile);
  std::vector<std::string> keys;
  for (const auto& object : list(relative_prefix)) keys.push_back(key(object.key));
  client_.remove_many(keys);
  for (const auto& upload : client_.list_multipart(key(relative_prefix))) {
    client_.abort_multipart(upload.key, upload.upload_id);
  }
}

}  // namespace trainrun

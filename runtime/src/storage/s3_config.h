#pragma once

// Where an s3:// storage path lives and how to reach it, resolved the way the
// AWS CLI and boto3 resolve it, so that a machine set up for them is set up
// for trainrun:
//
//   endpoint      AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's endpoint_url
//                 (config file), else https://s3.<region>.amazonaws.com
//   region        AWS_REGION, AWS_DEFAULT_REGION, the profile's region, else us-east-1
//   credentials   AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN),
//                 else the profile's in the shared credentials file
//   profile       AWS_PROFILE, else "default"; files AWS_SHARED_CREDENTIALS_FILE
//                 (~/.aws/credentials) and AWS_CONFIG_FILE (~/.aws/config)
//
// Addressing is path-style (<endpoint>/<bucket>/<key>), which every
// S3-compatible server takes. Credentials are resolved in each process that
// uses them and never leave it: not in a message, a log line, run.json or an
// error. Plain values; resolving reads the environment and files only.

#include <optional>
#include <string>

namespace trainrun::s3 {

/// s3://BUCKET/PREFIX: the bucket and the key prefix ("" or "a/b", no
/// leading or trailing '/').
struct Location {
  std::string bucket;
  std::string prefix;
  /// "s3://bucket/prefix".
  std::string url() const;
  /// The key of `relative` under the prefix.
  std::string key(const std::string& relative) const;
};

/// Whether `path` names object storage (starts with "s3://").
bool is_s3_url(const std::string& path);

/// Parses s3://BUCKET[/PREFIX]. Throws UsageError naming what is wrong: another
/// scheme, no bucket, a bucket name S3 refuses, "." or ".." in the prefix.
Location parse_url(const std::string& url);

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty unless temporary credentials
};

struct Config {
  std::string endpoint;  // scheme://host[:port], no trailing '/'
  std::string region;
  std::optional<Credentials> credentials;  // nothing: none found (requests go unsigned)
  std::string credentials_source;          // where they came from, for messages
};

/// Resolves the endpoint, region and credentials as above. Throws UsageError
/// for a malformed endpoint or a profile named by AWS_PROFILE that no file
/// has.
Config resolve_config();

}  // namespace trainrun::s3

// s3:// URLs and the AWS tools' way of finding the endpoint, region and
// credentials (storage/s3_config.h), and SigV4's URI encoding.

#include <trainrun/error.h>

#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "storage/s3_client.h"
#include "storage/s3_config.h"

using namespace trainrun;

namespace {

// Sets the AWS_* variables given (others unset) and HOME to `home` for its
// lifetime; restores what was there.
class AwsEnvironment {
 public:
  AwsEnvironment(const std::filesystem::path& home, std::map<std::string, std::string> values) {
    for (const char* name : kNames) {
      const char* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      ::unsetenv(name);
    }
    for (const auto& [name, value] : values) ::setenv(name.c_str(), value.c_str(), 1);
    ::setenv("HOME", home.c_str(), 1);
  }
  ~AwsEnvironment() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  static constexpr const char* kNames[] = {"AWS_ENDPOINT_URL",
                                           "AWS_ENDPOINT_URL_S3",
                                           "AWS_REGION",
                                           "AWS_DEFAULT_REGION",
                                           "AWS_ACCESS_KEY_ID",
                                           "AWS_SECRET_ACCESS_KEY",
                                           "AWS_SESSION_TOKEN",
                                           "AWS_PROFILE",
                                           "AWS_SHARED_CREDENTIALS_FILE",
                                           "AWS_CONFIG_FILE",
                                           "HOME"};
  std::map<std::string, std::optional<std::string>> saved_;
};

struct TempHome {
  TempHome() {
    char pattern[] = "/tmp/trainrun-s3home-XXXXXX";
    path = ::mkdtemp(pattern);
    std::filesystem::create_directories(path / ".aws");
  }
  ~TempHome() { std::filesystem::remove_all(path); }
  std::filesystem::path path;
};

}  // namespace

TEST_CASE("s3:// URLs give a bucket and a clean key prefix, and bad ones are refused") {
  auto location = s3::parse_url("s3://my-bucket/team//exp/");
  CHECK(location.bucket == "my-bucket");
  CHECK(location.prefix == "team/exp");
  CHECK(location.key("run/run.json") == "team/exp/run/run.json");
  CHECK(location.url() == "s3://my-bucket/team/exp");
  CHECK(s3::parse_url("s3://bucket").prefix.empty());
  CHECK(s3::parse_url("s3://bucket").key("a") == "a");
  CHECK_THROWS_AS(s3::parse_url("s3://"), UsageError);
  CHECK_THROWS_AS(s3::parse_url("s3://Upper/x"), UsageError);
  CHECK_THROWS_AS(s3::parse_url("s3://ab/x"), UsageError);
  CHECK_THROWS_AS(s3::parse_url("s3://bucket/a/../b"), UsageError);
  CHECK_THROWS_AS(s3::parse_url("s3://bucket/a\nb"), UsageError);
  CHECK_THROWS_AS(s3::parse_url("gs://bucket/a"), UsageError);
  CHECK(s3::is_s3_url("s3://b/x"));
  CHECK_FALSE(s3::is_s3_url("/data/s3://x"));
}

TEST_CASE("the endpoint, region and credentials come from where the AWS tools take them") {
  TempHome home;
  SUBCASE("the environment first") {
    std::ofstream(home.path / ".aws" / "credentials")
        << "[default]\naws_access_key_id = file-key\naws_secret_access_key = file-secret\n";
    AwsEnvironment env(home.path, {{"AWS_ENDPOINT_URL", "http://127.0.0.1:9000/"},
                                   {"AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9001"},
                                   {"AWS_DEFAULT_REGION", "eu-west-1"},
                                   {"AWS_ACCESS_KEY_ID", "env-key"},
                                   {"AWS_SECRET_ACCESS_KEY", "env-secret"},
                                   {"AWS_SESSION_TOKEN", "token"}});
    auto config = s3::resolve_config();
    CHECK(config.endpoint == "http://127.0.0.1:9001");  // the S3-specific one wins
    CHECK(config.region == "eu-west-1");
    REQUIRE(config.credentials);
    CHECK(config.credentials->access_key_id == "env-key");
    CHECK(config.credentials->session_token == "token");
    CHECK(config.credentials_source.find("environment") != std::string::npos);
  }
  SUBCASE("else ~/.aws/credentials and ~/.aws/config, for the profile named") {
    std::ofstream(home.path / ".aws" / "credentials")
        << "# comment\n[default]\naws_access_key_id=d\naws_secret_access_key=d\n"
           "[work]\n aws_access_key_id = work-key \naws_secret_access_key = work-secret\n";
    std::ofstream(home.path / ".aws" / "config")
        << "[default]\nregion = us-west-2\n[profile work]\nregion = ap-south-1\n"
           "endpoint_url = https://minio.example:9000\n";
    AwsEnvironment env(home.path, {{"AWS_PROFILE", "work"}});
    auto config = s3::resolve_config();
    CHECK(config.region == "ap-south-1");
    CHECK(config.endpoint == "https://minio.example:9000");
    REQUIRE(config.credentials);
    CHECK(config.credentials->access_key_id == "work-key");
    CHECK(config.credentials->secret_access_key == "work-secret");
    CHECK(config.credentials_source.find("profile 'work'") != std::string::npos);
  }
  SUBCASE("AWS's own endpoint by default, and no credentials where none are set") {
    AwsEnvironment env(home.path, {{"AWS_REGION", "eu-central-1"}});
    auto config = s3::resolve_config();
    CHECK(config.endpoint == "https://s3.eu-central-1.amazonaws.com");
    CHECK_FALSE(config.credentials);
  }
  SUBCASE("half of a key in the environment is refused, as botocore refuses it") {
    AwsEnvironment env(home.path, {{"AWS_ACCESS_KEY_ID", "only-the-id"}});
    CHECK_THROWS_WITH_AS(s3::resolve_config(),
                         "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not", UsageError);
  }
  SUBCASE("a profile no file has, and an endpoint that is not a URL, are refused") {
    {
      AwsEnvironment env(home.path, {{"AWS_PROFILE", "missing"}});
      CHECK_THROWS_AS(s3::resolve_config(), UsageError);
    }
    AwsEnvironment env(home.path, {{"AWS_ENDPOINT_URL", "ftp://host"}});
    CHECK_THROWS_AS(s3::resolve_config(), UsageError);
  }
}

TEST_CASE("keys and query values are encoded as SigV4 canonicalises them") {
  CHECK(s3::uri_encode("a/b c+d~e_f.g-h", true) == "a/b%20c%2Bd~e_f.g-h");
  CHECK(s3::uri_encode("a/b", false) == "a%2Fb");
  CHECK(s3::uri_encode("\xc3\xa9", true) == "%C3%A9");
}

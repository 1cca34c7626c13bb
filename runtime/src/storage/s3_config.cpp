#include "storage/s3_config.h"

#include <trainrun/error.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>

namespace trainrun::s3 {
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

std::string trim(const std::string& text) {
  auto begin = text.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  auto end = text.find_last_not_of(" \t\r");
  return text.substr(begin, end - begin + 1);
}

using Section = std::map<std::string, std::string>;

// The sections of an AWS shared file (INI: "[name]", "key = value", '#' and
// ';' comments). An absent file has none.
std::map<std::string, Section> read_ini(const std::string& path) {
  std::map<std::string, Section> sections;
  std::ifstream in(path);
  std::string line;
  Section* current = nullptr;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      current = &sections[trim(line.substr(1, line.size() - 2))];
      continue;
    }
    auto equals = line.find('=');
    if (current == nullptr || equals == std::string::npos) continue;
    (*current)[trim(line.substr(0, equals))] = trim(line.substr(equals + 1));
  }
  return sections;
}

std::string home_file(const char* variable, const char* relative) {
  auto named = env(variable);
  if (!named.empty()) return named;
  auto home = env("HOME");
  return home.empty() ? "" : home + "/" + relative;
}

std::string value_of(const Section* section, const char* key) {
  if (section == nullptr) return "";
  auto it = section->find(key);
  return it == section->end() ? "" : it->second;
}

bool valid_bucket(const std::string& bucket) {
  if (bucket.size() < 3 || bucket.size() > 63) return false;
  for (char c : bucket) {
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.')) {
      return false;
    }
  }
  return std::isalnum(static_cast<unsigned char>(bucket.front())) &&
         std::isalnum(static_cast<unsigned char>(bucket.back()));
}

}  // namespace

std::string Location::url() const {
  return "s3://" + bucket + (prefix.empty() ? "" : "/" + prefix);
}

std::string Location::key(const std::string& relative) const {
  return prefix.empty() ? relative : prefix + "/" + relative;
}

bool is_s3_url(const std::string& path) { return path.rfind("s3://", 0) == 0; }

Location parse_url(const std::string& url) {
  if (!is_s3_url(url)) throw UsageError("not an s3:// URL: " + url);
  auto rest = url.substr(5);
  auto slash = rest.find('/');
  Location location;
  location.bucket = rest.substr(0, slash);
  if (!valid_bucket(location.bucket)) {
    throw UsageError("storage path " + url + ": '" + location.bucket +
                     "' is not a bucket name (3-63 characters: a-z, 0-9, '-', '.')");
  }
  std::string prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
  std::string joined;
  size_t start = 0;
  while (start <= prefix.size()) {
    auto end = prefix.find('/', start);
    if (end == std::string::npos) end = prefix.size();
    auto part = prefix.substr(start, end - start);
    if (part == "." || part == "..") {
      throw UsageError("storage path " + url + ": '" + part + "' is not allowed in a key prefix");
    }
    if (!part.empty()) joined += (joined.empty() ? "" : "/") + part;
    start = end + 1;
  }
  for (unsigned char c : joined) {
    if (c < 0x20 || c == 0x7f)
      throw UsageError("storage path " + url + " holds a control character");
  }
  location.prefix = joined;
  return location;
}

Config resolve_config() {
  auto profile_name = env("AWS_PROFILE");
  const bool profile_named = !profile_name.empty();
  if (!profile_named) profile_name = "default";
  auto credentials_file = home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
  auto config_file = home_file("AWS_CONFIG_FILE", ".aws/config");
  auto credentials_ini =
      credentials_file.empty() ? decltype(read_ini("")){} : read_ini(credentials_file);
  auto config_ini = config_file.empty() ? decltype(read_ini("")){} : read_ini(config_file);
  auto find = [](auto& ini, const std::string& name) -> const Section* {
    auto it = ini.find(name);
    return it == ini.end() ? nullptr : &it->second;
  };
  const Section* profile_credentials = find(credentials_ini, profile_name);
  // The config file names profiles other than the default "profile NAME".
  const Section* profile_config = find(
      config_ini, profile_name == "default" ? std::string("default") : "profile " + profile_name);
  if (profile_named && profile_credentials == nullptr && profile_config == nullptr) {
    throw UsageError("AWS_PROFILE names profile '" + profile_name + "', which neither " +
                     credentials_file + " nor " + config_file + " has");
  }

  Config config;
  config.region = env("AWS_REGION");
  if (config.region.empty()) config.region = env("AWS_DEFAULT_REGION");
  if (config.region.empty()) config.region = value_of(profile_config, "region");
  if (config.region.empty()) config.region = "us-east-1";

  config.endpoint = env("AWS_ENDPOINT_URL_S3");
  if (config.endpoint.empty()) config.endpoint = env("AWS_ENDPOINT_URL");
  if (config.endpoint.empty()) config.endpoint = value_of(profile_config, "endpoint_url");
  if (config.endpoint.empty()) config.endpoint = "https://s3." + config.region + ".amazonaws.com";
  while (!config.endpoint.empty() && config.endpoint.back() == '/') config.endpoint.pop_back();
  if (config.endpoint.rfind("http://", 0) != 0 && config.endpoint.rfind("https://", 0) != 0) {
    throw UsageError("the S3 endpoint " + config.endpoint + " is not an http:// or https:// URL");
  }
  for (unsigned char c : config.endpoint) {
    if (c <= 0x20 || c == 0x7f)
      throw UsageError("the S3 endpoint holds a space or control character");
  }

  auto key_id = env("AWS_ACCESS_KEY_ID");
  auto secret = env("AWS_SECRET_ACCESS_KEY");
  if (key_id.empty() != secret.empty()) {  // as botocore's PartialCredentialsError
    throw UsageError(key_id.empty() ? "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not"
                                    : "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");
  }
  if (!key_id.empty()) {
    config.credentials = Credentials{key_id, secret, env("AWS_SESSION_TOKEN")};
    config.credentials_source = "the environment (AWS_ACCESS_KEY_ID)";
  } else {
    for (const Section* section : {profile_credentials, profile_config}) {
      auto file_key = value_of(section, "aws_access_key_id");
      auto file_secret = value_of(section, "aws_secret_access_key");
      if (file_key.empty() || file_secret.empty()) continue;
      config.credentials =
          Credentials{file_key, file_secret, value_of(section, "aws_session_token")};
      config.credentials_source = "profile '" + profile_name + "' of " +
                                  (section == profile_credentials ? credentials_file : config_file);
      break;
    }
  }
  return config;
}

}  // namespace trainrun::s3

#include "s3_server.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr int kSkipped = 77;
constexpr auto kStartTimeout = std::chrono::seconds(90);

std::string tool_path() { return std::string(TEST_SOURCE_DIR) + "/s3/s3tool.py"; }

}  // namespace

std::filesystem::path s3_venv() {
  const char* venv = std::getenv("TRAINRUN_S3_VENV");
  return venv != nullptr ? venv : "/opt/trainrun-s3";
}

S3Server::S3Server(std::filesystem::path dir) : dir_(std::move(dir)) {
  if (!std::filesystem::exists(s3_venv() / "bin" / "weed") ||
      !std::filesystem::exists(s3_venv() / "bin" / "python")) {
    std::printf("skipped: needs SeaweedFS's weed and boto3 in %s (tools/setup_s3.sh)\n",
                s3_venv().c_str());
    std::fflush(stdout);
    std::_Exit(kSkipped);
  }
  std::filesystem::create_directories(dir_);
  start();
}

void S3Server::start() {
  int in[2], out[2];
  REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  pid_ = ::fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    auto python = (s3_venv() / "bin" / "python").string();
    auto tool = tool_path();
    ::execl(python.c_str(), python.c_str(), tool.c_str(), "serve", dir_.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  stdin_ = in[1];
  // The endpoint, once the server makes buckets.
  std::string line;
  auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    pollfd p{out[0], POLLIN, 0};
    if (::poll(&p, 1, 500) <= 0) continue;
    char buffer[256];
    auto n = ::read(out[0], buffer, sizeof(buffer));
    if (n <= 0) break;
    line.append(buffer, static_cast<size_t>(n));
  }
  ::close(out[0]);
  REQUIRE_MESSAGE(line.find('\n') != std::string::npos,
                  "the S3 server did not start; see " << (dir_ / "weed.log").string());
  endpoint_ = line.substr(0, line.find('\n'));
  ::setenv("AWS_ENDPOINT_URL", endpoint_.c_str(), 1);
  ::setenv("AWS_ACCESS_KEY_ID", kAccessKey, 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", kSecretKey, 1);
  ::setenv("AWS_REGION", "us-east-1", 1);
  for (const char* name : {"AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3",
                           "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"}) {
    ::unsetenv(name);
  }
}

void S3Server::stop() {
  if (pid_ < 0) return;
  ::kill(pid_, SIGTERM);  // the tool kills weed's process group, then exits
  int status = 0;
  ::waitpid(pid_, &status, 0);
  ::close(stdin_);
  pid_ = -1;
}

S3Server::~S3Server() { stop(); }

std::string S3Server::tool(const std::string& args) const {
  auto line = "'" + (s3_venv() / "bin" / "python").string() + "' '" + tool_path() + "' " + args;
  std::FILE* pipe = ::popen(line.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) out.append(buffer.data(), n);
  int status = ::pclose(pipe);
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  REQUIRE_MESSAGE(ok, "s3tool " << args << " failed");
  return out;
}

#include "controller/controller_dir.h"

#include <trainrun/error.h>

#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstring>

namespace trainrun {
namespace {

constexpr const char* kPrefix = "trainrun-controller-";
constexpr const char* kSocket = "controller.sock";

// A directory whose socket path fits a socket address, or empty.
std::filesystem::path make_under(const std::filesystem::path& tmp) {
  auto pattern = (tmp / (kPrefix + std::to_string(::getpid()) + "-XXXXXX")).string();
  if ((pattern + "/" + kSocket).size() >= sizeof(sockaddr_un::sun_path)) return {};
  if (::mkdtemp(pattern.data()) == nullptr) return {};
  return pattern;  // mkdtemp makes it 0700
}

}  // namespace

ControllerDir::ControllerDir() {
  std::error_code ec;
  auto tmp = std::filesystem::temp_directory_path(ec);
  if (!ec) {
    remove_stale_controller_dirs(tmp);
    dir_ = make_under(tmp);
  }
  if (dir_.empty() && tmp != "/tmp") {
    remove_stale_controller_dirs("/tmp");
    dir_ = make_under("/tmp");
  }
  if (dir_.empty()) {
    throw IoError("cannot make the controller's private socket directory under " +
                  (ec ? std::string("the temporary directory") : tmp.string()) + " or /tmp: " +
                  std::strerror(errno) + "; set TMPDIR to a short, writable directory");
  }
}

ControllerDir::~ControllerDir() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string ControllerDir::endpoint() const { return "ipc://" + (dir_ / kSocket).string(); }

void remove_stale_controller_dirs(const std::filesystem::path& tmp) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(tmp, ec)) {
    auto name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    const char* digits = name.c_str() + std::strlen(kPrefix);
    const char* end = name.c_str() + name.size();
    pid_t pid = 0;
    auto [after, error] = std::from_chars(digits, end, pid);
    struct stat st {};
    if (error != std::errc() || after == end || *after != '-' || pid <= 0 ||
        ::lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != ::geteuid()) {
      continue;  // not one of ours
    }
    if (::kill(pid, 0) != 0 && errno == ESRCH) std::filesystem::remove_all(entry.path(), ec);
  }
}

}  // namespace trainrun

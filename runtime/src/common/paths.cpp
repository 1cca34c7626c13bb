#include "common/paths.h"

#include <trainrun/error.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "common/in_process.h"

// bin/ relative to lib/ in an installed prefix (set by the build).
#ifndef TRAINRUN_BIN_FROM_LIB
#define TRAINRUN_BIN_FROM_LIB "../bin"
#endif
// lib/ relative to bin/.
#ifndef TRAINRUN_LIB_FROM_BIN
#define TRAINRUN_LIB_FROM_BIN "../lib"
#endif

namespace trainrun {

std::filesystem::path default_cache_dir() {
  if (const char* dir = std::getenv("TRAINRUN_CACHE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::filesystem::path(xdg) / "trainrun";
  }
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home != nullptr ? home : "/tmp") / ".cache" / "trainrun";
}

namespace {

std::filesystem::path find_executable(const char* kName) {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto beside = self.parent_path() / kName;
    if (::access(beside.c_str(), X_OK) == 0) return beside;
  }
  // The image this code is in: libtrainrun.so inside a host program, which
  // finds the worker beside it (a build tree) or in the prefix's bin/.
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&default_cache_dir), &info) != 0 &&
      info.dli_fname != nullptr) {
    auto image = std::filesystem::weakly_canonical(info.dli_fname, ec);
    if (!ec) {
      for (const auto& dir : {image.parent_path(), image.parent_path() / TRAINRUN_BIN_FROM_LIB}) {
        auto candidate = (dir / kName).lexically_normal();
        if (::access(candidate.c_str(), X_OK) == 0) return candidate;
      }
    }
  }
  if (const char* path = std::getenv("PATH")) {
    std::istringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
      auto candidate = std::filesystem::path(dir) / kName;
      if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  throw UsageError(std::string("cannot find the ") + kName +
                   " executable beside this program or on PATH");
}

}  // namespace

std::filesystem::path find_worker_executable() { return find_executable("trainrun-worker"); }

std::filesystem::path find_trainrun_executable() { return find_executable("trainrun"); }

std::filesystem::path find_in_process_module(const std::filesystem::path& worker_executable) {
  const auto bin = worker_executable.parent_path();
  for (const auto& dir : {bin, bin / TRAINRUN_LIB_FROM_BIN / "trainrun"}) {
    auto candidate = (dir / kInProcessModule).lexically_normal();
    if (::access(candidate.c_str(), R_OK) == 0) return candidate;
  }
  throw UsageError(std::string("cannot find ") + kInProcessModule +
                   ", which runs a train function "
                   "in this process, beside " +
                   worker_executable.string() + " or in " +
                   (bin / TRAINRUN_LIB_FROM_BIN / "trainrun").lexically_normal().string());
}

std::filesystem::path make_temp_dir(const std::string& prefix) {
  auto pattern = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw IoError("cannot create a temporary directory: " + std::string(std::strerror(errno)));
  }
  return pattern;
}

}  // namespace trainrun

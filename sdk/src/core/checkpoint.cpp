#include <train/checkpoint.h>

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/host.h"

namespace train {

Checkpoint Checkpoint::from_directory(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    throw std::invalid_argument("checkpoint directory " + path.string() + " does not exist");
  }
  return Checkpoint(std::filesystem::absolute(path));
}

TempDir::TempDir() {
  auto pattern = (std::filesystem::temp_directory_path() / "trainrun-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("cannot create a temporary directory: " +
                             std::string(std::strerror(errno)));
  }
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void report(const Metrics& metrics, const Checkpoint& checkpoint,
            CheckpointUploadMode upload_mode) {
  detail::report_with(
      metrics, checkpoint.path().c_str(),
      upload_mode == CheckpointUploadMode::kAsync ? TRAIN_UPLOAD_ASYNC : TRAIN_UPLOAD_SYNC);
}

std::optional<Checkpoint> get_checkpoint() {
  const auto& host = detail::current_host("train::get_checkpoint");
  std::vector<char> path(4096, '\0');
  char error[1024] = {0};
  if (host.get_checkpoint(host.handle, path.data(), path.size(), error, sizeof(error)) != 0) {
    throw std::runtime_error(std::string("train::get_checkpoint failed: ") + error);
  }
  if (path[0] == '\0') return std::nullopt;
  return Checkpoint::from_directory(path.data());
}

}  // namespace train

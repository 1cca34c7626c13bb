#pragma once

// The controller's private directory, <tmp>/trainrun-controller-<pid>-XXXXXX,
// mode 0700: the Unix socket local workers connect to (no other user can
// reach it), and a scratch directory per worker, which is the worker's TMPDIR
// (train::TempDir, fetched checkpoints) and is removed when the worker ends,
// however it ends. The whole directory goes with the controller; directories
// that dead controllers left behind are removed when the next one starts.
// Owned by the controller's thread.

#include <filesystem>
#include <string>

namespace trainrun {

class ControllerDir {
 public:
  /// Makes the directory under the temporary directory, or under /tmp when
  /// that path is too long for a socket address. Throws IoError when neither
  /// can be made: the controller never falls back to a port others can reach.
  ControllerDir();
  ~ControllerDir();
  ControllerDir(const ControllerDir&) = delete;
  ControllerDir& operator=(const ControllerDir&) = delete;

  const std::filesystem::path& path() const { return dir_; }
  /// The ROUTER's endpoint: ipc://<dir>/controller.sock.
  std::string endpoint() const;

 private:
  std::filesystem::path dir_;
};

/// Removes the trainrun-controller-<pid>-* directories under `tmp` whose
/// controller is no longer running.
void remove_stale_controller_dirs(const std::filesystem::path& tmp);

}  // namespace trainrun

#pragma once

// Forwards one worker's stdout and stderr, line by line, to the controller's
// terminal (prefixed with rank, pid and host) and to logs/worker-<rank>.log,
// which is created with the worker's first line: a thousand silent workers cost
// no thousand files. A local worker's output is read from its pipes; a remote
// one's arrives from its node agent (feed). It owns a local worker's pipes and
// closes each at its EOF. Owned by the controller's single thread.

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/crash_report.h"
#include "common/fd.h"

namespace trainrun {

/// Where a worker's prefixed lines go besides its log: stream 0 (stdout) or 1
/// (stderr), and the line without its newline. Empty: nowhere.
using LineEcho = std::function<void(int stream, std::string_view line)>;

class WorkerOutput {
 public:
  /// Reads a local worker's pipes (none for output that only feed() brings),
  /// closing each at its EOF.
  WorkerOutput(Fd stdout_fd, Fd stderr_fd, std::string prefix,
               const std::filesystem::path& log_file, LineEcho echo);
  ~WorkerOutput();
  WorkerOutput(const WorkerOutput&) = delete;
  WorkerOutput& operator=(const WorkerOutput&) = delete;

  /// Reads what is available on stream 0 (stdout) or 1 (stderr); closes it at EOF.
  void read(int stream);
  /// Takes bytes the worker wrote on stream 0 or 1 (from its node agent).
  void feed(int stream, const char* data, size_t size);
  /// Reads both streams until EOF or until nothing more is waiting.
  void drain();
  /// Changes the prefix once the worker's rank is known.
  void set_prefix(std::string prefix) { prefix_ = std::move(prefix); }
  /// Writes the log to `path` from now on, appending what it has written to it.
  void move_log(const std::filesystem::path& path);
  /// The frames of the last crash the worker wrote on stderr, innermost
  /// first, when it was of `signal` (signal_description's words).
  std::vector<std::string> crash_frames(std::string_view signal) const {
    return crash_.frames_of(signal);
  }

 private:
  struct Stream {
    Fd fd;  // none for a remote worker, and once at EOF
    std::string partial;
  };
  void emit(int stream, const std::string& line);
  void write_line(int stream, std::string_view line);

  Stream streams_[2];
  std::string prefix_;
  std::filesystem::path log_path_;
  std::FILE* log_ = nullptr;
  LineEcho echo_;
  CrashReport crash_;
};

}  // namespace trainrun

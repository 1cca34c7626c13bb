#include "controller/worker_output.h"

#include <unistd.h>

#include <cerrno>
#include <utility>

namespace trainrun {

WorkerOutput::WorkerOutput(int stdout_fd, int stderr_fd, std::string prefix,
                           const std::filesystem::path& log_file, bool echo)
    : prefix_(std::move(prefix)), echo_(echo) {
  streams_[0].fd = stdout_fd;
  streams_[1].fd = stderr_fd;
  log_ = std::fopen(log_file.c_str(), "a");
}

WorkerOutput::~WorkerOutput() {
  for (auto& stream : streams_) {
    if (!stream.partial.empty()) emit(static_cast<int>(&stream - streams_), stream.partial);
    if (stream.fd >= 0) ::close(stream.fd);
  }
  if (log_ != nullptr) std::fclose(log_);
}

void WorkerOutput::read(int index) {
  auto& stream = streams_[index];
  if (stream.fd < 0) return;
  char buffer[16384];
  while (true) {
    ssize_t n = ::read(stream.fd, buffer, sizeof(buffer));
    if (n > 0) {
      stream.partial.append(buffer, static_cast<size_t>(n));
      size_t start = 0, end;
      while ((end = stream.partial.find('\n', start)) != std::string::npos) {
        emit(index, stream.partial.substr(start, end - start));
        start = end + 1;
      }
      stream.partial.erase(0, start);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    // EOF or a read error: the worker is gone.
    if (!stream.partial.empty()) emit(index, std::exchange(stream.partial, {}));
    ::close(stream.fd);
    stream.fd = -1;
    return;
  }
}

void WorkerOutput::drain() {
  read(0);
  read(1);
}

void WorkerOutput::emit(int stream, const std::string& line) {
  if (echo_) {
    std::FILE* out = stream == 0 ? stdout : stderr;
    std::fprintf(out, "%s %s\n", prefix_.c_str(), line.c_str());
    std::fflush(out);
  }
  if (log_ != nullptr) {
    std::fprintf(log_, "%s\n", line.c_str());
    std::fflush(log_);
  }
}

}  // namespace trainrun

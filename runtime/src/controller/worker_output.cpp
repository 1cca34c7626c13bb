#include "controller/worker_output.h"

#include <trainrun/error.h>

#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <utility>

namespace trainrun {
namespace {

// A line longer than this is forwarded in pieces of this size, so that the
// controller holds at most this much of a worker's output.
constexpr size_t kMaxLine = 64 * 1024;

}  // namespace

WorkerOutput::WorkerOutput(Fd stdout_fd, Fd stderr_fd, std::string prefix,
                           const std::filesystem::path& log_file, LineEcho echo)
    : prefix_(std::move(prefix)), log_path_(log_file), echo_(std::move(echo)) {
  streams_[0].fd = std::move(stdout_fd);
  streams_[1].fd = std::move(stderr_fd);
}

WorkerOutput::~WorkerOutput() {
  for (auto& stream : streams_) {
    if (!stream.partial.empty()) emit(static_cast<int>(&stream - streams_), stream.partial);
  }
  if (log_ != nullptr) std::fclose(log_);
}

void WorkerOutput::read(int index) {
  auto& stream = streams_[index];
  if (!stream.fd) return;
  char buffer[16384];
  // At most this much a call: a worker that writes faster than it can be
  // forwarded must not keep the loop from its sockets (epoll is level-triggered,
  // so the rest comes on the next pass).
  for (size_t budget = 16 * sizeof(buffer); budget > 0; budget -= sizeof(buffer)) {
    ssize_t n = ::read(stream.fd.get(), buffer, sizeof(buffer));
    if (n > 0) {
      feed(index, buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    // EOF or a read error: the worker is gone.
    if (!stream.partial.empty()) emit(index, std::exchange(stream.partial, {}));
    stream.fd.reset();
    return;
  }
}

void WorkerOutput::feed(int index, const char* data, size_t size) {
  auto& stream = streams_[index];
  // Only the new bytes are searched: a worker that writes without a newline
  // must not make each read rescan everything it wrote.
  size_t start = 0, end, from = stream.partial.size();
  stream.partial.append(data, size);
  while ((end = stream.partial.find('\n', from)) != std::string::npos) {
    emit(index, stream.partial.substr(start, end - start));
    start = from = end + 1;
  }
  stream.partial.erase(0, start);
  if (stream.partial.size() >= kMaxLine) emit(index, std::exchange(stream.partial, {}));
}

void WorkerOutput::drain() {
  read(0);
  read(1);
}

void WorkerOutput::move_log(const std::filesystem::path& path) {
  if (log_ != nullptr) {
    // Appended, not renamed: a rerun's log of the same name continues.
    std::fclose(log_);
    log_ = nullptr;
    std::ifstream from(log_path_, std::ios::binary);
    std::ofstream to(path, std::ios::binary | std::ios::app);
    to << from.rdbuf();
    if (!to) return;  // it keeps its name; the terminal has the rank
    std::error_code ec;
    std::filesystem::remove(log_path_, ec);
  }
  log_path_ = path;  // opened with the next line
}

void WorkerOutput::emit(int stream, const std::string& line) {
  // A progress line ("\r 40%\r 50%") shows what a terminal would: the text
  // after the last carriage return, after its prefix (a line ending "\r\n"
  // loses the '\r'). Otherwise it would overwrite the prefix.
  std::string_view text = line;
  while (!text.empty() && text.back() == '\r') text.remove_suffix(1);
  if (auto cr = text.rfind('\r'); cr != std::string_view::npos) text.remove_prefix(cr + 1);
  if (stream == 1) crash_.take(text);
  write_line(stream, text);
}

void WorkerOutput::write_line(int stream, std::string_view line) {
  // The log first: it has every line, whatever the terminal's side does.
  if (log_ == nullptr && !log_path_.empty()) {
    log_ = std::fopen(log_path_.c_str(), "a");
    if (log_ == nullptr) log_path_.clear();  // unwritable: the terminal still has it
  }
  if (log_ != nullptr) {
    std::fprintf(log_, "%.*s\n", static_cast<int>(line.size()), line.data());
    std::fflush(log_);
  }
  if (echo_) {
    std::string shown = prefix_;
    shown += ' ';
    shown.append(line.data(), line.size());
    echo_(stream, shown);
  }
}

}  // namespace trainrun

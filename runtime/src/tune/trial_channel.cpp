#include "tune/trial_channel.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace trainrun::tune {
namespace {

using Clock = std::chrono::steady_clock;

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

}  // namespace

LineChannel::LineChannel(Fd fd) : fd_(std::move(fd)) {
  const int flags = ::fcntl(fd_.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd_.get(), F_SETFL, flags | O_NONBLOCK) < 0) {
    throw IoError(std::string("tuner channel: ") + std::strerror(errno));
  }
}

void LineChannel::send(const nlohmann::json& message, std::chrono::milliseconds timeout) {
  const std::string line =
      message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const auto deadline = Clock::now() + timeout;
  size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = ::send(fd_.get(), line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_.get(), POLLOUT, 0};
      const int left = remaining_ms(deadline);
      if (left == 0) throw IoError("tuner channel: the peer reads nothing");
      ::poll(&p, 1, left);
      continue;
    }
    throw IoError(std::string("tuner channel: ") + std::strerror(errno));
  }
}

bool LineChannel::fill() {
  char chunk[65536];
  bool got = false;
  while (!eof_) {
    const ssize_t n = ::read(fd_.get(), chunk, sizeof(chunk));
    if (n > 0) {
      buffer_.append(chunk, static_cast<size_t>(n));
      got = true;
      if (buffer_.size() > kMostLine && buffer_.find('\n') == std::string::npos) {
        throw IoError("tuner channel: a line over 1 MiB");
      }
      continue;
    }
    if (n == 0) {
      eof_ = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    if (errno == ECONNRESET) {
      eof_ = true;
      break;
    }
    throw IoError(std::string("tuner channel: ") + std::strerror(errno));
  }
  return got;
}

std::optional<nlohmann::json> LineChannel::next_line() {
  const auto newline = buffer_.find('\n');
  if (newline == std::string::npos) return std::nullopt;
  if (newline > kMostLine) throw IoError("tuner channel: a line over 1 MiB");
  auto message = nlohmann::json::parse(buffer_.begin(), buffer_.begin() + newline, nullptr, false);
  buffer_.erase(0, newline + 1);
  if (!message.is_object()) throw IoError("tuner channel: a line that is not a JSON object");
  return message;
}

std::optional<nlohmann::json> LineChannel::receive(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (auto message = next_line()) return message;
    if (eof_) return std::nullopt;
    if (fill()) continue;
    if (eof_) continue;
    const int left = remaining_ms(deadline);
    if (left == 0) return std::nullopt;
    pollfd p{fd_.get(), POLLIN, 0};
    ::poll(&p, 1, left);
  }
}

std::vector<nlohmann::json> LineChannel::drain() {
  fill();
  std::vector<nlohmann::json> messages;
  while (auto message = next_line()) messages.push_back(std::move(*message));
  return messages;
}

}  // namespace trainrun::tune

#pragma once

// The socket between the tuner and a trial's process (a socketpair, the
// trial's end as its descriptor 3): one JSON object per line, each way.
//   tuner -> trial   {"options": TrainerOptions}     first, once
//   trial -> tuner   {"report": ReportRecord}        at each report, then waits
//   tuner -> trial   {"verdict": "continue"} or {"verdict": "stop", "reason": "..."}
// Each side treats the other's bytes as untrusted: a line over kMostLine or
// that is not a JSON object ends the channel with an error.

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "common/fd.h"

namespace trainrun::tune {

/// The trial's end of the channel, as its process finds it.
inline constexpr int kTrialChannelFd = 3;
inline constexpr size_t kMostLine = size_t{1} << 20;

class LineChannel {
 public:
  explicit LineChannel(Fd fd);

  int fd() const { return fd_.get(); }

  /// Writes one message and its newline, waiting up to `timeout` for room.
  /// Throws IoError (a closed peer, the time out).
  void send(const nlohmann::json& message, std::chrono::milliseconds timeout);
  /// The next message, waiting up to `timeout`; nothing on a time out or at
  /// the end (eof() tells which). Throws IoError on a malformed line.
  std::optional<nlohmann::json> receive(std::chrono::milliseconds timeout);
  /// The complete messages that have arrived, without waiting. Throws IoError
  /// on a malformed line.
  std::vector<nlohmann::json> drain();
  /// Whether the peer has closed its end.
  bool eof() const { return eof_; }

 private:
  // Reads what there is (non-blocking); false when nothing.
  bool fill();
  std::optional<nlohmann::json> next_line();

  Fd fd_;
  std::string buffer_;
  bool eof_ = false;
};

}  // namespace trainrun::tune

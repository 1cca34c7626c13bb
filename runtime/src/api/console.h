#pragma once

// The run's terminal, when no host callback takes its lines: the controller's
// lines and worker output scroll, and with a live status line (a TTY) one
// line stays below them, the run's progress. Each line first erases the
// status line, then draws it again under itself; nothing but whole lines
// reaches a pipe or a file. fit() owns it; every method takes its mutex, so
// the logger's sink and the output echo may call it from any thread. Writes
// are synchronous, as the controller's log lines always were: a terminal that
// stops reading (Ctrl-S) stalls the controller's loop.

#include <spdlog/sinks/base_sink.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace trainrun {

class Console {
 public:
  /// `live`: keep a status line (stdout is a terminal); `color`: errors in red.
  Console(bool live, bool color) : live_(live), color_(color) {}
  ~Console() { clear(); }
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  /// Whether stdout is a terminal that can keep a status line.
  static bool stdout_is_terminal();

  bool live() const { return live_; }
  /// Writes one whole line to stdout (stream 0) or stderr (1), above the
  /// status line.
  void line(int stream, std::string_view text);
  /// Replaces the status line (drawn at most ten times a second); `text`
  /// fits status_width().
  void status(std::string text);
  /// Erases the status line for good: the run is over.
  void clear();
  /// The columns a status line may use: one short of the terminal's width (a
  /// line that fills it wraps on some terminals).
  static size_t status_width();
  /// A spdlog sink whose lines go through line(), to stdout (errors in red,
  /// warnings in yellow, with color).
  std::shared_ptr<spdlog::sinks::sink> sink();

 private:
  using Clock = std::chrono::steady_clock;
  void erase();  // with mutex_ held
  void draw();   // with mutex_ held

  const bool live_;
  const bool color_;
  std::mutex mutex_;
  std::string status_;
  bool shown_ = false;
  Clock::time_point drawn_at_{};
};

}  // namespace trainrun

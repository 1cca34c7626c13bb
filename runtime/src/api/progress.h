#pragma once

// The run's progress as people see it: rank 0's loader samples (from the
// controller) become a Progress with a rate and an ETA, and a Progress
// becomes the terminal's status line or a plain progress line. Pure; one
// owner, the thread that runs fit().

#include <trainrun/trainer.h>

#include <chrono>
#include <deque>
#include <optional>
#include <string>

#include "controller/controller.h"

namespace trainrun {

class ProgressTracker {
 public:
  using Clock = std::chrono::steady_clock;

  /// `epochs`: the run's planned epochs (config "epochs"), 0 when unknown.
  ProgressTracker(int64_t epochs, Clock::time_point start) : epochs_(epochs), start_(start) {}

  /// The run's config "epochs" when it is a positive integer, else 0.
  static int64_t planned_epochs(const nlohmann::json& config);

  /// Takes a sample; returns where the run is now.
  Progress update(const ProgressSample& sample, Clock::time_point now);
  /// The latest report's metrics go into what follows.
  void set_metrics(const nlohmann::json& metrics) { metrics_ = metrics; }

 private:
  /// How far back the rates look.
  static constexpr auto kWindow = std::chrono::seconds(10);
  struct Point {
    Clock::time_point at;
    int64_t steps;
    int64_t samples;
  };
  int64_t epochs_;
  Clock::time_point start_;
  int attempt_ = 0;
  std::deque<Point> window_;
  nlohmann::json metrics_;
};

/// "1:02:03", "4:05": hours only when there are some.
std::string format_duration(double seconds);

/// The terminal's status line, at most `width` columns: epoch, a bar of the
/// epoch's batches, samples/s, the latest metrics (as many as fit), elapsed
/// time and ETA.
std::string status_line(const Progress& progress, size_t width);

/// The line printed every progress interval without a terminal.
std::string progress_line(const Progress& progress);

}  // namespace trainrun

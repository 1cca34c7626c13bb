#include "api/progress.h"

#include <cmath>
#include <cstdio>

#include "common/metrics_format.h"

namespace trainrun {

int64_t ProgressTracker::planned_epochs(const nlohmann::json& config) {
  auto it = config.find("epochs");
  if (it == config.end() || !it->is_number_integer()) return 0;
  auto epochs = it->get<int64_t>();
  return epochs > 0 ? epochs : 0;
}

Progress ProgressTracker::update(const ProgressSample& sample, Clock::time_point now) {
  // A new attempt starts its counts again.
  if (sample.attempt != attempt_ || (!window_.empty() && sample.steps < window_.back().steps)) {
    window_.clear();
    attempt_ = sample.attempt;
  }
  window_.push_back({now, sample.steps, sample.samples});
  while (window_.size() > 2 && now - window_[1].at >= kWindow) window_.pop_front();

  Progress p;
  p.attempt = sample.attempt;
  p.world_size = sample.world_size;
  p.epoch = sample.epoch;
  p.epochs = epochs_;
  p.batch = sample.batch;
  p.batches = sample.batches;
  p.steps = sample.steps;
  p.elapsed_seconds = std::chrono::duration<double>(now - start_).count();
  p.metrics = metrics_;
  const auto& first = window_.front();
  const double seconds = std::chrono::duration<double>(now - first.at).count();
  if (seconds > 0 && sample.steps > first.steps) {  // a rate; an ETA needs the batches too
    const double steps_per_second = static_cast<double>(sample.steps - first.steps) / seconds;
    p.samples_per_second =
        static_cast<double>(sample.samples - first.samples) * sample.world_size / seconds;
    if (sample.batches > 0) {
      double remaining = static_cast<double>(sample.batches - sample.batch);
      if (epochs_ > 0 && sample.epoch + 1 < epochs_) {
        remaining +=
            static_cast<double>(epochs_ - sample.epoch - 1) * static_cast<double>(sample.batches);
      }
      p.eta_seconds = remaining / steps_per_second;
    }
  }
  return p;
}

std::string format_duration(double seconds) {
  // Beyond 99999 hours (or not a number) the clock stops: nobody waits that long.
  constexpr double kMost = 99999.0 * 3600;
  if (!(seconds < kMost)) seconds = kMost;
  auto total = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char out[32];
  if (total >= 3600) {
    std::snprintf(out, sizeof(out), "%lld:%02lld:%02lld", static_cast<long long>(total / 3600),
                  static_cast<long long>(total / 60 % 60), static_cast<long long>(total % 60));
  } else {
    std::snprintf(out, sizeof(out), "%lld:%02lld", static_cast<long long>(total / 60),
                  static_cast<long long>(total % 60));
  }
  return out;
}

namespace {

// "epoch 3/10" (counted from 1 for people) or "epoch 3".
std::string epoch_text(const Progress& p) {
  auto text = "epoch " + std::to_string(p.epoch + 1);
  if (p.epochs > 0 && p.epoch < p.epochs) text += "/" + std::to_string(p.epochs);
  return text;
}

// "3/8", or "3" when the batches are not known.
std::string batch_text(const Progress& p) {
  auto text = std::to_string(p.batch);
  if (p.batches > 0) text += "/" + std::to_string(p.batches);
  return text;
}

std::string rate_text(const Progress& p) {
  char out[48];
  if (p.samples_per_second >= 10000) {
    std::snprintf(out, sizeof(out), "%.1fk samples/s", p.samples_per_second / 1000);
  } else {
    std::snprintf(out, sizeof(out), "%.0f samples/s", p.samples_per_second);
  }
  return out;
}

std::string times_text(const Progress& p) {
  auto text = format_duration(p.elapsed_seconds);
  if (p.eta_seconds) {
    text += (p.epochs > 0 ? "  ETA " : "  epoch ETA ") + format_duration(*p.eta_seconds);
  }
  return text;
}

// Text from a worker on the status line: printable ASCII only, so that an
// escape sequence in a metric's name does nothing, and a byte is a column
// (the line must never wrap: "\r" would then erase only its last row).
std::string printable(std::string text) {
  for (auto& c : text) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) c = '?';
  }
  return text;
}

}  // namespace

std::string status_line(const Progress& p, size_t width) {
  constexpr size_t kBar = 20;
  auto head = epoch_text(p);
  if (p.batches > 0) {
    const auto filled = std::min(kBar, static_cast<size_t>(kBar * static_cast<double>(p.batch) /
                                                           static_cast<double>(p.batches)));
    head +=
        " [" + std::string(filled, '#') + std::string(kBar - filled, '-') + "] " + batch_text(p);
  } else {
    head += "  batch " + batch_text(p);
  }
  if (p.samples_per_second > 0) head += "  " + rate_text(p);
  auto tail = "  " + times_text(p);
  // Metrics in the middle, as many whole ones as fit.
  std::string middle;
  if (p.metrics.is_object()) {
    for (const auto& [name, value] : p.metrics.items()) {
      auto item = printable("  " + name + "=" + format_value(value));
      if (head.size() + middle.size() + item.size() + tail.size() > width) break;
      middle += item;
    }
  }
  auto line = head + middle + tail;
  if (line.size() > width) line.resize(width);
  return line;
}

std::string progress_line(const Progress& p) {
  auto line = "progress: " + epoch_text(p) + ", batch " + batch_text(p);
  if (p.samples_per_second > 0) line += ", " + rate_text(p);
  line += ", elapsed " + format_duration(p.elapsed_seconds);
  if (p.eta_seconds) {
    line += (p.epochs > 0 ? ", ETA " : ", epoch ETA ") + format_duration(*p.eta_seconds);
  }
  return line;
}

}  // namespace trainrun

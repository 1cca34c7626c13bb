// FIFO, and what the schedulers share.

#include "tune/scheduler.h"

#include <trainrun/error.h>

#include <algorithm>
#include <cmath>

#include "tune/asha.h"
#include "tune/pbt.h"

namespace trainrun::tune {
namespace {

// Every trial runs to its end.
class Fifo final : public Scheduler {
 public:
  Decision on_report(const TrialReport&, const std::vector<TrialView>&) override { return {}; }
  nlohmann::json state() const override { return nlohmann::json::object(); }
  void restore(const nlohmann::json&) override {}
};

}  // namespace

std::string trial_name(size_t trial) {
  std::string digits = std::to_string(trial);
  if (digits.size() < 4) digits.insert(0, 4 - digits.size(), '0');
  return "trial_" + digits;
}

std::optional<double> report_value(const TrialReport& report, const std::string& attr) {
  if (attr == "training_iteration") return static_cast<double>(report.iteration);
  if (!report.metrics.is_object()) return std::nullopt;
  auto it = report.metrics.find(attr);
  if (it == report.metrics.end()) return std::nullopt;
  if (it->is_boolean()) return it->get<bool>() ? 1.0 : 0.0;
  if (!it->is_number()) return std::nullopt;
  const double value = it->get<double>();
  if (std::isnan(value)) return std::nullopt;
  return value;
}

double percentile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const double position = q / 100.0 * static_cast<double>(values.size() - 1);
  const auto below = static_cast<size_t>(std::floor(position));
  const size_t above = std::min(below + 1, values.size() - 1);
  const double fraction = position - static_cast<double>(below);
  return values[below] + (values[above] - values[below]) * fraction;
}

std::unique_ptr<Scheduler> make_scheduler(const TuneConfig& tune, const ParamSpace& space) {
  switch (tune.scheduler) {
    case SchedulerKind::kFifo: return std::make_unique<Fifo>();
    case SchedulerKind::kAsha: return std::make_unique<Asha>(tune);
    case SchedulerKind::kPbt: return std::make_unique<Pbt>(tune, space);
  }
  throw UsageError("unknown scheduler");
}

}  // namespace trainrun::tune

#include "tune/asha.h"

#include <trainrun/error.h>

#include <cmath>
#include <sstream>

namespace trainrun::tune {
namespace {

std::string format(double value) {
  std::ostringstream out;
  out.precision(6);
  out << value;
  return out.str();
}

}  // namespace

Asha::Asha(const TuneConfig& tune)
    : config_(tune.asha), metric_(tune.metric), sign_(tune.max ? 1.0 : -1.0) {
  const auto& c = config_;
  if (!(c.grace_period > 0) || !(c.max_t >= c.grace_period) || !std::isfinite(c.max_t)) {
    throw UsageError("ASHA needs 0 < grace_period <= max_t");
  }
  if (!(c.reduction_factor > 1) || !std::isfinite(c.reduction_factor)) {
    throw UsageError("ASHA needs a reduction_factor above 1");
  }
  if (c.time_attr.empty()) throw UsageError("ASHA needs a time_attr");
  // As Ray counts them, from the highest; a bounded number.
  constexpr double kMostRungs = 64;
  const double rungs = std::log(c.max_t / c.grace_period) / std::log(c.reduction_factor) + 1;
  if (!(rungs <= kMostRungs)) {
    throw UsageError("ASHA would make more than 64 rungs: raise reduction_factor or grace_period");
  }
  const int count = static_cast<int>(rungs);
  for (int k = count - 1; k >= 0; --k) {
    rungs_.push_back(Rung{c.grace_period * std::pow(c.reduction_factor, k), {}});
  }
}

std::vector<double> Asha::milestones() const {
  std::vector<double> out;
  for (const auto& rung : rungs_) out.push_back(rung.milestone);
  return out;
}

Decision Asha::record(size_t trial, double time, double score) {
  for (auto& rung : rungs_) {
    if (time < rung.milestone || rung.recorded.count(trial) != 0) continue;
    Decision decision;
    if (!rung.recorded.empty()) {
      std::vector<double> scores;
      for (const auto& [other, value] : rung.recorded) scores.push_back(value);
      const double cutoff = percentile(scores, (1 - 1 / config_.reduction_factor) * 100);
      if (score < cutoff) {
        decision.action = Decision::Action::kStop;
        decision.reason = "ASHA at " + config_.time_attr + " " + format(rung.milestone) + ": " +
                          metric_ + " " + format(sign_ * score) + " is " +
                          (sign_ > 0 ? "below" : "above") + " the rung's cutoff " +
                          format(sign_ * cutoff);
      }
    }
    rung.recorded[trial] = score;
    return decision;
  }
  return {};
}

Decision Asha::on_report(const TrialReport& report, const std::vector<TrialView>&) {
  const auto time = report_value(report, config_.time_attr);
  const auto score = report_value(report, metric_);
  if (!time || !score) return {};
  if (*time >= config_.max_t) {
    Decision done;
    done.action = Decision::Action::kStop;
    done.reason = "reached ASHA's max_t " + format(config_.max_t);
    done.finished = true;
    return done;
  }
  return record(report.trial, *time, sign_ * *score);
}

void Asha::on_trial_end(const TrialReport& last) {
  // As Ray's on_trial_complete: its last score counts at the rung it reached.
  const auto time = report_value(last, config_.time_attr);
  const auto score = report_value(last, metric_);
  if (time && score) record(last.trial, *time, sign_ * *score);
}

nlohmann::json Asha::state() const {
  auto rungs = nlohmann::json::array();
  for (const auto& rung : rungs_) {
    auto recorded = nlohmann::json::object();
    for (const auto& [trial, score] : rung.recorded) recorded[std::to_string(trial)] = score;
    rungs.push_back({{"milestone", rung.milestone}, {"recorded", recorded}});
  }
  return {{"rungs", rungs}};
}

void Asha::restore(const nlohmann::json& state) {
  try {
    const auto& rungs = state.at("rungs");
    if (!rungs.is_array() || rungs.size() != rungs_.size()) {
      throw IoError("ASHA's recorded rungs are not this experiment's");
    }
    for (size_t i = 0; i < rungs_.size(); ++i) {
      rungs_[i].recorded.clear();
      for (const auto& [trial, score] : rungs[i].at("recorded").items()) {
        rungs_[i].recorded[std::stoul(trial)] = score.get<double>();
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw IoError(std::string("ASHA's recorded state is malformed: ") + e.what());
  } catch (const std::logic_error& e) {  // stoul
    throw IoError("ASHA's recorded state is malformed: a trial that is not a number");
  }
}

}  // namespace trainrun::tune

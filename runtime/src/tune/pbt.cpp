#include "tune/pbt.h"

#include <trainrun/error.h>

#include <algorithm>
#include <cmath>

#include "tune/search_space.h"

namespace trainrun::tune {
namespace {

using json = nlohmann::json;

std::string describe_change(const json& before, const json& after) {
  std::string text;
  for (const auto& [key, value] : after.items()) {
    if (before.contains(key) && before[key] == value) continue;
    if (!text.empty()) text += ", ";
    text += key + " " + (before.contains(key) ? before[key].dump() : "-") + " -> " + value.dump();
  }
  return text.empty() ? "the same values" : text;
}

}  // namespace

Pbt::Pbt(const TuneConfig& tune, const ParamSpace& space)
    : config_(tune.pbt), metric_(tune.metric), sign_(tune.max ? 1.0 : -1.0), random_(tune.seed) {
  const auto& c = config_;
  if (!(c.perturbation_interval > 0) || !std::isfinite(c.perturbation_interval)) {
    throw UsageError("PBT needs a perturbation_interval above 0");
  }
  if (!(c.quantile_fraction >= 0 && c.quantile_fraction <= 0.5)) {
    throw UsageError("PBT needs a quantile_fraction from 0 to 0.5");
  }
  if (!(c.resample_probability >= 0 && c.resample_probability <= 1)) {
    throw UsageError("PBT needs a resample_probability from 0 to 1");
  }
  if (c.time_attr.empty()) throw UsageError("PBT needs a time_attr");
  for (const auto& key : c.mutations) {
    auto it = space.find(key);
    if (it == space.end()) {
      throw UsageError("PBT: mutation '" + key + "' is not a key of the search space");
    }
    mutations_.insert(*it);
  }
  if (c.mutations.empty()) {
    for (const auto& entry : space) {
      if (entry.second.kind != Domain::Kind::kGrid) mutations_.insert(entry);
    }
  }
  if (mutations_.empty()) {
    throw UsageError("PBT needs a search space key to perturb (a grid is not perturbed)");
  }
}

json Pbt::explore(const json& config) {
  json next = config;
  for (const auto& [key, domain] : mutations_) {
    const json current = config.contains(key) ? config[key] : json();
    const bool list = domain.kind == Domain::Kind::kGrid || domain.kind == Domain::Kind::kChoice;
    if (list) {
      const auto& values = domain.values;
      auto at = std::find(values.begin(), values.end(), current);
      if (random_.uniform() < config_.resample_probability || at == values.end()) {
        next[key] = values[random_.below(values.size())];
      } else {
        const int shift = random_.below(2) == 0 ? -1 : 1;
        const auto index = static_cast<int64_t>(at - values.begin()) + shift;
        next[key] = values[std::clamp<int64_t>(index, 0, static_cast<int64_t>(values.size()) - 1)];
      }
      continue;
    }
    if (random_.uniform() < config_.resample_probability || !current.is_number()) {
      next[key] = sample(domain, random_);
    } else {
      const double factor = random_.below(2) == 0 ? 1.2 : 0.8;
      const double value = current.get<double>() * factor;
      if (current.is_number_integer()) {
        next[key] = static_cast<int64_t>(std::llround(value));
      } else {
        next[key] = value;
      }
    }
  }
  return next;
}

Decision Pbt::on_report(const TrialReport& report, const std::vector<TrialView>& trials) {
  const auto time = report_value(report, config_.time_attr);
  const auto score = report_value(report, metric_);
  if (!time || !score) return {};
  auto& state = trials_[report.trial];
  if (*time - state.last_perturbation < config_.perturbation_interval) return {};
  state.last_score = sign_ * *score;
  state.last_perturbation = *time;
  // The running trials with a score, worst first.
  std::vector<size_t> ranked;
  for (const auto& [trial, s] : trials_) {
    if (s.last_score && !s.ended && trial < trials.size() && trials[trial].running) {
      ranked.push_back(trial);
    }
  }
  if (ranked.size() <= 1) return {};
  std::stable_sort(ranked.begin(), ranked.end(), [&](size_t a, size_t b) {
    return *trials_[a].last_score < *trials_[b].last_score;
  });
  auto quantile = static_cast<size_t>(
      std::ceil(static_cast<double>(ranked.size()) * config_.quantile_fraction));
  quantile = std::min(quantile, ranked.size() / 2);
  const bool lower =
      std::find(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(quantile),
                report.trial) != ranked.begin() + static_cast<std::ptrdiff_t>(quantile);
  if (!lower) return {};
  const size_t source = ranked[ranked.size() - quantile + random_.below(quantile)];
  if (!trials[source].has_checkpoint) return {};
  Decision decision;
  decision.action = Decision::Action::kExploit;
  decision.source = source;
  decision.config = explore(trials[source].config);
  decision.reason = "PBT at " + config_.time_attr + " " + json(*time).dump() +
                    ": takes the latest checkpoint of " + trial_name(source) + ", and " +
                    describe_change(trials[report.trial].config, decision.config);
  return decision;
}

void Pbt::on_trial_end(const TrialReport& last) { trials_[last.trial].ended = true; }

json Pbt::state() const {
  json trials = json::object();
  for (const auto& [trial, s] : trials_) {
    trials[std::to_string(trial)] = {{"last_perturbation", s.last_perturbation},
                                     {"last_score", s.last_score ? json(*s.last_score) : json()},
                                     {"ended", s.ended}};
  }
  return {{"random", random_.state()}, {"trials", trials}};
}

void Pbt::restore(const json& state) {
  try {
    random_ = Random(state.at("random").get<uint64_t>());
    trials_.clear();
    for (const auto& [trial, s] : state.at("trials").items()) {
      TrialState t;
      t.last_perturbation = s.at("last_perturbation").get<double>();
      if (!s.at("last_score").is_null()) t.last_score = s.at("last_score").get<double>();
      t.ended = s.at("ended").get<bool>();
      trials_[std::stoul(trial)] = t;
    }
  } catch (const json::exception& e) {
    throw IoError(std::string("PBT's recorded state is malformed: ") + e.what());
  } catch (const std::logic_error&) {
    throw IoError("PBT's recorded state is malformed: a trial that is not a number");
  }
}

}  // namespace trainrun::tune

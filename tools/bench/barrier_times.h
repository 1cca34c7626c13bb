#pragma once

// What the scale benchmark and its bare ZeroMQ baseline measure from the same
// records: per report and rank, when the REPORT went out and when its answer
// came (CLOCK_MONOTONIC ns, one clock for every process on the machine).

#include <algorithm>
#include <utility>
#include <vector>

namespace bench {

/// [report][rank] -> (sent, answered), in ns.
using BarrierTimes = std::vector<std::vector<std::pair<double, double>>>;

/// The round trip of every rank's report, and its release (the last rank's
/// REPORT sent to this rank's answer: what the barrier itself costs), in us.
inline std::pair<std::vector<double>, std::vector<double>> round_trips_and_releases(
    const BarrierTimes& times) {
  std::vector<double> round_trips, releases;
  for (const auto& report : times) {
    double last_sent = 0;
    for (auto [sent, answered] : report) last_sent = std::max(last_sent, sent);
    for (auto [sent, answered] : report) {
      round_trips.push_back((answered - sent) / 1e3);
      releases.push_back((answered - last_sent) / 1e3);
    }
  }
  return {round_trips, releases};
}

/// The p-quantile (0..1) of `values`, which it reorders; 0 for none.
inline double percentile(std::vector<double>& values, double p) {
  if (values.empty()) return 0;
  auto k = static_cast<size_t>(p * static_cast<double>(values.size() - 1));
  std::nth_element(values.begin(), values.begin() + static_cast<long>(k), values.end());
  return values[k];
}

}  // namespace bench

#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <variant>

namespace train {

/// One metric value: a real number, an integer, a boolean or a string.
/// Arithmetic types convert implicitly, so `{{"loss", 0.5}, {"epoch", 3}}` works.
class MetricValue {
 public:
  using Variant = std::variant<double, int64_t, bool, std::string>;

  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  MetricValue(T value) : value_(convert(value)) {}  // NOLINT(google-explicit-constructor)
  MetricValue(std::string value) : value_(std::move(value)) {}    // NOLINT
  MetricValue(const char* value) : value_(std::string(value)) {}  // NOLINT

  const Variant& value() const { return value_; }
  bool operator==(const MetricValue& other) const { return value_ == other.value_; }

 private:
  template <typename T>
  static Variant convert(T value) {
    if constexpr (std::is_same_v<T, bool>) {
      return value;
    } else if constexpr (std::is_integral_v<T>) {
      return static_cast<int64_t>(value);
    } else {
      return static_cast<double>(value);
    }
  }
  Variant value_;
};

/// Metrics of one report, by name.
using Metrics = std::map<std::string, MetricValue>;

/// The most metrics one report carries, and the longest name or text value
/// (bytes): the controller refuses more.
constexpr size_t kMaxMetrics = 4096;
constexpr size_t kMaxMetricText = 65536;

/// Reports metrics for this iteration, like Ray Train's `train.report`.
///
/// A barrier: every rank must call it the same number of times, and it returns
/// once all ranks have reached the same report. Rank 0's metrics are recorded in
/// the run's result.jsonl and progress.csv and shown on the terminal. Throws
/// std::runtime_error if the run is being stopped or the controller is gone,
/// and std::logic_error outside a train function started by trainrun.
///
/// First, for the models prepared with ModelOptions::check_divergence (the
/// default), it compares every rank's parameters; if the replicas have diverged
/// it throws std::runtime_error on every rank, naming the first parameter that
/// differs and the ranks, and nothing is recorded.
///
/// More than kMaxMetrics metrics, or a name or text longer than
/// kMaxMetricText bytes, is std::invalid_argument.
void report(const Metrics& metrics);

}  // namespace train

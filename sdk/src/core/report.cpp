#include <train/data.h>
#include <train/report.h>

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "core/host.h"
#include "ddp/reducer.h"

namespace train {

namespace detail {

void report_with(const Metrics& metrics, const char* checkpoint_dir, uint32_t upload_mode) {
  profile_point();
  if (metrics.size() > kMaxMetrics) {
    throw std::invalid_argument("train::report: " + std::to_string(metrics.size()) +
                                " metrics; a report carries at most " +
                                std::to_string(kMaxMetrics));
  }
  nlohmann::json map = nlohmann::json::object();
  for (const auto& [name, value] : metrics) {
    const auto* text = std::get_if<std::string>(&value.value());
    if (name.size() > kMaxMetricText || (text != nullptr && text->size() > kMaxMetricText)) {
      throw std::invalid_argument("train::report: metric '" + name.substr(0, 64) +
                                  "' has a name or text longer than " +
                                  std::to_string(kMaxMetricText) + " bytes");
    }
    std::visit([&, &name = name](const auto& v) { map[name] = v; }, value.value());
  }
  const auto& host = current_host("train::report");
  // The replica check is a collective, before the barrier so that diverged
  // replicas never reach a checkpoint. Every rank first reaches this report:
  // a rank that returned from train_func, or reports fewer times, then ends
  // the run, named, instead of leaving the others inside the collective.
  if (has_checked_models() && TRAIN_HOST_HAS(&host, arrive)) {
    char arrive_error[1024] = {0};
    if (host.arrive(host.handle, arrive_error, sizeof(arrive_error)) != 0) {
      throw std::runtime_error(std::string("train::report failed: ") + arrive_error);
    }
  }
  check_prepared_models("train::report");
  std::vector<uint8_t> bytes = nlohmann::json::to_msgpack(map);
  char error[1024] = {0};
  const bool async = checkpoint_dir != nullptr && upload_mode == TRAIN_UPLOAD_ASYNC;
  int rc = 0;
  if (async && TRAIN_HOST_HAS(&host, report_checkpoint)) {
    rc = host.report_checkpoint(host.handle, bytes.data(), bytes.size(), checkpoint_dir,
                                upload_mode, error, sizeof(error));
  } else {
    // A worker older than this SDK uploads synchronously, and leaves the
    // directory where it is.
    rc = host.report(host.handle, bytes.data(), bytes.size(), checkpoint_dir, error, sizeof(error));
  }
  if (rc != 0) throw std::runtime_error(std::string("train::report failed: ") + error);
}

}  // namespace detail

void report(const Metrics& metrics) { detail::report_with(metrics, nullptr); }

}  // namespace train

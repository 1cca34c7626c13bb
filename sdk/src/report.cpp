#include <train/report.h>

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <vector>

#include "host.h"
#include "reducer.h"

namespace train {

namespace detail {

void report_with(const Metrics& metrics, const char* checkpoint_dir) {
  const auto& host = current_host("train::report");
  // Before the barrier, so that diverged replicas never reach a checkpoint.
  check_prepared_models("train::report");
  nlohmann::json map = nlohmann::json::object();
  for (const auto& [name, value] : metrics) {
    std::visit([&, &name = name](const auto& v) { map[name] = v; }, value.value());
  }
  std::vector<uint8_t> bytes = nlohmann::json::to_msgpack(map);
  char error[1024] = {0};
  if (host.report(host.handle, bytes.data(), bytes.size(), checkpoint_dir, error, sizeof(error)) !=
      0) {
    throw std::runtime_error(std::string("train::report failed: ") + error);
  }
}

}  // namespace detail

void report(const Metrics& metrics) { detail::report_with(metrics, nullptr); }

}  // namespace train

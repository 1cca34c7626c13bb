#include "common/metrics_format.h"

#include <cmath>
#include <cstdio>

namespace trainrun {

std::string format_value(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) {
    double v = value.get<double>();
    if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%.6g", v);
    return buffer;
  }
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string format_metrics(const nlohmann::json& metrics) {
  std::string line;
  if (metrics.is_object()) {
    for (const auto& item : metrics.items()) {
      line += (line.empty() ? "" : " ") + item.key() + "=" + format_value(item.value());
    }
  }
  return line.empty() ? "-" : line;
}

}  // namespace trainrun

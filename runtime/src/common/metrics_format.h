#pragma once

// Metrics as the terminal shows them.

#include <nlohmann/json.hpp>

#include <string>

namespace trainrun {

/// Formats a metric value for the terminal (real numbers to 6 significant digits).
std::string format_value(const nlohmann::json& value);

/// "name=value name=value" for the terminal; "-" when there are none.
std::string format_metrics(const nlohmann::json& metrics);

}  // namespace trainrun

#pragma once

// Metrics as the terminal shows them.

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace trainrun {

/// `text` with its control characters (C0, DEL, and C1 as UTF-8 encodes them)
/// written as escapes ("\n", "\x1b"): a name or value from a worker cannot
/// start a line of its own, or send a terminal an escape sequence.
std::string escape_control(std::string_view text);

/// Formats a metric value for the terminal (real numbers to 6 significant digits).
std::string format_value(const nlohmann::json& value);

/// "name=value name=value" for the terminal, control characters escaped;
/// "-" when there are none.
std::string format_metrics(const nlohmann::json& metrics);

}  // namespace trainrun

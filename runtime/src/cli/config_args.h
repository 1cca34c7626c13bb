#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

namespace trainrun {

/// The value of `--config key=value`: true/false, an integer, a real number, a
/// JSON array or object, or else the text as a string.
nlohmann::json parse_config_value(const std::string& text);

/// Builds the run's config: the JSON object in `file` (if given), then each
/// `key=value` on top. Throws UsageError naming the bad argument or file.
nlohmann::json build_config(const std::filesystem::path& file,
                            const std::vector<std::string>& assignments);

}  // namespace trainrun

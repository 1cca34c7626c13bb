#include "cli/config_args.h"

#include <trainrun/error.h>

#include <charconv>
#include <fstream>

namespace trainrun {

nlohmann::json parse_config_value(const std::string& text) {
  if (text == "true") return true;
  if (text == "false") return false;
  const char* begin = text.data();
  const char* end = begin + text.size();
  int64_t integer = 0;
  auto [int_end, int_error] = std::from_chars(begin, end, integer);
  if (int_error == std::errc() && int_end == end && !text.empty()) return integer;
  double real = 0;
  auto [real_end, real_error] = std::from_chars(begin, end, real);
  if (real_error == std::errc() && real_end == end && !text.empty()) return real;
  if (!text.empty() && (text.front() == '[' || text.front() == '{')) {
    auto parsed = nlohmann::json::parse(text, nullptr, false);
    if (!parsed.is_discarded()) return parsed;
  }
  return text;
}

nlohmann::json build_config(const std::filesystem::path& file,
                            const std::vector<std::string>& assignments) {
  nlohmann::json config = nlohmann::json::object();
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) throw UsageError("cannot read config file " + file.string());
    config = nlohmann::json::parse(in, nullptr, false);
    if (config.is_discarded()) throw UsageError("config file " + file.string() + " is not JSON");
    if (!config.is_object()) {
      throw UsageError("config file " + file.string() + " must hold a JSON object");
    }
  }
  for (const auto& assignment : assignments) {
    auto eq = assignment.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw UsageError("--config expects key=value, got '" + assignment + "'");
    }
    config[assignment.substr(0, eq)] = parse_config_value(assignment.substr(eq + 1));
  }
  return config;
}

}  // namespace trainrun

#include "common/metrics_format.h"

#include <cmath>
#include <cstdio>

namespace trainrun {

std::string escape_control(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  char code[8];
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    // C1 controls are U+0080-U+009F: 0xC2 0x80-0x9F in UTF-8 (0x9B is a CSI).
    const bool c1 = c == 0xC2 && i + 1 < text.size() &&
                    static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9F;
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(code, sizeof(code), "\\x%02x", c);
      out += code;
    } else if (c1) {
      std::snprintf(code, sizeof(code), "\\u%04x", static_cast<unsigned char>(text[++i]));
      out += code;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string format_value(const nlohmann::json& value) {
  if (value.is_string()) return escape_control(value.get<std::string>());
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
      line +=
          (line.empty() ? "" : " ") + escape_control(item.key()) + "=" + format_value(item.value());
    }
  }
  return line.empty() ? "-" : line;
}

}  // namespace trainrun

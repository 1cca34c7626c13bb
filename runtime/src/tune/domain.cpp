// The public types' functions (Domain, TrialStatus), built into libtrainrun.so
// itself, where the version script exports them, and into what tests them.

#include <trainrun/error.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "tune/search_space.h"

namespace trainrun {
namespace {

using json = nlohmann::json;

constexpr size_t kMostValues = 1000;
constexpr size_t kMostText = 4096;
constexpr double kMostInteger = 9007199254740992.0;  // 2^53: exact in a double

std::string quoted(std::string_view text) {
  return "'" + std::string(text.substr(0, 64)) + (text.size() > 64 ? "...'" : "'");
}

double number(std::string_view text, std::string_view whole) {
  std::string s(text);
  char* end = nullptr;
  errno = 0;
  const double value = s.empty() ? NAN : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(value)) {
    throw UsageError("search space: " + quoted(text) + " in " + quoted(whole) +
                     " is not a finite number");
  }
  return value;
}

// A list's item: JSON where it parses as JSON (1, 0.5, true, "a b"), else the text.
json item(std::string_view text) {
  json value = json::parse(text.begin(), text.end(), nullptr, false);
  if (value.is_discarded()) {
    // A number JSON cannot hold (1e999) is refused, not taken as text.
    std::string s(text);
    char* end = nullptr;
    errno = 0;
    const double number = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size() && (errno == ERANGE || !std::isfinite(number))) {
      throw UsageError("search space: " + quoted(text) + " is not a finite number");
    }
  }
  if (value.is_discarded() || value.is_object() || value.is_array()) return json(std::string(text));
  return value;
}

void check_bounds(const Domain& d, std::string_view what) {
  if (!std::isfinite(d.low) || !std::isfinite(d.high) || !(d.low < d.high)) {
    throw UsageError("search space: " + std::string(what) + " needs LOW < HIGH, finite");
  }
  if (d.kind == Domain::Kind::kLogUniform && d.low <= 0) {
    throw UsageError("search space: loguniform needs 0 < LOW < HIGH");
  }
  if (d.kind == Domain::Kind::kRandInt &&
      (d.low != std::floor(d.low) || d.high != std::floor(d.high) ||
       std::fabs(d.low) > kMostInteger || std::fabs(d.high) > kMostInteger)) {
    throw UsageError("search space: randint needs integer bounds within 2^53");
  }
}

void check_values(const Domain& d, std::string_view what) {
  if (!d.values.is_array() || d.values.empty() || d.values.size() > kMostValues) {
    throw UsageError("search space: " + std::string(what) + " needs 1 to " +
                     std::to_string(kMostValues) + " values");
  }
  for (const auto& value : d.values) {
    if (value.is_number_float() && !std::isfinite(value.get<double>())) {
      throw UsageError("search space: " + std::string(what) + " has a value that is not finite");
    }
  }
}

std::string_view kind_name(Domain::Kind kind) {
  switch (kind) {
    case Domain::Kind::kGrid: return "grid";
    case Domain::Kind::kChoice: return "choice";
    case Domain::Kind::kUniform: return "uniform";
    case Domain::Kind::kLogUniform: return "loguniform";
    case Domain::Kind::kRandInt: return "randint";
  }
  return "?";
}

// The shortest text that reads back as the same double.
std::string format_number(double value) {
  char text[64];
  const auto end = std::to_chars(text, text + sizeof(text), value).ptr;
  return std::string(text, end);
}

}  // namespace

Domain Domain::grid(json values) {
  Domain d{Kind::kGrid, std::move(values)};
  check_values(d, "grid");
  return d;
}

Domain Domain::choice(json values) {
  Domain d{Kind::kChoice, std::move(values)};
  check_values(d, "choice");
  return d;
}

Domain Domain::uniform(double low, double high) {
  Domain d{Kind::kUniform, json::array(), low, high};
  check_bounds(d, "uniform");
  return d;
}

Domain Domain::loguniform(double low, double high) {
  Domain d{Kind::kLogUniform, json::array(), low, high};
  check_bounds(d, "loguniform");
  return d;
}

Domain Domain::randint(int64_t low, int64_t high) {
  Domain d{Kind::kRandInt, json::array(), static_cast<double>(low), static_cast<double>(high)};
  check_bounds(d, "randint");
  return d;
}

Domain Domain::parse(std::string_view text) {
  if (text.size() > kMostText) throw UsageError("search space: a domain longer than 4096 bytes");
  const auto colon = text.find(':');
  const auto kind = text.substr(0, colon);
  const auto rest = colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  auto list = [&] {
    json values = json::array();
    size_t start = 0;
    while (start <= rest.size() && values.size() <= kMostValues) {
      const auto comma = rest.find(',', start);
      const auto part =
          rest.substr(start, comma == std::string_view::npos ? rest.npos : comma - start);
      if (part.empty()) throw UsageError("search space: an empty value in " + quoted(text));
      values.push_back(item(part));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    return values;
  };
  auto bounds = [&](std::string_view name) {
    const auto sep = rest.find(':');
    if (sep == std::string_view::npos || rest.find(':', sep + 1) != std::string_view::npos) {
      throw UsageError("search space: " + std::string(name) + " takes " + std::string(name) +
                       ":LOW:HIGH; got " + quoted(text));
    }
    return std::pair{number(rest.substr(0, sep), text), number(rest.substr(sep + 1), text)};
  };
  if (colon != std::string_view::npos && !rest.empty()) {
    if (kind == "grid") return grid(list());
    if (kind == "choice") return choice(list());
    if (kind == "uniform") {
      auto [low, high] = bounds(kind);
      return uniform(low, high);
    }
    if (kind == "loguniform") {
      auto [low, high] = bounds(kind);
      return loguniform(low, high);
    }
    if (kind == "randint") {
      auto [low, high] = bounds(kind);
      Domain d{Kind::kRandInt, json::array(), low, high};
      check_bounds(d, "randint");
      return d;
    }
  }
  throw UsageError("search space: " + quoted(text) +
                   " is not grid:A,B,..., choice:A,B,..., uniform:LOW:HIGH, "
                   "loguniform:LOW:HIGH or randint:LOW:HIGH");
}

std::string Domain::to_string() const {
  std::string text(kind_name(kind));
  text += ':';
  if (kind == Kind::kGrid || kind == Kind::kChoice) {
    for (size_t i = 0; i < values.size(); ++i) {
      if (i > 0) text += ',';
      text += values[i].is_string() ? values[i].get<std::string>() : values[i].dump();
    }
  } else {
    text += format_number(low) + ":" + format_number(high);
  }
  return text;
}

std::string_view to_string(TrialStatus status) {
  switch (status) {
    case TrialStatus::kPending: return "pending";
    case TrialStatus::kRunning: return "running";
    case TrialStatus::kFinished: return "finished";
    case TrialStatus::kStopped: return "stopped";
    case TrialStatus::kFailed: return "failed";
  }
  return "unknown";
}

namespace tune {

void check_space(const ParamSpace& space) {
  for (const auto& [key, domain] : space) {
    if (key.empty() || key.size() > 128) {
      throw UsageError("search space: a key must have 1 to 128 characters");
    }
    switch (domain.kind) {
      case Domain::Kind::kGrid:
      case Domain::Kind::kChoice: check_values(domain, kind_name(domain.kind)); break;
      default: check_bounds(domain, kind_name(domain.kind));
    }
  }
}

}  // namespace tune
}  // namespace trainrun

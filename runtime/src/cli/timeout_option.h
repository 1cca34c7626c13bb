#pragma once

// A timeout flag as `trainrun` and `trainrun worker` take it: seconds,
// fractions allowed, more than 0 and at most kMaxTimeoutSeconds.

#include <CLI/CLI.hpp>

#include <string>

#include "common/seconds.h"

namespace trainrun {

inline CLI::Option* add_timeout_option(CLI::App& app, const std::string& name, double& seconds,
                                       const std::string& description) {
  CLI::Validator positive(
      [](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value) || !(value > 0) || value > kMaxTimeoutSeconds) {
          return "takes a number of seconds, more than 0, got '" + text.substr(0, 32) + "'";
        }
        return "";
      },
      "");
  return app.add_option(name, seconds, description)
      ->type_name("SECONDS")
      ->check(positive)
      ->capture_default_str();
}

}  // namespace trainrun

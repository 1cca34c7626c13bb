#include <trainrun/error.h>

#include <doctest/doctest.h>

#include <fstream>

#include "cli/config_args.h"

using trainrun::build_config;
using trainrun::parse_config_value;

TEST_CASE("--config values: numbers, booleans, JSON and strings") {
  CHECK(parse_config_value("5") == 5);
  CHECK(parse_config_value("-3").is_number_integer());
  CHECK(parse_config_value("0.001") == 0.001);
  CHECK(parse_config_value("1e-3").is_number_float());
  CHECK(parse_config_value("true") == true);
  CHECK(parse_config_value("false") == false);
  CHECK(parse_config_value("[1,2]") == nlohmann::json::array({1, 2}));
  CHECK(parse_config_value("adam") == "adam");
  CHECK(parse_config_value("5x") == "5x");
  CHECK(parse_config_value("") == "");
  CHECK(parse_config_value("/data/x") == "/data/x");
}

TEST_CASE("--config overrides --config-file, bad input is a UsageError") {
  auto dir = std::filesystem::temp_directory_path() / "trainrun-config-test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "c.json") << R"({"epochs": 10, "lr": 0.1})";
  auto config = build_config(dir / "c.json", {"epochs=2", "name=x=y"});
  CHECK(config["epochs"] == 2);
  CHECK(config["lr"] == 0.1);
  CHECK(config["name"] == "x=y");
  CHECK_THROWS_WITH_AS(build_config({}, {"novalue"}), doctest::Contains("key=value"),
                       trainrun::UsageError);
  CHECK_THROWS_AS(build_config({}, {"=3"}), trainrun::UsageError);
  std::ofstream(dir / "bad.json") << "{not json";
  CHECK_THROWS_WITH_AS(build_config(dir / "bad.json", {}), doctest::Contains("is not JSON"),
                       trainrun::UsageError);
  std::ofstream(dir / "list.json") << "[1, 2]";
  CHECK_THROWS_WITH_AS(build_config(dir / "list.json", {}), doctest::Contains("JSON object"),
                       trainrun::UsageError);
  std::filesystem::remove_all(dir);
}

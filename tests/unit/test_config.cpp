#include <train/config.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

namespace {

train::Config from(const nlohmann::json& j) {
  auto bytes = nlohmann::json::to_msgpack(j);
  return train::Config::from_msgpack(bytes.data(), bytes.size());
}

}  // namespace

TEST_CASE("config: typed values and defaults") {
  auto config = from({{"epochs", 3}, {"lr", 0.01}, {"eval", true}, {"name", "resnet"}});
  CHECK(config.get<int>("epochs") == 3);
  CHECK(config.get<int64_t>("epochs", 10) == 3);
  CHECK(config.get<double>("lr") == doctest::Approx(0.01));
  CHECK(config.get<float>("lr") == doctest::Approx(0.01f));
  CHECK(config.get<bool>("eval"));
  CHECK(config.get<std::string>("name") == "resnet");
  CHECK(config.get("missing", "fallback") == "fallback");
  CHECK(config.get<int>("missing", 10) == 10);
  CHECK(config.get<double>("epochs") == 3.0);  // an integer widens to a real number
  CHECK(config.contains("lr"));
  CHECK_FALSE(config.contains("nope"));
  CHECK(config.keys() == std::vector<std::string>{"epochs", "eval", "lr", "name"});
}

TEST_CASE("config: a wrong type names the key and both types") {
  auto config = from({{"epochs", "ten"}, {"lr", 0.5}, {"big", 1LL << 40}});
  CHECK_THROWS_WITH_AS(config.get<int>("epochs", 1),
                       "config key 'epochs' is a string (\"ten\"), expected an integer",
                       train::ConfigError);
  CHECK_THROWS_WITH_AS(config.get<int>("lr"),
                       "config key 'lr' is a real number (0.5), expected an integer",
                       train::ConfigError);
  CHECK_THROWS_WITH_AS(config.get<bool>("lr"), doctest::Contains("expected a boolean"),
                       train::ConfigError);
  CHECK_THROWS_WITH_AS(config.get<int>("big"), doctest::Contains("fits its type"),
                       train::ConfigError);
  CHECK(config.get<int64_t>("big") == (1LL << 40));
  CHECK_THROWS_WITH_AS(config.get<int>("absent"), "config key 'absent' is not set",
                       train::ConfigError);
}

TEST_CASE("config: bytes that are not a msgpack map are refused") {
  const uint8_t garbage[] = {0xc1, 0x00, 0xff};
  CHECK_THROWS_AS(train::Config::from_msgpack(garbage, sizeof(garbage)), train::ConfigError);
  auto array = nlohmann::json::to_msgpack(nlohmann::json::array({1, 2}));
  CHECK_THROWS_AS(train::Config::from_msgpack(array.data(), array.size()), train::ConfigError);
  CHECK_THROWS_AS(train::Config::from_json("[1]"), train::ConfigError);
  CHECK(train::Config::from_json(R"({"a": 1})").get<int>("a") == 1);
}

#include <train/report.h>

#include <doctest/doctest.h>

#include <stdexcept>

TEST_CASE("metric values keep their kind") {
  train::Metrics metrics{{"loss", 0.25f}, {"epoch", 3},       {"step", 7LL},
                         {"ok", true},    {"phase", "train"}, {"name", std::string("x")}};
  CHECK(std::get<double>(metrics.at("loss").value()) == 0.25);
  CHECK(std::get<int64_t>(metrics.at("epoch").value()) == 3);
  CHECK(std::get<int64_t>(metrics.at("step").value()) == 7);
  CHECK(std::get<bool>(metrics.at("ok").value()));
  CHECK(std::get<std::string>(metrics.at("phase").value()) == "train");
  CHECK(std::get<std::string>(metrics.at("name").value()) == "x");
}

TEST_CASE("report outside a trainrun worker is a clear error") {
  CHECK_THROWS_WITH_AS(train::report({{"loss", 1.0}}),
                       doctest::Contains("outside a train function started by trainrun"),
                       std::logic_error);
}

#include <train/report.h>

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

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

TEST_CASE("a report past the limits throws naming the limit, before it reaches the controller") {
  train::Metrics many;
  for (size_t i = 0; i <= train::kMaxMetrics; ++i) {
    std::string name = "m";  // appended: GCC 12 warns falsely on "m" + std::to_string(i)
    name += std::to_string(i);
    many.emplace(name, 1.0);
  }
  CHECK_THROWS_WITH_AS(train::report(many),
                       "train::report: 4097 metrics; a report carries at most 4096",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(train::report({{"note", std::string(train::kMaxMetricText + 1, 'x')}}),
                       "train::report: metric 'note' has a name or text longer than 65536 bytes",
                       std::invalid_argument);
  many.erase(many.begin());  // 4096: within the limit, so the next check speaks
  CHECK_THROWS_WITH_AS(train::report(many),
                       doctest::Contains("outside a train function started by trainrun"),
                       std::logic_error);
}

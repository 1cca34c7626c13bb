// The tuner's pure parts: search spaces, and the schedulers' decisions for
// given reports, in microseconds.

#include <trainrun/error.h>

#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <set>

#include "tune/asha.h"
#include "tune/pbt.h"
#include "tune/scheduler.h"
#include "tune/search_space.h"
#include "tune/trial_channel.h"

using trainrun::Domain;
using trainrun::ParamSpace;
using trainrun::TuneConfig;
using trainrun::tune::Decision;
using trainrun::tune::TrialReport;
using trainrun::tune::TrialView;
using json = nlohmann::json;

namespace {

TrialReport report(size_t trial, int64_t iteration, double score) {
  return TrialReport{trial, iteration, json{{"score", score}}};
}

TuneConfig asha_config(double max_t, double grace, double rf, bool max = true) {
  TuneConfig tune;
  tune.metric = "score";
  tune.max = max;
  tune.scheduler = trainrun::SchedulerKind::kAsha;
  tune.asha.max_t = max_t;
  tune.asha.grace_period = grace;
  tune.asha.reduction_factor = rf;
  return tune;
}

}  // namespace

TEST_CASE("tune: domains parse, print back, and refuse what is malformed") {
  CHECK(Domain::parse("grid:1,2.5,true,adam").values == json::array({1, 2.5, true, "adam"}));
  CHECK(Domain::parse("choice:\"a,b\"").values.size() == 2);  // a comma always separates
  CHECK(Domain::parse("loguniform:1e-4:0.1").to_string() == "loguniform:1e-04:0.1");
  CHECK(Domain::parse("randint:1:10").to_string() == "randint:1:10");
  CHECK(Domain::parse("grid:1,a").to_string() == "grid:1,a");
  CHECK_THROWS_AS(Domain::parse("randint:3:3"), trainrun::UsageError);
  CHECK_THROWS_AS(Domain::parse("uniform:a:1"), trainrun::UsageError);
  CHECK_THROWS_AS(Domain::parse("grid:"), trainrun::UsageError);
  CHECK_THROWS_AS(Domain::parse("uniform:0:1e400"), trainrun::UsageError);
  CHECK_THROWS_AS(Domain::parse(std::string(5000, 'x')), trainrun::UsageError);
}

TEST_CASE("tune: trials are num_samples times the grids' product, drawn from the seed") {
  ParamSpace space{{"a", Domain::grid({1, 2, 3})},
                   {"b", Domain::grid({"x", "y"})},
                   {"lr", Domain::loguniform(1e-4, 1e-1)},
                   {"n", Domain::randint(2, 4)}};
  auto trials = trainrun::tune::make_trials(space, 2, 11);
  REQUIRE(trials.size() == 12);
  // The last grid's values change fastest; the samples repeat the grid.
  CHECK(trials[0]["a"] == 1);
  CHECK(trials[0]["b"] == "x");
  CHECK(trials[1]["b"] == "y");
  CHECK(trials[2]["a"] == 2);
  CHECK(trials[6]["a"] == 1);
  std::set<double> lrs;
  for (const auto& t : trials) {
    CHECK(t["lr"].get<double>() >= 1e-4);
    CHECK(t["lr"].get<double>() < 1e-1);
    CHECK((t["n"] == 2 || t["n"] == 3));
    lrs.insert(t["lr"].get<double>());
  }
  CHECK(lrs.size() == 12);
  CHECK(trainrun::tune::make_trials(space, 2, 11) == trials);
  CHECK(trainrun::tune::make_trials(space, 2, 12) != trials);
  CHECK_THROWS_AS(trainrun::tune::make_trials({{"a", Domain::grid(json(std::vector<int>(200, 1)))},
                                               {"b", Domain::grid(json(std::vector<int>(200, 1)))}},
                                              1, 0),
                  trainrun::UsageError);
}

TEST_CASE("tune: percentile interpolates as numpy's") {
  CHECK(trainrun::tune::percentile({3}, 50) == 3);
  CHECK(trainrun::tune::percentile({1, 3}, 50) == 2);
  CHECK(trainrun::tune::percentile({4, 1, 3}, 75) == doctest::Approx(3.5));
  CHECK(trainrun::tune::percentile({1, 2, 3, 4}, 75) == doctest::Approx(3.25));
}

TEST_CASE("tune: ASHA records each trial at its rungs and stops those below the cutoff") {
  trainrun::tune::Asha asha(asha_config(4, 1, 2));
  CHECK(asha.milestones() == std::vector<double>{4, 2, 1});
  std::vector<TrialView> views(4);
  using A = Decision::Action;
  CHECK(asha.on_report(report(0, 1, 3), views).action == A::kContinue);
  CHECK(asha.on_report(report(0, 2, 6), views).action == A::kContinue);
  CHECK(asha.on_report(report(0, 3, 9), views).action == A::kContinue);
  auto end = asha.on_report(report(0, 4, 12), views);
  CHECK(end.action == A::kStop);
  CHECK(end.finished);
  auto stopped = asha.on_report(report(1, 1, 1), views);
  CHECK(stopped.action == A::kStop);
  CHECK(!stopped.finished);
  CHECK(stopped.reason == "ASHA at training_iteration 1: score 1 is below the rung's cutoff 3");
  CHECK(asha.on_report(report(2, 1, 4), views).action == A::kContinue);  // median {1, 3} = 2
  CHECK(asha.on_report(report(2, 2, 8), views).action == A::kContinue);
  CHECK(asha.on_report(report(3, 1, 2), views).action == A::kStop);  // median {1, 3, 4} = 3
  // Its state comes back whole.
  trainrun::tune::Asha again(asha_config(4, 1, 2));
  again.restore(asha.state());
  CHECK(again.state() == asha.state());
  CHECK(again.on_report(report(5, 1, 2.4), views).action == A::kStop);  // median {1, 2, 3, 4}
  // In min mode a lower score is better.
  trainrun::tune::Asha low(asha_config(4, 1, 2, false));
  CHECK(low.on_report(report(0, 1, 3), views).action == A::kContinue);
  CHECK(low.on_report(report(1, 1, 1), views).action == A::kContinue);
  CHECK(low.on_report(report(2, 1, 5), views).action == A::kStop);
  // A report without the metric changes nothing.
  CHECK(low.on_report(TrialReport{3, 1, json{{"other", 1}}}, views).action == A::kContinue);
  CHECK_THROWS_AS(trainrun::tune::Asha(asha_config(1, 2, 2)), trainrun::UsageError);
  json bad = asha.state();
  bad["rungs"].erase(0);
  CHECK_THROWS_AS(again.restore(bad), trainrun::IoError);
}

TEST_CASE("tune: PBT sends a bottom trial to a top one's checkpoint with perturbed values") {
  TuneConfig tune;
  tune.metric = "score";
  tune.scheduler = trainrun::SchedulerKind::kPbt;
  tune.pbt.resample_probability = 0;
  ParamSpace space{{"lr", Domain::uniform(0, 1)}, {"size", Domain::choice({16, 32, 64})}};
  trainrun::tune::Pbt pbt(tune, space);
  std::vector<TrialView> views{{true, true, {{"lr", 0.5}, {"size", 32}}},
                               {true, true, {{"lr", 0.1}, {"size", 16}}},
                               {true, true, {{"lr", 0.2}, {"size", 64}}},
                               {true, false, {{"lr", 0.3}, {"size", 32}}}};
  using A = Decision::Action;
  CHECK(pbt.on_report(report(0, 1, 10), views).action == A::kContinue);  // alone
  CHECK(pbt.on_report(report(1, 1, 1), views).action == A::kExploit);    // bottom of 2
  CHECK(pbt.on_report(report(1, 1, 1), views).action == A::kContinue);   // within the interval
  CHECK(pbt.on_report(report(2, 1, 5), views).action == A::kContinue);   // middle of 3
  auto d = pbt.on_report(report(1, 2, 2), views);
  REQUIRE(d.action == A::kExploit);
  CHECK(d.source == 0);  // the top quarter of 3 is 1 trial
  const double lr = d.config["lr"].get<double>();
  CHECK((std::fabs(lr - 0.6) < 1e-12 || std::fabs(lr - 0.4) < 1e-12));
  CHECK((d.config["size"] == 16 || d.config["size"] == 64));  // a neighbour of 32
  CHECK(d.reason.find("takes the latest checkpoint of trial_0000") != std::string::npos);
  // A top trial without a checkpoint is not copied.
  trainrun::tune::Pbt other(tune, space);
  CHECK(other.on_report(report(3, 1, 10), views).action == A::kContinue);
  CHECK(other.on_report(report(1, 1, 1), views).action == A::kContinue);
  // The same seed, the same choices, also after a restore.
  trainrun::tune::Pbt copy(tune, space);
  copy.restore(pbt.state());
  CHECK(copy.explore(views[0].config) == pbt.explore(views[0].config));
  CHECK_THROWS_AS(trainrun::tune::Pbt(tune, {{"g", Domain::grid({1, 2})}}), trainrun::UsageError);
}

TEST_CASE("tune: the trial channel takes whole JSON objects and refuses the rest") {
  using trainrun::tune::LineChannel;
  auto pair = [] {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    return std::pair{LineChannel(trainrun::Fd(fds[0])), trainrun::Fd(fds[1])};
  };
  auto write_all = [](int fd, const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + sent, bytes.size() - sent);
      REQUIRE(n > 0);
      sent += static_cast<size_t>(n);
    }
  };
  {
    auto [channel, peer] = pair();
    // Two messages and half of a third in one write; the rest later.
    write_all(peer.get(), "{\"a\":1}\n{\"b\":2}\n{\"c\":");
    auto got = channel.drain();
    REQUIRE(got.size() == 2);
    CHECK(got[1]["b"] == 2);
    write_all(peer.get(), "3}\n");
    auto last = channel.receive(std::chrono::seconds(5));
    REQUIRE(last);
    CHECK((*last)["c"] == 3);
    // Nothing more: a bounded wait, then the end once the peer closes.
    CHECK(!channel.receive(std::chrono::milliseconds(20)));
    CHECK(!channel.eof());
    peer.reset();
    CHECK(!channel.receive(std::chrono::seconds(5)));
    CHECK(channel.eof());
    CHECK_THROWS_AS(channel.send({{"x", 1}}, std::chrono::seconds(1)), trainrun::IoError);
  }
  {
    auto [channel, peer] = pair();
    write_all(peer.get(), "[1, 2]\n");
    CHECK_THROWS_AS(channel.drain(), trainrun::IoError);
  }
  {
    auto [channel, peer] = pair();
    write_all(peer.get(), "{\"cut\": \n");
    CHECK_THROWS_AS(channel.drain(), trainrun::IoError);
  }
  {
    auto [channel, peer] = pair();
    // More than 1 MiB without a newline: refused before it grows further.
    // (Written 64 KiB at a time, each read before the next: one thread.)
    const std::string chunk(64 * 1024, 'x');
    bool refused = false;
    for (int i = 0; i < 40 && !refused; ++i) {
      write_all(peer.get(), chunk);
      try {
        channel.drain();
      } catch (const trainrun::IoError&) {
        refused = true;
      }
    }
    CHECK(refused);
  }
}

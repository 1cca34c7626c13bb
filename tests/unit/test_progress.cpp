// The progress display's arithmetic and lines: rates over a window, the ETA,
// the status line's width and the plain line.

#include <doctest/doctest.h>

#include "api/progress.h"

namespace trainrun {
namespace {

using Clock = ProgressTracker::Clock;
using std::chrono::milliseconds;

ProgressSample sample(int64_t epoch, int64_t batch, int64_t steps, int attempt = 1) {
  // 10 batches an epoch, 4 samples a batch on each of 2 ranks.
  return ProgressSample{attempt, 2, epoch, batch, 10, steps, steps * 4};
}

TEST_CASE("progress: rate over the window, ETA to the run's end when epochs are known") {
  auto t0 = Clock::now();
  ProgressTracker tracker(3, t0);
  auto first = tracker.update(sample(0, 1, 1), t0 + milliseconds(500));
  CHECK(first.samples_per_second == 0);  // one point: no rate yet
  CHECK_FALSE(first.eta_seconds);
  CHECK(first.elapsed_seconds == doctest::Approx(0.5));
  // 4 batches in 2 s: 2 batches/s, 8 samples/s per rank, 16 in all.
  auto p = tracker.update(sample(0, 5, 5), t0 + milliseconds(2500));
  CHECK(p.samples_per_second == doctest::Approx(16));
  REQUIRE(p.eta_seconds);
  // 5 batches left in epoch 0, then 2 more epochs of 10: 25 batches at 2/s.
  CHECK(*p.eta_seconds == doctest::Approx(12.5));
  CHECK(p.epochs == 3);
  CHECK(p.batch == 5);
  CHECK(p.batches == 10);
}

TEST_CASE("progress: without planned epochs the ETA is the epoch's, a new attempt starts over") {
  auto t0 = Clock::now();
  ProgressTracker tracker(0, t0);
  tracker.update(sample(4, 0, 40), t0);
  auto p = tracker.update(sample(4, 2, 42), t0 + milliseconds(1000));
  REQUIRE(p.eta_seconds);
  CHECK(*p.eta_seconds == doctest::Approx(4.0));  // 8 batches at 2/s
  // Attempt 2 resumes with its own counts: no rate from attempt 1's points.
  auto restarted = tracker.update(sample(4, 1, 1, 2), t0 + milliseconds(1500));
  CHECK(restarted.attempt == 2);
  CHECK(restarted.samples_per_second == 0);
  CHECK_FALSE(restarted.eta_seconds);
}

TEST_CASE("progress: points older than the window stop counting") {
  auto t0 = Clock::now();
  ProgressTracker tracker(0, t0);
  tracker.update(sample(0, 0, 0), t0);
  tracker.update(sample(0, 1, 1), t0 + std::chrono::seconds(10));  // slow start
  tracker.update(sample(0, 2, 11), t0 + std::chrono::seconds(15));
  auto p = tracker.update(sample(0, 3, 21), t0 + std::chrono::seconds(20));
  // The window now starts at 10 s: 20 batches in 10 s.
  CHECK(p.samples_per_second == doctest::Approx(20 * 4 * 2 / 10.0));
}

TEST_CASE("progress: planned epochs come from an integer config value") {
  CHECK(ProgressTracker::planned_epochs({{"epochs", 5}}) == 5);
  CHECK(ProgressTracker::planned_epochs({{"epochs", "5"}}) == 0);
  CHECK(ProgressTracker::planned_epochs({{"epochs", -1}}) == 0);
  CHECK(ProgressTracker::planned_epochs(nlohmann::json::object()) == 0);
}

TEST_CASE("progress: the status line fits its width and keeps control characters out") {
  Progress p;
  p.epoch = 1;
  p.epochs = 4;
  p.batch = 5;
  p.batches = 10;
  p.samples_per_second = 12345;
  p.elapsed_seconds = 3725;
  p.eta_seconds = 61;
  p.metrics = {{"loss", 0.25}, {"\x1b[2Jevil", 1}};
  auto line = status_line(p, 200);
  CHECK(line ==
        "epoch 2/4 [##########----------] 5/10  12.3k samples/s  ?[2Jevil=1  loss=0.25"
        "  1:02:05  ETA 1:01");
  for (size_t width : {20, 45, 60, 79}) {
    auto narrow = status_line(p, width);
    CHECK(narrow.size() <= width);
    CHECK(narrow.find('\x1b') == std::string::npos);
  }
  // Metrics that do not fit are left out whole.
  CHECK(status_line(p, 70).find("loss") == std::string::npos);
}

TEST_CASE("progress: the plain line") {
  Progress p;
  p.epoch = 0;
  p.batch = 3;
  p.batches = 8;
  p.samples_per_second = 40.4;
  p.elapsed_seconds = 65;
  CHECK(progress_line(p) == "progress: epoch 1, batch 3/8, 40 samples/s, elapsed 1:05");
  p.eta_seconds = 9.6;
  CHECK(progress_line(p) ==
        "progress: epoch 1, batch 3/8, 40 samples/s, elapsed 1:05, epoch ETA 0:10");
  CHECK(format_duration(0) == "0:00");
  CHECK(format_duration(3600) == "1:00:00");
}

}  // namespace
}  // namespace trainrun

namespace trainrun {
namespace {

TEST_CASE("progress: batches not known (a sampler of the user's own): no bar, no ETA") {
  auto t0 = Clock::now();
  ProgressTracker tracker(3, t0);
  tracker.update(ProgressSample{1, 1, 0, 1, 0, 1, 8}, t0);
  auto p = tracker.update(ProgressSample{1, 1, 0, 5, 0, 5, 40}, t0 + std::chrono::seconds(2));
  CHECK(p.samples_per_second == doctest::Approx(16));
  CHECK_FALSE(p.eta_seconds);
  CHECK(status_line(p, 100) == "epoch 1/3  batch 5  16 samples/s  0:02");
  CHECK(progress_line(p) == "progress: epoch 1/3, batch 5, 16 samples/s, elapsed 0:02");
  p.eta_seconds = 1e300;  // a rate near zero: the clock stops at its most
  CHECK(status_line(p, 100).find("ETA 99999:00:00") != std::string::npos);
  // Names that are not ASCII are shown as '?' (a byte is a column).
  p.metrics = {{"\xc3\xa9t\xc3\xa9", 1}};
  CHECK(status_line(p, 100).find("  ?\?t?\?=1  ") != std::string::npos);
}

}  // namespace
}  // namespace trainrun

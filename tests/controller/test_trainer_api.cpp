// The embedding API called directly, as a host program would: Trainer, fit,
// Result, load_result.

#include <trainrun/error.h>
#include <trainrun/trainer.h>

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spdlog/sinks/ostream_sink.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../unit/temp_dir.h"
#include "fake_runs.h"

using namespace trainrun;

TEST_CASE("Trainer API: bad options are refused before anything starts") {
  TempDir tmp;
  auto options = fake_options(tmp.path, 2, nlohmann::json::object());
  options.scaling.num_workers = 0;
  CHECK_THROWS_WITH_AS(Trainer{options}, doctest::Contains("num_workers must be at least 1"),
                       UsageError);
  options = fake_options(tmp.path, 2, nlohmann::json::array());
  CHECK_THROWS_WITH_AS(Trainer{options}, "the config must be a JSON object", UsageError);
  options = fake_options(tmp.path, 2, nlohmann::json::object());
  options.plugin.clear();
  CHECK_THROWS_AS(Trainer{options}, UsageError);
}

TEST_CASE("Trainer API: a plugin that cannot be used throws PluginError and starts no worker") {
  TempDir tmp;
  auto options = fake_options(tmp.path, 2, nlohmann::json::object());
  options.plugin = tmp.path / "missing.so";
  Trainer trainer(options);
  CHECK_THROWS_AS(trainer.fit(), PluginError);
  CHECK_FALSE(std::filesystem::exists(tmp.path / "results" / "fake" / "run.json"));
}

TEST_CASE("Trainer API: fit() on real workers returns what load_result reads back") {
  TempDir tmp;
  auto options = fake_options(tmp.path, 2, {{"reports", 2}});
  options.worker_executable = TRAINRUN_WORKER;
  auto result = Trainer(options).fit();
  REQUIRE_FALSE(result.error);
  CHECK(result.iterations == 2);
  CHECK(result.metrics["world_size"] == 2);
  CHECK(result.metrics["rank_sum"] == 1.0);  // a real Gloo allreduce across both ranks
  CHECK(result.wall_seconds > 0);
  auto loaded = load_result(result.path);
  CHECK(loaded.iterations == result.iterations);
  CHECK(loaded.metrics == result.metrics);
  REQUIRE(loaded.history.size() == 2);
  CHECK(loaded.history[1].iteration == 2);
  CHECK_FALSE(loaded.error);
}

TEST_CASE("Trainer API: runs one after another in one process") {
  TempDir tmp;
  for (const char* name : {"first", "second", "third"}) {
    auto result = Trainer(fake_options(tmp.path, 2, {{"reports", 2}}, name)).fit();
    CAPTURE(name);
    CHECK_FALSE(result.error);
    CHECK(result.iterations == 2);
    CHECK(result.path == tmp.path / "results" / name);
  }
}

TEST_CASE("Trainer API: callbacks hear every report, the attempt and the end, in order") {
  TempDir tmp;
  std::vector<std::string> events;
  std::vector<std::string> lines;
  // The handlers before the run (doctest's own among them) stay the run's.
  struct sigaction before[3]{};
  const int kSignals[3] = {SIGINT, SIGHUP, SIGCHLD};
  for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], nullptr, &before[i]);
  Callbacks callbacks;
  callbacks.on_attempt_start = [&](const AttemptInfo& a) {
    events.push_back("start " + std::to_string(a.attempt));
  };
  callbacks.on_report = [&](const ReportRecord& r) {
    events.push_back("report " + std::to_string(r.iteration));
    // No process-wide handler was installed for the run.
    for (int i = 0; i < 3; ++i) {
      struct sigaction current {};
      ::sigaction(kSignals[i], nullptr, &current);
      CHECK((current.sa_handler == before[i].sa_handler));
    }
    if (r.iteration == 2) throw std::runtime_error("a host's bug");  // logged, ignored
  };
  callbacks.on_attempt_end = [&](const AttemptInfo& a) {
    events.push_back("end " + std::to_string(a.attempt) + (a.error ? " failed" : ""));
  };
  callbacks.on_end = [&](const Result& r) {
    events.push_back("result " + std::to_string(r.iterations));
  };
  callbacks.on_output = [&](std::string_view line) { lines.emplace_back(line); };
  auto options = fake_options(tmp.path, 2, {{"reports", 3}});
  options.verbose = true;  // every line, to on_output
  auto result = Trainer(options, callbacks).fit();
  REQUIRE_FALSE(result.error);
  std::string seen;
  for (const auto& e : events) seen += e + "; ";
  INFO(seen);
  CHECK(events == std::vector<std::string>{"start 1", "report 1", "report 2", "report 3", "end 1",
                                           "result 3"});
  auto has = [&](const std::string& text) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.find(text) != std::string::npos; });
  };
  CHECK(has("[trainrun] report 3"));
  CHECK(has("the on_report callback raised: a host's bug"));
  CHECK(std::none_of(lines.begin(), lines.end(),
                     [](const std::string& l) { return l.find('\n') != std::string::npos; }));
}

TEST_CASE("Trainer API: stop() from another thread ends the run as interrupted, in order") {
  TempDir tmp;
  std::atomic<int> reports{0};
  Callbacks callbacks;
  callbacks.on_report = [&](const ReportRecord&) { ++reports; };
  Trainer trainer(fake_options(tmp.path, 2, {{"reports", 1000}, {"report_delay_ms", 20}}),
                  callbacks);
  trainer.stop();  // no run yet: nothing happens
  Result result;
  std::thread run([&] { result = trainer.fit(); });
  for (int i = 0; i < 600 && reports == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto asked = std::chrono::steady_clock::now();
  trainer.stop();
  run.join();
  CHECK(std::chrono::steady_clock::now() - asked < std::chrono::seconds(5));
  REQUIRE(result.error);
  CHECK(result.interrupted());
  CHECK(result.error->message.find("Trainer::stop") != std::string::npos);
  CHECK(result.iterations > 0);
  CHECK(load_result(result.path).status == RunStatus::kInterrupted);
  // A stop() before fit() is forgotten: the run goes to its end.
  Trainer second(fake_options(tmp.path, 2, {{"reports", 2}}, "again"));
  second.stop();
  auto again = second.fit();
  CHECK_FALSE(again.error);
}

TEST_CASE("Trainer API: the run's lines go into a spdlog sink of the host's") {
  TempDir tmp;
  std::ostringstream text;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text);
  sink->set_pattern("host %l: %v");
  Callbacks callbacks;
  callbacks.log_sink = sink;
  auto options = fake_options(tmp.path, 2, {{"reports", 2}, {"scratch", true}});
  options.verbose = true;
  auto result = Trainer(options, callbacks).fit();
  REQUIRE_FALSE(result.error);
  auto out = text.str();
  INFO(out);
  CHECK(out.find("host info: report 2 ") != std::string::npos);  // the controller's
  CHECK(out.find("host info: [rank 1 (") != std::string::npos);  // a worker's output
  CHECK(out.find("host info: run finished: 2 reports") != std::string::npos);
}

TEST_CASE("Trainer API: on_progress hears rank 0's loader, with the run's epochs and a rate") {
  TempDir tmp;
  auto options = fake_options(tmp.path, 2, {{"epochs", 2}, {"sleep_ms", 200}});
  options.worker_executable = TRAINRUN_WORKER;
  options.entry = "epochs";
  std::vector<Progress> seen;
  std::vector<std::string> lines;
  Callbacks callbacks;
  callbacks.on_progress = [&](const Progress& p) { seen.push_back(p); };
  callbacks.on_output = [&](std::string_view line) { lines.emplace_back(line); };
  auto result = Trainer(options, callbacks).fit();
  REQUIRE_FALSE(result.error);
  REQUIRE(seen.size() >= 3);  // each epoch's end, and what the 100 ms gap passed
  for (const auto& p : seen) {
    CHECK(p.attempt == 1);
    CHECK(p.world_size == 2);
    CHECK(p.epochs == 2);
    CHECK(p.batches == 5);  // 10 samples over 2 ranks, one a batch
    CHECK(p.batch <= p.batches);
    CHECK(p.epoch <= 1);
  }
  // Each epoch's end is passed on, complete; the second epoch's comes with
  // the first report's metrics, a rate and an ETA of nothing left.
  const auto& last = seen.back();
  CHECK(last.epoch == 1);
  CHECK(last.batch == 5);
  CHECK(last.steps == 10);
  CHECK(last.metrics["epoch"] == 0);
  CHECK(last.samples_per_second > 0);
  REQUIRE(last.eta_seconds);
  CHECK(*last.eta_seconds == doctest::Approx(0));
  // Plain progress lines go to on_output every interval, and none with verbose off.
  auto progress_lines = [](const std::vector<std::string>& all) {
    return std::count_if(all.begin(), all.end(), [](const std::string& l) {
      return l.find("[trainrun] progress: epoch ") == 0;
    });
  };
  CHECK(progress_lines(lines) == 0);
  for (bool verbose : {true, false}) {
    CAPTURE(verbose);
    lines.clear();
    options.config = {{"epochs", 2}, {"sleep_ms", 300}};  // 3 s of batches
    options.run.name = verbose ? "verbose" : "quiet";
    options.verbose = verbose;
    options.progress_interval = std::chrono::seconds(1);
    REQUIRE_FALSE(Trainer(options, callbacks).fit().error);
    if (verbose) {
      CHECK(progress_lines(lines) >= 1);
    } else {
      CHECK(progress_lines(lines) == 0);
    }
  }
  options.progress_interval = std::chrono::hours(25);
  CHECK_THROWS_WITH_AS(Trainer{options}, doctest::Contains("progress interval"), UsageError);
}

TEST_CASE("Trainer API: report.html keeps a hostile metric name out of its markup and script") {
  TempDir tmp;
  auto options = fake_options(tmp.path, 1, {{"reports", 1}});
  options.worker_executable = TRAINRUN_WORKER;
  auto result = Trainer(options).fit();
  REQUIRE_FALSE(result.error);
  // A record as a hostile rank 0 could have it written: names that close the
  // script, open markup, and are not UTF-8.
  {
    std::ofstream jsonl(result.path / "result.jsonl", std::ios::app);
    jsonl << R"({"iteration":2,"timestamp":1,"time_total_s":2,"attempt":1,"checkpoint":"",)"
          << R"("metrics":{"</script><script>alert(1)</script>":1,"<img src=x>":"</b>"}})"
          << "\n";
  }
  auto page = tmp.path / "page.html";
  write_html_report(result.path, page);
  std::ifstream in(page);
  std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(html.find("<script>alert(1)") == std::string::npos);
  CHECK(html.find("<img src=x>") == std::string::npos);
  CHECK(html.find("\\u003c/script\\u003e\\u003cscript\\u003ealert(1)") != std::string::npos);
  CHECK(html.find("&lt;img src=x&gt;") != std::string::npos);
  // Only the page's own script elements: data, Chart.js, the drawing.
  size_t scripts = 0;
  for (size_t at = 0; (at = html.find("</script>", at)) != std::string::npos; ++at) ++scripts;
  CHECK(scripts == 3);
}

TEST_CASE("Trainer API: a run directory in use names its holder, one that has just locked it too") {
  TempDir tmp;
  auto options = fake_options(tmp.path, 1, {{"reports", 1}}, "held");
  auto dir = options.run.storage_path / "held";
  std::filesystem::create_directories(dir);
  // A holder between its lock and the line that names it.
  int fd = ::open((dir / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  std::thread names([fd] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string holder = "pid 4242 on host elsewhere\n";
    CHECK(::pwrite(fd, holder.data(), holder.size(), 0) == static_cast<ssize_t>(holder.size()));
  });
  CHECK_THROWS_WITH_AS(Trainer(options).fit(),
                       doctest::Contains("is in use by another run (pid 4242 on host elsewhere)"),
                       UsageError);
  names.join();
  ::close(fd);
}

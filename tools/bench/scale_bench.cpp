// One point of the scale simulation: a run of N scripted fake workers
// (tests/fake_worker, no LibTorch) through rendezvous, plugin download and R
// metrics-only report barriers, driven through the Trainer API in this
// process, which is then the controller. Prints one JSON line: time to
// all-ranks-ready; per report and rank, the round trip (REPORT sent to
// REPORT_ACK received, which includes waiting for the last rank to arrive) and
// the release (the last rank's REPORT sent to this rank's REPORT_ACK: what the
// barrier itself costs), p50 and p99 of each; the controller's CPU time and
// peak RSS. tools/bench/scale.py runs it per size.
//
//   scale_bench --workers N --reports R --plugin P --fake-worker F

#include <trainrun/trainer.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>

#include "barrier_times.h"
#include "common/hash.h"

namespace {

double seconds(const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"scale_bench: one size of the fake-worker scale simulation"};
  int workers = 64, reports = 1000;
  std::filesystem::path plugin, fake_worker;
  app.add_option("--workers", workers)->required();
  app.add_option("--reports", reports);
  app.add_option("--plugin", plugin)->required();
  app.add_option("--fake-worker", fake_worker)->required();
  bool warm = false;
  app.add_flag("--warm-cache", warm, "the plugin is in the workers' cache before they start");
  CLI11_PARSE(app, argc, argv);

  char pattern[] = "/tmp/trainrun-scale-XXXXXX";
  std::filesystem::path root = ::mkdtemp(pattern);
  std::filesystem::create_directories(root / "latency");
  trainrun::TrainerOptions options;
  options.plugin = plugin;
  options.entry = "context";  // the test plugin's; fake workers only download it
  options.worker_executable = fake_worker;
  options.scaling.num_workers = workers;
  options.scaling.cpus_per_worker = 1;
  options.config = {{"reports", reports}, {"latency_dir", (root / "latency").string()}};
  options.run.name = "scale";
  options.run.storage_path = root / "results";
  options.cache_dir = root / "cache";
  options.verbose = false;

  options.config["fetch_plugin"] = !warm;  // cold: every worker downloads the plugin
  if (warm) {
    std::filesystem::create_directories(options.cache_dir);
    std::filesystem::copy_file(plugin,
                               options.cache_dir / (trainrun::sha256_file(plugin) + ".so"));
  }
  auto start = std::chrono::system_clock::now();
  auto result = trainrun::Trainer(options).fit();
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);

  double start_s = std::chrono::duration<double>(start.time_since_epoch()).count();
  double ready = 0;
  bench::BarrierTimes times(static_cast<size_t>(reports));
  for (int rank = 0; rank < workers; ++rank) {
    std::ifstream in(root / "latency" / ("rank-" + std::to_string(rank) + ".txt"));
    double t = 0;
    if (in >> t) ready = std::max(ready, t - start_s);
    double sent = 0, acked = 0;
    for (size_t i = 0; i < times.size() && in >> sent >> acked; ++i) {
      times[i].emplace_back(sent, acked);
    }
  }
  auto [round_trips, releases] = bench::round_trips_and_releases(times);
  nlohmann::json out = {
      {"workers", workers},
      {"reports", reports},
      {"ok", !result.error && result.iterations == reports},
      {"error", result.error ? result.error->summary() : ""},
      {"wall_s", result.wall_seconds},
      {"ready_s", ready},
      {"round_trip_p50_us", bench::percentile(round_trips, 0.5)},
      {"round_trip_p99_us", bench::percentile(round_trips, 0.99)},
      {"release_p50_us", bench::percentile(releases, 0.5)},
      {"release_p99_us", bench::percentile(releases, 0.99)},
      {"controller_cpu_s", seconds(usage.ru_utime) + seconds(usage.ru_stime)},
      {"controller_peak_rss_mb", static_cast<double>(usage.ru_maxrss) / 1024.0}};
  std::cout << out.dump() << std::endl;
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  return out["ok"] ? 0 : 1;
}

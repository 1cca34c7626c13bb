// `trainrun --local` (ScalingConfig::in_process): the train function on a
// thread of the trainrun process itself, for a debugger or a sanitizer; what
// it leaves is what a one-worker run leaves.

#include <trainrun/trainer.h>

#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include "run_helpers.h"

namespace {

const std::string kTestPlugin = std::string("--plugin '") + TEST_PLUGIN + "'";

// The keys of each report's metrics, in order: a run's shape, not its values.
std::vector<std::set<std::string>> metric_keys(const std::filesystem::path& run_dir) {
  std::vector<std::set<std::string>> keys;
  for (const auto& report : read_reports(run_dir / "result.jsonl")) {
    auto& these = keys.emplace_back();
    for (const auto& [key, value] : report["metrics"].items()) these.insert(key);
  }
  return keys;
}

// The files of a run directory, relative to it, without the ones a run names
// by its time, host or pid (TensorBoard's) and without the logs.
std::set<std::string> run_files(const std::filesystem::path& run_dir) {
  std::set<std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(run_dir)) {
    auto relative = entry.path().lexically_relative(run_dir).string();
    if (relative.rfind("logs", 0) == 0 || relative.rfind("events.out.tfevents.", 0) == 0) continue;
    files.insert(relative);
  }
  return files;
}

// The plugin copies in a sandbox's cache.
int cached_plugins(const Sandbox& box) {
  int count = 0;
  std::error_code ec;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(box.root() / "cache", ec)) {
    if (entry.path().extension() == ".so") ++count;
  }
  return count;
}

// Runs `args` with --local and again with one worker process, and checks that
// both left runs of the same shape.
void check_same_shape(const Sandbox& box, const std::string& args) {
  auto local = box.run(args + " --name local --local");
  INFO(local.output);
  REQUIRE(local.exit_code == 0);
  CHECK(local.output.find("running the train function in this process (pid ") != std::string::npos);
  // Loaded from the user's own file: nothing was copied into the cache.
  CHECK(cached_plugins(box) == 0);
  auto worker = box.run(args + " --name worker");
  INFO(worker.output);
  REQUIRE(worker.exit_code == 0);
  CHECK(cached_plugins(box) == 1);
  const auto worker_dir = box.run_dir("worker"), local_dir = box.run_dir("local");
  CHECK(metric_keys(local_dir) == metric_keys(worker_dir));
  CHECK_FALSE(metric_keys(local_dir).empty());
  CHECK(run_files(local_dir) == run_files(worker_dir));
  CHECK(read_text(local_dir / "progress.csv").substr(0, 40) ==
        read_text(worker_dir / "progress.csv").substr(0, 40));
  auto info = read_json(local_dir / "run.json");
  CHECK(info["status"] == "finished");
  CHECK(info["scaling"]["in_process"] == true);
  REQUIRE(info["attempts"].size() == 1);
  CHECK(info["attempts"][0]["world_size"] == 1);
  auto results = box.run_in_root("results results/local");
  CHECK(results.exit_code == 0);
}

// A run of `entry` in this process, in the sandbox, with nothing on the terminal.
trainrun::TrainerOptions in_process_run(const Sandbox& box, const std::filesystem::path& plugin,
                                        const std::string& entry, nlohmann::json config,
                                        const std::string& name) {
  trainrun::TrainerOptions options;
  options.cache_dir = box.root() / "cache";
  options.plugin = plugin;
  options.entry = entry;
  options.config = std::move(config);
  options.scaling.in_process = true;
  options.run.storage_path = box.results();
  options.run.name = name;
  options.verbose = false;
  return options;
}

// Runs `options`, which Callbacks::on_report or on_attempt_start stop
// (`stop_at` sets which), and checks that the run was interrupted with
// nothing of the train function's left running.
void check_stopped(const Sandbox& box, const trainrun::TrainerOptions& options, int64_t stop_at) {
  trainrun::Callbacks callbacks;
  trainrun::Trainer* running = nullptr;
  if (stop_at > 0) {
    callbacks.on_report = [&](const trainrun::ReportRecord& report) {
      if (report.iteration == stop_at) running->stop();
    };
  } else {  // before the worker has said HELLO, or just after: either way it ends
    callbacks.on_attempt_start = [&](const trainrun::AttemptInfo&) { running->stop(); };
  }
  trainrun::Trainer trainer(options, callbacks);
  running = &trainer;
  auto result = trainer.fit();
  REQUIRE(result.error);
  CHECK(result.interrupted());
  const auto log = read_text(box.run_dir(options.run.name) / "logs" / "controller.log");
  INFO(log);
  CHECK(log.find("the train thread did not end") == std::string::npos);
  CHECK(log.find("did not exit") == std::string::npos);
  CHECK(log.find("raised") == std::string::npos);
}

// Waits until the run started in the background printed `line`.
bool wait_for_output(const Sandbox& box, const std::string& line) {
  for (int i = 0; i < 1200; ++i) {
    if (box.output_so_far().find(line) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace

TEST_CASE("--local runs the quickstart with results of the same shape as one worker's") {
  Sandbox box;
  check_same_shape(box, std::string("--plugin '") + QUICKSTART_PLUGIN + "'");
}

TEST_CASE("--local runs the Trainer example, checkpoints and all, as one worker does") {
  Sandbox box;
  check_same_shape(box, std::string("--plugin '") + LIGHTNING_FASHION_MNIST_PLUGIN +
                            "' --config epochs=1 --config max_steps=3 --config val_batches=1 "
                            "--config batch_size=16");
  auto reports = read_reports(box.run_dir("local") / "result.jsonl");
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].contains("checkpoint"));
  CHECK(std::filesystem::exists(box.run_dir("local") / "checkpoint_000000" / "manifest.json"));
}

TEST_CASE("gdb --args trainrun --local breaks in the train function") {
  Sandbox box;
  REQUIRE_MESSAGE(::access("/usr/bin/gdb", X_OK) == 0,
                  "gdb is missing: tools/setup.sh --tests installs it");
  // Pending: the plugin is loaded later, by the run.
  auto run = box.run_wrapped(
      "timeout 240 gdb -batch -nx -ex 'set breakpoint pending on' -ex 'break quickstart' "
      "-ex run -ex bt -ex kill --args",
      std::string("--plugin '") + QUICKSTART_PLUGIN + "' --local --name g");
  INFO(run.output);
  CHECK(run.output.find("hit Breakpoint 1, ") != std::string::npos);
  CHECK(run.output.find("in quickstart(train::Config const&)") != std::string::npos);
  // The train thread of the trainrun process, in the user's own file.
  CHECK(run.output.find("trainrun::run_train_thread") != std::string::npos);
  CHECK(run.output.find(std::string("from ") + QUICKSTART_PLUGIN) != std::string::npos);
  CHECK(run.output.find("running the train function in this process") != std::string::npos);
}

TEST_CASE("a sanitizer reaches the train function under --local") {
  Sandbox box;
  REQUIRE_MESSAGE(std::filesystem::exists(LIBASAN), "the compiler has no libasan.so: " LIBASAN);
  auto run = box.run_wrapped("env LD_PRELOAD='" LIBASAN "' ASAN_OPTIONS=detect_leaks=0",
                             std::string("--plugin '") + ASAN_PLUGIN + "' --local --name a");
  INFO(run.output);
  CHECK(run.exit_code != 0);
  CHECK(run.output.find("ERROR: AddressSanitizer: heap-buffer-overflow") != std::string::npos);
  CHECK(run.output.find("in overflow(train::Config const&) ") != std::string::npos);
  CHECK(run.output.find("asan_plugin.cpp:11") != std::string::npos);
}

TEST_CASE("--local refuses what needs worker processes, in one line, before the run starts") {
  Sandbox box;
  const std::pair<const char*, const char*> refused[] = {
      {"-n 2", "it takes no --num-workers 2"},
      {"-n 1:2", "it takes no --num-workers 2"},
      {"--listen tcp://127.0.0.1:0", "it takes no --listen"},
      {"--max-failures 1", "it takes no --max-failures"},
      {"--max-failures -1", "it takes no --max-failures"},
      {"--local-workers 0", "it takes no --local-workers 0"},
  };
  for (const auto& [option, why] : refused) {
    auto run = box.run(kTestPlugin + " --entry steps --local --name r " + option);
    const std::string said = std::string(option) + ": " + run.output;
    INFO(said);
    CHECK(run.exit_code == 2);
    CHECK(run.output.find(why) != std::string::npos);
    CHECK(run.output.rfind("trainrun: --local runs the train function in this process", 0) == 0);
    CHECK(std::count(run.output.begin(), run.output.end(), '\n') == 1);
  }
  CHECK_FALSE(std::filesystem::exists(box.run_dir("r")));
}

TEST_CASE("--local: a train function that raises fails the run as a worker's would") {
  Sandbox box;
  auto run = box.run(kTestPlugin + " --entry throws --config fail_rank=0 --local --name t");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  auto error = read_json(box.run_dir("t") / "error.json");
  CHECK(error["kind"] == "exception");
  CHECK(error["rank"] == 0);
  CHECK(error["message"].get<std::string>().find("boom on rank 0") != std::string::npos);
  // What it reported before is kept.
  CHECK(read_jsonl(box.run_dir("t") / "result.jsonl").size() == 1);
}

TEST_CASE(
    "--local: Ctrl-C ends a run whose train function never returns, and trainrun stacks "
    "shows it") {
  Sandbox box;
  pid_t pid = box.start(kTestPlugin + " --entry sleeps --local --name s");
  REQUIRE(wait_for_output(box, "sleeping"));
  auto stacks = box.run_in_root("stacks results/s");
  INFO(stacks.output);
  CHECK(stacks.exit_code == 0);
  // One process: the controller's threads and the train thread.
  CHECK(stacks.output.find("sleeps(train::Config const&) at ") != std::string::npos);
  CHECK(stacks.output.find("trainrun::Controller::run") != std::string::npos);
  ::kill(pid, SIGINT);
  CHECK(Sandbox::wait(pid) == 130);
  INFO(box.output_so_far());
  CHECK(box.output_so_far().find("run interrupted: interrupted by SIGINT") != std::string::npos);
  auto info = read_json(box.run_dir("s") / "run.json");
  CHECK(info["attempts"][0]["error"]["kind"] == "interrupted");
}

TEST_CASE("Trainer with ScalingConfig::in_process runs the train function in the host program") {
  Sandbox box;
  auto options = in_process_run(box, TEST_PLUGIN, "checkpoints", {{"reports", 3}}, "api");
  std::vector<int64_t> iterations;
  trainrun::Callbacks callbacks;
  callbacks.on_report = [&](const trainrun::ReportRecord& report) {
    iterations.push_back(report.iteration);
  };
  trainrun::Trainer trainer(options, callbacks);
  auto result = trainer.fit();
  REQUIRE_FALSE(result.error);
  CHECK(iterations == std::vector<int64_t>{1, 2, 3});
  REQUIRE_FALSE(result.checkpoint.empty());
  CHECK(std::filesystem::exists(result.checkpoint / "manifest.json"));
  // The train function ran here: this process holds LibTorch now, beside the
  // TensorBoard writer's protobuf, which wrote the run's events.
  CHECK(read_text("/proc/self/maps").find("libtorch_cpu") != std::string::npos);
  bool events = false;
  for (const auto& entry : std::filesystem::directory_iterator(box.run_dir("api"))) {
    events = events || entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  CHECK(events);
  // Another fit() in the same process.
  options.run.name = "api2";
  auto again = trainrun::Trainer(options).fit();
  CHECK_FALSE(again.error);
}

TEST_CASE(
    "Trainer::stop() ends an in-process train function at its next report, and the next "
    "fit() loads a plugin rebuilt at the same path") {
  Sandbox box;
  // A copy, replaced below as a linker replaces its output (a new file).
  const auto plugin = box.root() / "libmodel.so";
  std::filesystem::copy_file(TEST_PLUGIN, plugin);
  auto options =
      in_process_run(box, plugin, "steps", {{"steps", 100000}, {"sleep_ms", 20}}, "stopped");
  // Told at its next report, the train function returns.
  check_stopped(box, options, 3);
  std::filesystem::remove(plugin);
  std::filesystem::copy_file(QUICKSTART_PLUGIN, plugin);
  auto again =
      trainrun::Trainer(in_process_run(box, plugin, "quickstart", {{"steps", 2}}, "rebuilt")).fit();
  INFO((again.error ? again.error->message : std::string()));
  CHECK_FALSE(again.error);
  CHECK(again.iterations == 2);
}

TEST_CASE("Trainer::stop() as an in-process attempt starts ends it, the worker thread and all") {
  Sandbox box;
  check_stopped(
      box,
      in_process_run(box, TEST_PLUGIN, "steps", {{"steps", 100000}, {"sleep_ms", 20}}, "early"), 0);
}

#include <train/version.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "common/torch_line.h"
#include "run_helpers.h"

namespace {

// Runs trainrun expecting a usage or plugin error: exit 2, one line naming the
// problem, and nothing written to storage.
void expect_refused(const std::string& args, const std::string& message) {
  Sandbox box;
  auto run = box.run(args + " -n 2 --name r");
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK(run.output.find(message) != std::string::npos);
  CHECK(std::count(run.output.begin(), run.output.end(), '\n') == 1);
  CHECK_FALSE(std::filesystem::exists(box.run_dir("r")));
}

std::string plugin(const char* path) { return std::string("--plugin '") + path + "'"; }

}  // namespace

TEST_CASE("bad plugins are refused with one line and exit code 2") {
  expect_refused("--plugin /nonexistent/libx.so", "plugin not found: /nonexistent/libx.so");
  expect_refused(std::string("--plugin '") + TEST_SOURCE_DIR + "/CMakeLists.txt'",
                 "is not a shared library (no ELF header)");
  expect_refused(plugin(NO_DESCRIPTOR_PLUGIN), "has no trainrun descriptor");
  expect_refused(plugin(BAD_ABI_PLUGIN), "uses plugin ABI v999, this trainrun uses v1");
  expect_refused(plugin(TORCH_MISMATCH_PLUGIN),
                 "was built with LibTorch 0.9.0, this trainrun uses " TRAINRUN_TORCH_VERSION);
}

TEST_CASE("a plugin that workers cannot load fails with exit code 2 and the loader's reason") {
  Sandbox box;
  auto run = box.run(plugin(UNLOADABLE_PLUGIN) + " -n 2 --name u");
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("cannot load plugin") != std::string::npos);
  CHECK(run.output.find("trainrun_test_symbol_that_does_not_exist") != std::string::npos);
  CHECK(read_json(box.run_dir("u") / "error.json")["kind"] == "plugin");
  CHECK_FALSE(box.any_worker_alive());
}

TEST_CASE("entries: unknown or ambiguous --entry is refused with the list") {
  expect_refused(plugin(TEST_PLUGIN) + " --entry nope",
                 "has no entry 'nope' (available: bad_config, big_checkpoint, broken_pipe, "
                 "checkpoint_overlap, checkpoints, context, ");
  expect_refused(
      plugin(TEST_PLUGIN),
      "has several entries (bad_config, big_checkpoint, broken_pipe, checkpoint_overlap,");
}

TEST_CASE("usage errors exit 2") {
  Sandbox box;
  CHECK(box.run("--num-workers 2").exit_code == 2);  // no --plugin
  CHECK(box.run(plugin(QUICKSTART_PLUGIN) + " --num-workers 0").exit_code == 2);
  CHECK(box.run(plugin(QUICKSTART_PLUGIN) + " --config noequals").exit_code == 2);
  CHECK(box.run("--no-such-flag").exit_code == 2);
  CHECK(box.run(plugin(QUICKSTART_PLUGIN) + " --checkpoint-score-order best").exit_code == 2);
  CHECK(box.run(plugin(QUICKSTART_PLUGIN) + " --num-to-keep -1").exit_code == 2);
  auto help = box.run("--help");
  CHECK(help.exit_code == 0);
  CHECK(help.output.find("--num-workers") != std::string::npos);
  CHECK(help.output.find("trainrun worker --connect") != std::string::npos);
  auto version = box.run("--version");
  CHECK(version.exit_code == 0);
  CHECK(version.output.find("trainrun " TRAIN_SDK_VERSION) != std::string::npos);
}

TEST_CASE("a storage URI other than s3:// is refused in one line before any worker starts, file:// "
          "is a path") {
  Sandbox box;
  for (const char* uri :
       {"s3://Not_A_Bucket/prefix", "s3://bucket/../up", "gs://bucket", "hdfs://namenode:8020/runs",
        "abfs://container@account.dfs.core.windows.net/runs", "S3://b", "file://relative/path"}) {
    CAPTURE(uri);
    auto run =
        box.run_in_root(plugin(QUICKSTART_PLUGIN) + " -n 2 --name u --storage-path '" + uri + "'");
    CHECK(run.exit_code == 2);
    CHECK(run.output.find(std::string("storage path ") + uri) != std::string::npos);
    CHECK(std::count(run.output.begin(), run.output.end(), '\n') == 1);
    CHECK(std::filesystem::is_empty(box.root()));  // no "s3:" directory, no cache, no run
  }
  auto run = box.run_in_root(plugin(QUICKSTART_PLUGIN) + " -n 1 --name f --config steps=1 " +
                             "--storage-path 'file://" + box.results().string() + "'");
  CHECK(run.exit_code == 0);
  CHECK(std::filesystem::exists(box.run_dir("f") / "run.json"));
}

TEST_CASE("--use-gpu where no CUDA device can be used fails with one clear line") {
  if (!TRAINRUN_WITH_CUDA) {
    // Refused before any worker starts.
    expect_refused(plugin(QUICKSTART_PLUGIN) + " --use-gpu",
                   "--use-gpu needs a LibTorch built with CUDA");
    return;
  }
  // A CUDA build: the workers find no device (none visible, whatever the machine has).
  struct HideDevices {
    HideDevices() { ::setenv("CUDA_VISIBLE_DEVICES", "", 1); }
    ~HideDevices() { ::unsetenv("CUDA_VISIBLE_DEVICES"); }
  } hide;
  Sandbox box;
  auto run = box.run(plugin(QUICKSTART_PLUGIN) + " --use-gpu -n 2 --name g");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("needs cuda:0 but this host has 0 CUDA device(s) "
                        "(CUDA_VISIBLE_DEVICES=)") != std::string::npos);
  CHECK(read_json(box.run_dir("g") / "error.json")["kind"] == "setup");
}

TEST_CASE("inspect prints the entries and versions") {
  Sandbox box;
  auto run = box.run(std::string("inspect '") + TEST_PLUGIN + "'");
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK(run.output.find("entries:     bad_config, big_checkpoint, broken_pipe, checkpoint_overlap, "
                        "checkpoints, "
                        "context, crash, deadlock, epochs, hangs, many_metrics, "
                        "mismatch, report_latency, resumable, sleeps, stacked, steps, throws") !=
        std::string::npos);
  CHECK(run.output.find("LibTorch:    " TRAINRUN_TORCH_VERSION) != std::string::npos);
  CHECK(run.output.find("plugin ABI:  v1") != std::string::npos);
  CHECK(box.run(std::string("inspect '") + BAD_ABI_PLUGIN + "'").exit_code == 2);
}

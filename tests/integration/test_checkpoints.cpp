#include <trainrun/result.h>

#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <set>
#include <thread>

#include "common/hash.h"
#include "run_helpers.h"

namespace {

const std::string kCheckpoints =
    std::string("--plugin '") + TEST_PLUGIN + "' --entry checkpoints -n 2 --name c";

// Every file the manifest lists is in `dir`, with its size and sha256.
void check_files_against(const nlohmann::json& manifest, const std::filesystem::path& dir) {
  for (const auto& file : manifest["files"]) {
    auto path = dir / file["path"].get<std::string>();
    CHECK(file["sha256"] == trainrun::sha256_file(path));
    CHECK(file["size"] == std::filesystem::file_size(path));
  }
}

}  // namespace

TEST_CASE("checkpoints from every rank merge into one committed directory with a manifest") {
  Sandbox box;
  auto run = box.run(kCheckpoints);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  auto dir = box.run_dir("c");
  auto results = read_jsonl(dir / "result.jsonl");
  REQUIRE(results.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(results[static_cast<size_t>(i)]["checkpoint"] == "checkpoint_00000" + std::to_string(i));
  }
  auto state = read_json(dir / "checkpoint_state.json");
  CHECK(state["latest"] == "checkpoint_000002");
  CHECK(state["checkpoints"].size() == 3);
  auto latest = dir / "checkpoint_000002";
  auto manifest = read_json(latest / "manifest.json");
  CHECK(manifest["iteration"] == 3);
  CHECK(manifest["ranks"] == nlohmann::json::array({0, 1}));
  REQUIRE(manifest["files"].size() == 3);
  check_files_against(manifest, latest);
  CHECK(read_text(latest / "rank-1.txt") == "rank 1 report 2\n");
  CHECK(read_text(latest / "state" / "model.txt") == "report 2 of none");
}

TEST_CASE("a rerun of the same name resumes from the latest checkpoint and counts on") {
  Sandbox box;
  REQUIRE(box.run(kCheckpoints).exit_code == 0);
  std::filesystem::create_directories(box.run_dir("c") / ".staging-checkpoint_000003");
  auto rerun = box.run(kCheckpoints + " --config reports=2");
  INFO(rerun.output);
  REQUIRE(rerun.exit_code == 0);
  CHECK(rerun.output.find("resuming from checkpoint_000002 (iteration 3)") != std::string::npos);
  // Its own reports, and the count with the earlier run's that its report lines continued.
  CHECK(rerun.output.find("run finished: 2 reports in ") != std::string::npos);
  CHECK(rerun.output.find(" s, 5 with the earlier runs of this name (") != std::string::npos);
  auto results = read_jsonl(box.run_dir("c") / "result.jsonl");
  REQUIRE(results.size() == 5);
  CHECK(results[3]["iteration"] == 4);
  CHECK(results[4]["iteration"] == 5);
  CHECK(results[4]["metrics"]["resumed"] == "report 2 of none");  // get_checkpoint() saw it
  // The rerun's attempt is the run's second: run.json keeps both.
  CHECK(results[2]["attempt"] == 1);
  CHECK(results[3]["attempt"] == 2);
  const auto attempts = read_json(box.run_dir("c") / "run.json")["attempts"];
  REQUIRE(attempts.size() == 2);
  CHECK(attempts[0]["attempt"] == 1);
  CHECK(attempts[1]["attempt"] == 2);
  CHECK(attempts[1]["resumed_from"] == "checkpoint_000002");
  CHECK(read_json(box.run_dir("c") / "checkpoint_state.json")["latest"] == "checkpoint_000004");
  CHECK_FALSE(std::filesystem::exists(box.run_dir("c") / ".staging-checkpoint_000003"));
  auto csv = read_text(box.run_dir("c") / "progress.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 6);  // header and all five reports
}

TEST_CASE("a rerun counts iterations and time on from the last report, not from its checkpoint") {
  Sandbox box;
  // Report 1 checkpoints, report 2 does not; then the run ends.
  auto first = box.run(kCheckpoints + " --config reports=2 checkpoint_every=2");
  REQUIRE(first.exit_code == 0);
  auto rerun = box.run(kCheckpoints + " --config reports=1");
  INFO(rerun.output);
  REQUIRE(rerun.exit_code == 0);
  CHECK(rerun.output.find("resuming from checkpoint_000000 (iteration 1)") != std::string::npos);
  auto results = read_jsonl(box.run_dir("c") / "result.jsonl");
  REQUIRE(results.size() == 3);
  // The rerun repeats the work after iteration 1, and its report is iteration 3.
  CHECK(results[1]["iteration"] == 2);
  CHECK(results[2]["iteration"] == 3);
  CHECK(results[2]["metrics"]["resumed"] == "report 0 of none");
  CHECK(results[2]["time_total_s"].get<double>() > results[1]["time_total_s"].get<double>());
  auto result = trainrun::load_result(box.run_dir("c"));
  REQUIRE(result.history.size() == 3);
  CHECK(result.history.back().iteration == 3);
}

TEST_CASE("retention keeps the best checkpoints by score, and always the latest") {
  auto kept = [](const std::string& flags) {
    Sandbox box;
    auto run = box.run(kCheckpoints + " --config reports=5 " + flags);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    std::vector<std::string> names;
    auto state = read_json(box.run_dir("c") / "checkpoint_state.json");
    for (const auto& c : state["checkpoints"]) {
      names.push_back(c["name"]);
      CHECK(std::filesystem::exists(box.run_dir("c") / c["name"].get<std::string>()));
    }
    size_t dirs = 0;
    for (const auto& entry : std::filesystem::directory_iterator(box.run_dir("c"))) {
      dirs += entry.path().filename().string().rfind("checkpoint_0", 0) == 0;
    }
    CHECK(dirs == names.size());  // the others were deleted
    return names;
  };
  using Names = std::vector<std::string>;
  CHECK(kept("--num-to-keep 2") == Names{"checkpoint_000003", "checkpoint_000004"});
  CHECK(kept("--num-to-keep 2 --checkpoint-score-attribute i --checkpoint-score-order min") ==
        Names{"checkpoint_000000", "checkpoint_000001", "checkpoint_000004"});
  CHECK(kept("--num-to-keep 1 --checkpoint-score-attribute i --checkpoint-score-order max") ==
        Names{"checkpoint_000004"});
  CHECK(kept("").size() == 5);
  CHECK(kept("--num-to-keep 2 --config upload_mode=async") ==
        Names{"checkpoint_000003", "checkpoint_000004"});
}

TEST_CASE("a full disk fails the run and leaves every earlier checkpoint intact") {
  // Copied by the workers themselves, or streamed and written by the
  // controller; while report waits, or after it returned.
  for (std::string upload : {"auto", "stream", "auto async", "stream async"}) {
    CAPTURE(upload);
    const bool async = upload.find(" async") != std::string::npos;
    upload = upload.substr(0, upload.find(' '));
    Sandbox box;
    auto small = box.results();  // the run's storage, on a 2 MiB filesystem
    std::filesystem::create_directories(small);
    if (std::system(
            ("mount -t tmpfs -o size=2m tmpfs '" + small.string() + "' 2>/dev/null").c_str())) {
      MESSAGE("skipped: mounting a small tmpfs needs root");
      return;
    }
    struct Unmount {
      std::string path;
      ~Unmount() { std::system(("umount '" + path + "'").c_str()); }
    } unmount{small.string()};
    // 700 KiB per checkpoint, beside report.html (about 200 KiB): the third
    // does not fit in 2 MiB.
    auto run =
        box.run(kCheckpoints + " --config reports=3 --config pad_kb=700" + " --checkpoint-upload " +
                upload + (async ? " --config upload_mode=async" : ""));
    INFO(run.output);
    auto dir = small / "c";
    REQUIRE(std::filesystem::exists(dir / "checkpoint_state.json"));
    REQUIRE(std::filesystem::exists(dir / "error.json"));
    auto state = read_json(dir / "checkpoint_state.json");
    auto leftovers = staging_leftovers(dir);
    auto latest = dir / state["latest"].get<std::string>();
    auto manifest = read_json(latest / "manifest.json");
    std::vector<std::string> bad;
    for (const auto& file : manifest["files"]) {
      auto path = latest / file["path"].get<std::string>();
      if (trainrun::sha256_file(path) != file["sha256"]) bad.push_back(path);
    }
    auto error = read_json(dir / "error.json");
    CHECK(run.exit_code == 1);
    CHECK(error["kind"] == "storage");
    CHECK(error["message"].get<std::string>().find("No space left on device") != std::string::npos);
    CHECK(state["latest"] == "checkpoint_000001");
    CHECK(bad.empty());
    CHECK(leftovers.empty());
  }
}

TEST_CASE("trainrun results shows metrics, the best checkpoints by score, and the error") {
  Sandbox box;
  auto run = box.run(kCheckpoints +
                     " --config reports=4 --num-to-keep 2 --checkpoint-score-attribute i"
                     " --checkpoint-score-order min");
  REQUIRE(run.exit_code == 0);
  // The run's own summary names the kept checkpoints too.
  CHECK(run.output.find("checkpoint checkpoint_000000 (iteration 1)") != std::string::npos);
  auto results = box.run("results '" + box.run_dir("c").string() + "'");
  INFO(results.output);
  CHECK(results.exit_code == 0);
  CHECK(results.output.find("status:       finished") != std::string::npos);
  CHECK(results.output.find("iterations:   4") != std::string::npos);
  CHECK(results.output.find("last metrics: i=3 resumed=none") != std::string::npos);
  CHECK(results.output.find("checkpoint:   " + (box.run_dir("c") / "checkpoint_000003").string()) !=
        std::string::npos);
  // Best first by the run's score (min i): 0, 1, then the latest, always kept.
  auto first = results.output.find("  checkpoint_000000  iteration 1");
  auto second = results.output.find("  checkpoint_000001  iteration 2");
  auto latest = results.output.find("  checkpoint_000003  iteration 4");
  CHECK(first < second);
  CHECK(second < latest);
  CHECK(latest != std::string::npos);

  auto failed = box.run(std::string("--plugin '") + TEST_PLUGIN + "' --entry throws -n 2 --name t");
  CHECK(failed.exit_code == 1);
  auto failed_results = box.run("results '" + box.run_dir("t").string() + "'");
  CHECK(failed_results.output.find("status:       failed") != std::string::npos);
  CHECK(failed_results.output.find("error:        rank 1 (") != std::string::npos);
  CHECK(box.run("results /nonexistent").exit_code == 2);
}

TEST_CASE("--resume-from starts a new run from another run's checkpoint") {
  Sandbox box;
  REQUIRE(box.run(kCheckpoints).exit_code == 0);
  auto from = box.run_dir("c") / "checkpoint_000001";
  auto run = box.run(std::string("--plugin '") + TEST_PLUGIN +
                     "' --entry checkpoints -n 2 --name fresh --config reports=1 --resume-from '" +
                     from.string() + "'");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  auto results = read_jsonl(box.run_dir("fresh") / "result.jsonl");
  REQUIRE(results.size() == 1);
  CHECK(results[0]["iteration"] == 1);                            // a new run counts from 1
  CHECK(results[0]["metrics"]["resumed"] == "report 1 of none");  // from checkpoint_000001
  CHECK(results[0]["checkpoint"] == "checkpoint_000000");
  auto bad = box.run(kCheckpoints + " --resume-from '" + box.root().string() + "'");
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("is not a committed checkpoint") != std::string::npos);
}

TEST_CASE("a corrupted checkpoint file is detected when the checkpoint is loaded") {
  Sandbox box;
  REQUIRE(box.run(kCheckpoints).exit_code == 0);
  std::ofstream(box.run_dir("c") / "checkpoint_000002" / "rank-0.txt") << "tampered";
  auto rerun = box.run(kCheckpoints);
  CHECK(rerun.exit_code == 1);
  CHECK(rerun.output.find("rank-0.txt is missing or corrupt") != std::string::npos);
}

TEST_CASE("a state file that names a missing checkpoint is a clear error") {
  Sandbox box;
  REQUIRE(box.run(kCheckpoints).exit_code == 0);
  std::filesystem::remove_all(box.run_dir("c") / "checkpoint_000002");
  auto rerun = box.run(kCheckpoints);
  CHECK(rerun.exit_code == 1);
  CHECK(rerun.output.find("names checkpoint checkpoint_000002, which is missing") !=
        std::string::npos);
}

TEST_CASE("unsafe or clashing checkpoint files are refused and nothing is committed") {
  Sandbox box;
  auto clash = box.run(kCheckpoints + " --config same_name=true");
  CHECK(clash.exit_code == 1);
  CHECK(clash.output.find("both report a checkpoint file named state/model.txt") !=
        std::string::npos);
  CHECK_FALSE(std::filesystem::exists(box.run_dir("c") / "checkpoint_000000"));

  Sandbox box2;
  auto link = box2.run(kCheckpoints + " --config symlink=true");
  CHECK(link.exit_code == 1);
  CHECK(link.output.find("symbolic link, escape") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(box2.run_dir("c") / "checkpoint_000000"));
  // One rank's files were staged when the run failed: nothing is left of them.
  CHECK(staging_leftovers(box2.run_dir("c")).empty());
}

TEST_CASE("asynchronous checkpoints: handed over, committed after their report, one at a time") {
  // Copied by the workers, or streamed (10 MiB: more chunks than the credit).
  for (std::string upload : {"auto", "stream"}) {
    CAPTURE(upload);
    Sandbox box;
    auto parent = box.root() / "handed";
    auto run = box.run(kCheckpoints + " --config upload_mode=async --config reports=4" +
                       " --config pad_kb=10240 --config parent=" + parent.string() +
                       " --checkpoint-upload " + upload);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    auto dir = box.run_dir("c");
    // Each report's line, then its commit's: the next report with a
    // checkpoint waited for the commit before it.
    auto lines = read_jsonl(dir / "result.jsonl");
    REQUIRE(lines.size() == 8);
    for (size_t i = 0; i < 8; i += 2) {
      CHECK(lines[i]["iteration"] == static_cast<int64_t>(i / 2 + 1));
      CHECK(lines[i]["metrics"]["i"] == static_cast<int64_t>(i / 2));
      CHECK_FALSE(lines[i].contains("checkpoint"));  // not committed when recorded
      CHECK(lines[i + 1]["iteration"] == lines[i]["iteration"]);
      CHECK(lines[i + 1]["checkpoint"] == "checkpoint_00000" + std::to_string(i / 2));
      CHECK_FALSE(lines[i + 1].contains("metrics"));
      CHECK(lines[i + 1]["committed_at"].get<double>() >= lines[i]["timestamp"].get<double>());
    }
    // Read back, each report carries its checkpoint.
    auto result = trainrun::load_result(dir);
    REQUIRE(result.history.size() == 4);
    CHECK(result.history[3].checkpoint == "checkpoint_000003");
    CHECK(result.checkpoint.filename() == "checkpoint_000003");
    auto latest = dir / "checkpoint_000003";
    auto manifest = read_json(latest / "manifest.json");
    CHECK(manifest["iteration"] == 4);
    CHECK(manifest["metrics"]["i"] == 3);
    CHECK(manifest["ranks"] == nlohmann::json::array({0, 1}));
    REQUIRE(manifest["files"].size() == 4);
    check_files_against(manifest, latest);
    CHECK(read_text(latest / "rank-1.txt") == "rank 1 report 3\n");
    // The directories were moved away at the call and deleted after upload.
    REQUIRE(std::filesystem::exists(parent));
    CHECK(std::filesystem::is_empty(parent));
    // A rerun resumes from the last one.
    auto rerun = box.run(kCheckpoints + " --config upload_mode=async --config reports=1" +
                         " --checkpoint-upload " + upload);
    INFO(rerun.output);
    REQUIRE(rerun.exit_code == 0);
    CHECK(trainrun::load_result(dir).history.back().metrics["resumed"] == "report 3 of none");
  }
}

TEST_CASE("an asynchronous checkpoint that cannot be handed over is refused and stays") {
  Sandbox box;
  // Inside the run directory: moving it would move part of the run.
  auto run = box.run(kCheckpoints + " --config upload_mode=async --config parent=@run");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("lies inside the run directory") != std::string::npos);
  CHECK(std::filesystem::exists(box.run_dir("c") / "rank-0" / "rank-0.txt"));
  CHECK_FALSE(std::filesystem::exists(box.run_dir("c") / "checkpoint_000000"));

  // Ranks that disagree on the mode.
  Sandbox box2;
  auto mixed = box2.run(kCheckpoints + " --config upload_mode=mixed");
  INFO(mixed.output);
  CHECK(mixed.exit_code == 1);
  CHECK(mixed.output.find("every rank must pass the same train::CheckpointUploadMode") !=
        std::string::npos);
  CHECK_FALSE(std::filesystem::exists(box2.run_dir("c") / "checkpoint_000000"));
  // One rank's files were staged when the run failed: nothing is left of them.
  CHECK(staging_leftovers(box2.run_dir("c")).empty());
}

TEST_CASE("streamed checkpoints merge, commit, and are fetched to resume from") {
  Sandbox box;
  // 10 MiB from rank 0: more chunks than the credit lets fly at once.
  const auto streamed = kCheckpoints + " --checkpoint-upload stream --config pad_kb=10240";
  auto run = box.run(streamed);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  auto dir = box.run_dir("c");
  auto latest = dir / "checkpoint_000002";
  auto manifest = read_json(latest / "manifest.json");
  CHECK(manifest["ranks"] == nlohmann::json::array({0, 1}));
  REQUIRE(manifest["files"].size() == 4);
  check_files_against(manifest, latest);
  CHECK(std::filesystem::file_size(latest / "pad.bin") == 10240 * 1024);
  CHECK(read_text(latest / "rank-1.txt") == "rank 1 report 2\n");

  auto rerun = box.run(streamed + " --config reports=1");
  INFO(rerun.output);
  REQUIRE(rerun.exit_code == 0);
  auto results = read_jsonl(dir / "result.jsonl");
  REQUIRE(results.size() == 4);
  CHECK(results[3]["metrics"]["resumed"] == "report 2 of none");
  // Fetched into the worker's own directory, not read from the run's storage,
  // and removed when the worker ended.
  auto fetched = results[3]["metrics"]["resumed_from"].get<std::string>();
  CHECK(fetched.rfind(box.root().string(), 0) != 0);
  CHECK(std::filesystem::path(fetched).filename() == "checkpoint_000002");
  CHECK_FALSE(std::filesystem::exists(fetched));
}

TEST_CASE("a corrupted checkpoint is detected when a worker fetches it") {
  Sandbox box;
  const auto streamed = kCheckpoints + " --checkpoint-upload stream";
  REQUIRE(box.run(streamed).exit_code == 0);
  // The same size as "report 2 of none": only the sha256 tells.
  std::ofstream(box.run_dir("c") / "checkpoint_000002" / "state" / "model.txt")
      << "report 9 of none";
  auto rerun = box.run(streamed);
  CHECK(rerun.exit_code == 1);
  CHECK(rerun.output.find("state/model.txt of checkpoint_000002 arrived corrupt") !=
        std::string::npos);
}

TEST_CASE("a crash after any step of a commit: the next run recovers, from what is on disk") {
  struct Case {
    const char* point;
    const char* resumed;  // what the rerun's train function found to resume from
  };
  // The first commit, then the second (which drops checkpoint_000000: --num-to-keep 1).
  for (auto [point, resumed] :
       {Case{"commit:staged", "none"}, Case{"commit:manifest", "none"},
        Case{"commit:renamed", "report 0 of none"}, Case{"commit:renamed@2", "report 1 of none"},
        Case{"commit:state@2", "report 1 of none"}, Case{"commit:deleted@2", "report 1 of none"}}) {
    CAPTURE(point);
    Sandbox box;
    ::setenv("TRAINRUN_CRASH_POINT", point, 1);
    auto crashed = box.run(kCheckpoints + " --num-to-keep 1 --config reports=3");
    ::unsetenv("TRAINRUN_CRASH_POINT");
    CHECK(crashed.exit_code == 86);  // the controller died there, as kill -9 would end it
    auto status = box.run("results '" + box.run_dir("c").string() + "'");
    CHECK(status.output.find("status:       crashed") != std::string::npos);

    auto rerun = box.run(kCheckpoints + " --num-to-keep 1 --config reports=1");
    INFO(rerun.output);
    REQUIRE(rerun.exit_code == 0);
    auto dir = box.run_dir("c");
    CHECK(read_jsonl(dir / "result.jsonl").back()["metrics"]["resumed"] == resumed);
    // Nothing half-done is left, and the state and the disk agree.
    auto state = read_json(dir / "checkpoint_state.json");
    std::set<std::string> listed, on_disk;
    for (const auto& c : state["checkpoints"]) listed.insert(c["name"].get<std::string>());
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      auto name = entry.path().filename().string();
      CHECK(name.find(".tmp.") == std::string::npos);
      CHECK(name.rfind(".staging-", 0) != 0);
      if (name.rfind("checkpoint_0", 0) == 0) on_disk.insert(name);
    }
    CHECK(listed == on_disk);
    auto latest = dir / state["latest"].get<std::string>();
    check_files_against(read_json(latest / "manifest.json"), latest);
  }
}

TEST_CASE("a second run of the same name while the first is live is refused, naming it") {
  Sandbox box;
  pid_t first = box.start(kCheckpoints + " --config reports=1000 --config pad_kb=64");
  std::string seen;
  for (int i = 0; i < 300 && seen.find("report 2") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    seen = box.output_so_far();
  }
  auto second = box.run(kCheckpoints);
  CHECK(second.exit_code == 2);
  CHECK(second.output.find("is in use by another run (pid " + std::to_string(first) + " on host") !=
        std::string::npos);
  auto status = box.run("results '" + box.run_dir("c").string() + "'");
  CHECK(status.output.find("status:       running") != std::string::npos);
  ::kill(first, SIGTERM);
  CHECK(Sandbox::wait(first) == 130);
  CHECK(read_json(box.run_dir("c") / "run.json")["status"] == "interrupted");
}

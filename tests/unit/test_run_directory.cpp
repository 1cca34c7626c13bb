#include <trainrun/error.h>

#include <doctest/doctest.h>

#include <fstream>

#include "storage/run_directory.h"
#include "temp_dir.h"

using namespace trainrun;
namespace rd = trainrun::run_directory;

TEST_CASE("run directory: run.json round-trips and keeps its shape") {
  TempDir tmp;
  CHECK_FALSE(rd::read_run_info(tmp.path));
  rd::RunInfo info;
  info.name = "r";
  info.plugin.sha256 = "abc";
  info.scaling.num_workers = 3;
  info.config = {{"lr", 0.1}};
  info.checkpoint.score_attribute = "loss";
  info.checkpoint.score_max = false;
  info.status = RunStatus::kInterrupted;
  rd::write_run_info(tmp.path, info);
  auto back = rd::read_run_info(tmp.path);
  REQUIRE(back);
  CHECK(back->name == "r");
  CHECK(back->plugin.sha256 == "abc");
  CHECK(back->scaling.num_workers == 3);
  CHECK(back->config["lr"] == 0.1);
  CHECK(back->checkpoint.score_attribute == "loss");
  CHECK_FALSE(back->checkpoint.score_max);
  CHECK(back->status == RunStatus::kInterrupted);
  std::ifstream in(tmp.path / "run.json");
  auto j = nlohmann::json::parse(in);
  CHECK(j["checkpoint"]["score_order"] == "min");
  CHECK(j["status"] == "interrupted");
  CHECK_FALSE(j.contains("ended_at"));
}

TEST_CASE("run directory: a malformed file is an IoError naming it") {
  TempDir tmp;
  std::ofstream(tmp.path / "run.json") << "{\"status\": 7}";
  CHECK_THROWS_WITH_AS(rd::read_run_info(tmp.path), doctest::Contains("run.json is malformed"),
                       IoError);
  std::ofstream(tmp.path / "checkpoint_state.json") << "[1, 2";
  CHECK_THROWS_WITH_AS(rd::read_checkpoint_state(tmp.path),
                       doctest::Contains("checkpoint_state.json"), IoError);
  std::ofstream(tmp.path / "error.json") << "{\"kind\": \"exception\", \"rank\": \"one\"}";
  CHECK_THROWS_AS(rd::read_error(tmp.path), IoError);
}

TEST_CASE("run directory: result.jsonl lines, a line cut short by a crash skipped") {
  TempDir tmp;
  {
    std::ofstream out(tmp.path / "result.jsonl");
    out << rd::result_line({1, 10.5, 0.5, {{"loss", 1.0}}, ""});
    out << rd::result_line({2, 11.5, 1.5, {{"loss", 0.5}}, "checkpoint_000000"});
    out << "{\"iteration\": 3, \"metr";
  }
  auto records = rd::read_results(tmp.path);
  REQUIRE(records.size() == 2);
  CHECK(records[0].metrics["loss"] == 1.0);
  CHECK(records[0].checkpoint.empty());
  CHECK(records[1].checkpoint == "checkpoint_000000");
  CHECK(records[1].time_total_s == 1.5);
}

TEST_CASE("run directory: text that is not UTF-8 is written, not thrown over") {
  TempDir tmp;
  auto line = rd::result_line({1, 0, 0, {{"note", "caf\xe9"}}, ""});
  CHECK(line.find("caf\xef\xbf\xbd") != std::string::npos);  // U+FFFD for the stray byte
  rd::write_error(tmp.path, RunError{FailureKind::kException, "raised: \xff\xfe", 0, "h", 1});
  auto error = rd::read_error(tmp.path);
  REQUIRE(error);
  CHECK(error->kind == FailureKind::kException);
  CHECK(error->message.rfind("raised: ", 0) == 0);
}

TEST_CASE("run directory: checkpoint state and manifest round-trip") {
  TempDir tmp;
  CHECK(rd::read_checkpoint_state(tmp.path).latest.empty());
  rd::CheckpointState state;
  state.checkpoints = {{"checkpoint_000000", {}, 2, {{"loss", 3}}},
                       {"checkpoint_000001", {}, 4, {{"loss", 1}}}};
  state.latest = "checkpoint_000001";
  state.next_index = 2;
  rd::write_checkpoint_state(tmp.path, state);
  auto back = rd::read_checkpoint_state(tmp.path);
  REQUIRE(back.checkpoints.size() == 2);
  CHECK(back.checkpoints[1].path == tmp.path / "checkpoint_000001");
  CHECK(back.latest_checkpoint()->iteration == 4);
  CHECK(back.next_index == 2);
  rd::write_manifest(tmp.path, {7, {{"a", 1}}, {0, 1}, {{"x.pt", 3, std::string(64, 'f'), 1}}});
  auto manifest = rd::read_manifest(tmp.path);
  CHECK(manifest.iteration == 7);
  REQUIRE(manifest.files.size() == 1);
  CHECK(manifest.files[0].rank == 1);
  CHECK_THROWS_WITH_AS(rd::verify_checkpoint(tmp.path), doctest::Contains("x.pt"), IoError);
}

TEST_CASE("run directory: checkpoints rank by score, those without it last") {
  CheckpointConfig by_loss;
  by_loss.score_attribute = "loss";
  by_loss.score_max = false;
  CheckpointInfo low{"a", {}, 1, {{"loss", 0.1}}}, high{"b", {}, 2, {{"loss", 0.9}}},
      none{"c", {}, 3, {{"acc", 1}}};
  CHECK(rd::ranks_before(low, high, by_loss));
  CHECK_FALSE(rd::ranks_before(high, low, by_loss));
  CHECK(rd::ranks_before(high, none, by_loss));
  CHECK(rd::ranks_before(none, low, CheckpointConfig{}));  // most recent first
}

TEST_CASE("failure kinds: names at the edge, and back") {
  for (auto kind : {FailureKind::kException, FailureKind::kSignal, FailureKind::kExit,
                    FailureKind::kLost, FailureKind::kSetup, FailureKind::kPlugin,
                    FailureKind::kUsage, FailureKind::kStorage, FailureKind::kInterrupted}) {
    CHECK(parse_failure_kind(to_string(kind)) == kind);
  }
  CHECK(to_string(FailureKind::kStorage) == "storage");
  CHECK_FALSE(parse_failure_kind("meltdown"));
}

TEST_CASE("run directory: a checkpoint state that names paths outside the run is refused") {
  TempDir tmp;
  for (const char* state :
       {R"({"checkpoints": [{"name": "../elsewhere", "iteration": 1}], "latest": null,
            "next_index": 1})",
        R"({"checkpoints": [{"name": "/home", "iteration": 1}], "latest": null, "next_index": 1})",
        R"({"checkpoints": [], "latest": "checkpoint_000003", "next_index": 4})",
        R"({"checkpoints": [], "latest": null, "next_index": -2})"}) {
    CAPTURE(state);
    std::ofstream(tmp.path / "checkpoint_state.json") << state;
    CHECK_THROWS_AS(rd::read_checkpoint_state(tmp.path), IoError);
  }
}

TEST_CASE("run directory: a state file that exists but cannot be read is not taken for none") {
  TempDir tmp;
  std::filesystem::create_directory(tmp.path / "checkpoint_state.json");  // unreadable as a file
  CHECK_THROWS_WITH_AS(rd::read_checkpoint_state(tmp.path),
                       doctest::Contains("checkpoint_state.json"), IoError);
}

// The embedding API called directly, as a host program would: Trainer, fit,
// Result, load_result.

#include <trainrun/error.h>
#include <trainrun/trainer.h>

#include <doctest/doctest.h>

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

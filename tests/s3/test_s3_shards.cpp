// Sharded data in object storage: shards and their indexes on a real S3
// server (SeaweedFS on loopback), read by ranges through the workers' host
// table (tests/plugins/shards_plugin.cpp counts what was trained).

#include <doctest/doctest.h>

#include <regex>
#include <thread>

#include "run_helpers.h"
#include "s3_server.h"

namespace {

constexpr int kSamples = 600;

// Packs the samples and uploads shards and indexes to s3://data/shards/;
// returns the s3:// spec.
std::string upload_shards(const Sandbox& box, const S3Server& server) {
  pack_id_samples(box, kSamples);
  server.tool("mb data");
  for (const auto& entry : std::filesystem::directory_iterator(box.root() / "shards")) {
    server.tool("put data shards/" + entry.path().filename().string() + " " +
                entry.path().string());
  }
  return "s3://data/shards/train-{0000..0011}.tar";
}

std::string shards_run(const std::string& spec, const std::string& name, const std::string& more) {
  return std::string("--plugin '") + SHARDS_PLUGIN + "' --entry fit -n 2 --name " + name +
         " --config shards='" + spec + "' --config samples=" + std::to_string(kSamples) + " " +
         more;
}

}  // namespace

TEST_CASE("sharded data in s3:// trains every sample exactly once per epoch on 2 ranks") {
  Sandbox box;
  S3Server server(box.root() / "s3");
  const auto spec = upload_shards(box, server);
  auto run = box.run(shards_run(spec, "s3", "--config epochs=2"));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(trained_line(run.output) == each_trained(2, kSamples));
}

TEST_CASE("an s3:// shard without its index object, or missing, is refused in one line") {
  Sandbox box;
  S3Server server(box.root() / "s3");
  const auto spec = upload_shards(box, server);
  server.tool("rm data shards/train-0003.tar.idx");
  auto run = box.run(shards_run(spec, "noindex", ""));
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("shard s3://data/shards/train-0003.tar has no index object "
                        "s3://data/shards/train-0003.tar.idx (index the shards where they were "
                        "written, with trainrun index, and upload each .idx beside its shard)") !=
        std::string::npos);
  auto missing = box.run(shards_run("s3://data/shards/none.tar", "missing", ""));
  CHECK(missing.exit_code == 1);
  CHECK(missing.output.find("shard s3://data/shards/none.tar: no such object") !=
        std::string::npos);
}

TEST_CASE("an s3:// shard deleted mid-epoch ends the run naming it, the checkpoints before kept") {
  Sandbox box;
  S3Server server(box.root() / "s3");
  const auto spec = upload_shards(box, server);
  // Slow steps; the shards go once the first checkpoint (step 6) is in.
  const pid_t run = box.start(shards_run(spec, "gone", "--config epochs=2 --config step_sleep_ms=150"));
  bool checkpointed = false;
  for (int i = 0; i < 600 && !checkpointed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    checkpointed = box.output_so_far().find("-> checkpoint_000000") != std::string::npos;
  }
  REQUIRE(checkpointed);
  for (int shard = 0; shard < 12; ++shard) {
    char key[40];
    std::snprintf(key, sizeof(key), "shards/train-%04d.tar", shard);
    server.tool(std::string("rm data ") + key);
  }
  CHECK(Sandbox::wait(run) == 1);
  const auto output = box.output_so_far();
  INFO(output);
  CHECK(std::regex_search(output, std::regex("shard s3://data/shards/train-00[0-9][0-9].tar, "
                                             "sample [0-9]+: the object is gone, or ends before "
                                             "byte [0-9]+ \\(GET s3://data/shards/train-")));
  CHECK(std::filesystem::exists(box.run_dir("gone") / "checkpoint_000000"));
}

TEST_CASE("with a cache directory, the later epochs of s3:// shards train with the store gone") {
  Sandbox box;
  S3Server server(box.root() / "s3");
  const auto spec = upload_shards(box, server);
  // A chunk cache of 64 KiB in memory holds a few chunks: epoch 1 reads its
  // chunks from the cache directory, where epoch 0 left them.
  const auto cache = box.root() / "cache";
  const pid_t run = box.start(shards_run(spec, "cached",
                                         "--config epochs=2 --config step_sleep_ms=100"
                                         " --config cache_kb=64 --config cache_dir=" +
                                             cache.string()));
  bool epoch_done = false;
  for (int i = 0; i < 1200 && !epoch_done; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    epoch_done = box.output_so_far().find("step=30") != std::string::npos;
  }
  REQUIRE(epoch_done);
  server.stop();
  CHECK(Sandbox::wait(run) == 0);
  const auto output = box.output_so_far();
  INFO(output);
  CHECK(trained_line(output) == each_trained(2, kSamples));
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(cache)) {
    files += entry.path().extension() == ".chunk" ? 1 : 0;
  }
  CHECK(files == 84);  // 12 shards of 50 samples: 6 chunks of 8 and one of 2 each
}

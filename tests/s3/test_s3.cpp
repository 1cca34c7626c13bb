// Runs in S3-compatible object storage, against a real server (SeaweedFS on
// loopback), with the objects checked through boto3 rather than trainrun's
// own client.

#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "common/hash.h"
#include "run_helpers.h"
#include "s3_server.h"

namespace {

const std::string kPlugin = std::string("--plugin '") + TEST_PLUGIN + "' ";

// "key size" lines of `s3tool ls`, as key -> size.
std::map<std::string, uint64_t> objects(const S3Server& server, const std::string& prefix) {
  std::map<std::string, uint64_t> found;
  std::istringstream lines(server.tool("ls runs '" + prefix + "'"));
  std::string key;
  uint64_t size;
  while (lines >> key >> size) found[key] = size;
  return found;
}

bool any_under(const std::map<std::string, uint64_t>& found, const std::string& prefix) {
  for (const auto& [key, size] : found) {
    if (key.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// Every file the stored manifest lists is stored with its size and sha256.
void check_checkpoint(const S3Server& server, const std::filesystem::path& scratch,
                      const std::string& checkpoint) {
  auto manifest = nlohmann::json::parse(server.tool("get runs '" + checkpoint + "/manifest.json'"));
  REQUIRE(!manifest["files"].empty());
  for (const auto& file : manifest["files"]) {
    auto key = checkpoint + "/" + file["path"].get<std::string>();
    auto local = scratch / "object";
    server.tool("get runs '" + key + "' > '" + local.string() + "'");
    INFO(key);
    CHECK(file["size"] == std::filesystem::file_size(local));
    CHECK(file["sha256"] == trainrun::sha256_file(local));
  }
}

// result.jsonl's reports as run_helpers reads them (an asynchronous commit
// folded into its report).
std::vector<nlohmann::json> stored_reports(const S3Server& server,
                                           const std::filesystem::path& scratch,
                                           const std::string& run) {
  auto local = scratch / "result.jsonl";
  std::ofstream(local) << server.tool("get runs '" + run + "/result.jsonl'");
  return read_reports(local);
}

}  // namespace

TEST_CASE(
    "a run in object storage commits each rank's parts with the manifest last, keeps the "
    "latest, and a rerun resumes from it through one download per host") {
  Sandbox box;
  S3Server server(box.root() / "s3");
  server.tool("mb runs");
  // 40 MiB on rank 0: a multipart upload of 5 parts.
  const auto args = kPlugin +
                    "--entry checkpoints -n 2 --name c --storage-path s3://runs/team/exp "
                    "--num-to-keep 1 --config pad_kb=40960";
  auto run = box.run_in_root(args);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("results: s3://runs/team/exp/c") != std::string::npos);
  auto stored = objects(server, "team/exp/c/");
  CHECK(stored.count("team/exp/c/run.json") == 1);
  CHECK(stored.count("team/exp/c/result.jsonl") == 1);
  CHECK(stored.count("team/exp/c/progress.csv") == 1);
  CHECK(stored.count("team/exp/c/report.html") == 1);
  CHECK(stored.count("team/exp/c/logs/controller.log") == 1);
  // Retention deleted the older ones whole.
  CHECK_FALSE(any_under(stored, "team/exp/c/checkpoint_000000/"));
  CHECK_FALSE(any_under(stored, "team/exp/c/checkpoint_000001/"));
  CHECK(stored["team/exp/c/checkpoint_000002/pad.bin"] == 40960u * 1024);
  check_checkpoint(server, box.root(), "team/exp/c/checkpoint_000002");
  CHECK(server.tool("uploads runs team/").empty());
  auto state = nlohmann::json::parse(server.tool("get runs team/exp/c/checkpoint_state.json"));
  CHECK(state["latest"] == "checkpoint_000002");
  // No credential in anything the run wrote, here or there.
  for (const auto& [key, size] : stored) {
    if (key.find("checkpoint_") != std::string::npos && key.find(".json") == std::string::npos) {
      continue;
    }
    INFO(key);
    CHECK(server.tool("get runs '" + key + "'").find(S3Server::kSecretKey) == std::string::npos);
  }
  CHECK(run.output.find(S3Server::kSecretKey) == std::string::npos);

  auto results = box.run_in_root("results s3://runs/team/exp/c");
  INFO(results.output);
  CHECK(results.exit_code == 0);
  CHECK(results.output.find("checkpoint:   s3://runs/team/exp/c/checkpoint_000002") !=
        std::string::npos);

  // The rerun resumes, uploading asynchronously.
  auto rerun = box.run_in_root(args + " --config reports=1 --config upload_mode=async");
  INFO(rerun.output);
  REQUIRE(rerun.exit_code == 0);
  auto reports = stored_reports(server, box.root(), "team/exp/c");
  REQUIRE(reports.size() == 4);
  CHECK(reports.back()["checkpoint"] == "checkpoint_000003");
  CHECK(reports.back()["metrics"]["resumed"] == "report 2 of none");
  // One download on this host, for both ranks.
  size_t downloads_seen = 0;
  for (size_t at =
           rerun.output.find("downloaded s3://runs/team/exp/c/checkpoint_000002 for this host");
       at != std::string::npos; at = rerun.output.find("downloaded s3://", at + 1)) {
    ++downloads_seen;
  }
  CHECK(downloads_seen == 1);
  auto downloads = box.root() / "cache" / "checkpoints";
  int copies = 0;
  for (const auto& entry : std::filesystem::directory_iterator(downloads)) {
    if (entry.is_directory()) ++copies;
  }
  CHECK(copies == 1);
  auto from = reports.back()["metrics"]["resumed_from"].get<std::string>();
  CHECK(from.rfind(downloads.string(), 0) == 0);
  stored = objects(server, "team/exp/c/");
  CHECK_FALSE(any_under(stored, "team/exp/c/checkpoint_000002/"));
  check_checkpoint(server, box.root(), "team/exp/c/checkpoint_000003");

  // Another run starts from that checkpoint by its URL; one that is not a
  // committed checkpoint is refused before anything starts.
  auto started =
      box.run_in_root(kPlugin +
                      "--entry checkpoints -n 2 --name d --storage-path s3://runs/team/exp "
                      "--config reports=1 --resume-from s3://runs/team/exp/c/checkpoint_000003");
  INFO(started.output);
  REQUIRE(started.exit_code == 0);
  CHECK(stored_reports(server, box.root(), "team/exp/d").back()["metrics"]["resumed"] ==
        "report 0 of report 2 of none");
  auto missing = box.run_in_root(kPlugin +
                                 "--entry checkpoints -n 2 --name e --resume-from "
                                 "s3://runs/team/exp/c/checkpoint_000002");
  CHECK(missing.exit_code == 2);
  CHECK(missing.output.find("is not a committed checkpoint") != std::string::npos);
}

TEST_CASE(
    "object storage: wrong credentials and a missing bucket fail in one line before any "
    "worker starts, and credentials come from a profile file") {
  Sandbox box;
  S3Server server(box.root() / "s3");
  server.tool("mb runs");
  const auto args = kPlugin + "--entry checkpoints -n 2 --name c --config reports=1 ";

  ::setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-at-all", 1);
  auto wrong = box.run_in_root(args + "--storage-path s3://runs/exp");
  ::setenv("AWS_SECRET_ACCESS_KEY", S3Server::kSecretKey, 1);
  INFO(wrong.output);
  CHECK(wrong.exit_code == 2);
  CHECK(wrong.output.find("storage s3://runs/exp/c: the credentials from the environment "
                          "(AWS_ACCESS_KEY_ID) were refused") != std::string::npos);
  CHECK(wrong.output.find("not-the-secret-at-all") == std::string::npos);
  CHECK(std::count(wrong.output.begin(), wrong.output.end(), '\n') == 1);
  CHECK_FALSE(std::filesystem::exists(box.root() / "cache" / "runs"));  // nothing started

  auto missing = box.run_in_root(args + "--storage-path s3://no-such-bucket/exp");
  INFO(missing.output);
  CHECK(missing.exit_code == 2);
  CHECK(missing.output.find("bucket 'no-such-bucket' does not exist") != std::string::npos);
  CHECK(std::count(missing.output.begin(), missing.output.end(), '\n') == 1);

  // ~/.aws/credentials' format, through AWS_SHARED_CREDENTIALS_FILE and AWS_PROFILE.
  auto credentials = box.root() / "credentials";
  std::ofstream(credentials) << "[default]\naws_access_key_id = wrong\naws_secret_access_key = "
                                "wrong\n\n[ci]\naws_access_key_id = "
                             << S3Server::kAccessKey
                             << "\naws_secret_access_key = " << S3Server::kSecretKey << "\n";
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", credentials.c_str(), 1);
  ::setenv("AWS_PROFILE", "ci", 1);
  auto profile = box.run_in_root(args + "--storage-path s3://runs/exp");
  INFO(profile.output);
  CHECK(profile.exit_code == 0);
  CHECK(objects(server, "exp/c/").count("exp/c/checkpoint_000000/manifest.json") == 1);
  ::setenv("AWS_PROFILE", "nobody", 1);
  auto no_profile = box.run_in_root(args + "--storage-path s3://runs/exp");
  CHECK(no_profile.exit_code == 2);
  CHECK(no_profile.output.find("AWS_PROFILE names profile 'nobody'") != std::string::npos);
}

TEST_CASE(
    "object storage: a worker killed mid-upload leaves no checkpoint, its parts are "
    "aborted, and the restarted run resumes from the last committed one") {
  Sandbox box;
  S3Server server(box.root() / "s3");
  server.tool("mb runs");
  // Rank 0's 4th part: the first of its second checkpoint's 3 (40 MiB in 16 MiB parts).
  ::setenv("TRAINRUN_S3_PART_MB", "16", 1);
  ::setenv("TRAINRUN_CRASH_POINT", "upload:part@4", 1);
  ::setenv("TRAINRUN_CRASH_ONCE", (box.root() / "crashed").c_str(), 1);
  auto run = box.run_in_root(kPlugin +
                             "--entry checkpoints -n 2 --name c --storage-path s3://runs/exp "
                             "--max-failures 1 --config pad_kb=40960");
  ::unsetenv("TRAINRUN_CRASH_POINT");
  ::unsetenv("TRAINRUN_CRASH_ONCE");
  ::unsetenv("TRAINRUN_S3_PART_MB");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  REQUIRE(std::filesystem::exists(box.root() / "crashed"));
  CHECK(run.output.find("attempt 2 starts from s3://runs/exp/c/checkpoint_000000") !=
        std::string::npos);
  auto stored = objects(server, "exp/c/");
  // The abandoned name holds nothing and is not used again.
  CHECK_FALSE(any_under(stored, "exp/c/checkpoint_000001/"));
  CHECK(server.tool("uploads runs exp/").empty());
  auto state = nlohmann::json::parse(server.tool("get runs exp/c/checkpoint_state.json"));
  std::set<std::string> listed;
  for (const auto& c : state["checkpoints"]) listed.insert(c["name"].get<std::string>());
  CHECK(listed.count("checkpoint_000001") == 0);
  CHECK(listed.size() == 4);  // 0 from the first attempt, 2-4 from the second
  for (const auto& name : listed) check_checkpoint(server, box.root(), "exp/c/" + name);
  auto reports = stored_reports(server, box.root(), "exp/c");
  CHECK(reports.back()["metrics"]["resumed"] == "report 0 of none");
}

TEST_CASE(
    "object storage: the server stopped mid-run fails the run as a storage error, commits "
    "nothing, and keeps the earlier checkpoints, which a rerun resumes from") {
  Sandbox box;
  S3Server server(box.root() / "s3");
  server.tool("mb runs");
  auto pause = box.root() / "go";
  const auto args = kPlugin +
                    "--entry checkpoints -n 2 --name c --storage-path s3://runs/exp "
                    "--config pad_kb=40960 --config pause_at=1 --config pause_file=" +
                    pause.string();
  RunOutput run;
  std::thread runner([&] { run = box.run_in_root(args); });
  for (int waited = 0; waited < 1200 && !std::filesystem::exists(pause.string() + ".ready");
       ++waited) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(std::filesystem::exists(pause.string() + ".ready"));
  server.stop();  // after checkpoint_000000's commit, before the next upload
  std::ofstream(pause) << "go\n";
  runner.join();
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("Couldn't connect to server (after 5 tries)") != std::string::npos);
  CHECK(run.output.find(S3Server::kSecretKey) == std::string::npos);

  server.start();
  auto stored = objects(server, "exp/c/");
  check_checkpoint(server, box.root(), "exp/c/checkpoint_000000");
  CHECK(stored.count("exp/c/checkpoint_000001/manifest.json") == 0);
  auto state = nlohmann::json::parse(server.tool("get runs exp/c/checkpoint_state.json"));
  CHECK(state["latest"] == "checkpoint_000000");

  // What a late upload would leave under the uncommitted name: the rerun
  // deletes it, and does not use that name again.
  std::ofstream(box.root() / "stale.bin") << "stale";
  server.tool("put runs exp/c/checkpoint_000001/stale.bin '" + (box.root() / "stale.bin").string() +
              "'");
  auto rerun = box.run_in_root(args + " --config reports=1 --config pause_at=5");
  INFO(rerun.output);
  REQUIRE(rerun.exit_code == 0);
  CHECK(rerun.output.find("resuming from checkpoint_000000") != std::string::npos);
  stored = objects(server, "exp/c/");
  CHECK_FALSE(any_under(stored, "exp/c/checkpoint_000001/"));
  check_checkpoint(server, box.root(), "exp/c/checkpoint_000002");
  CHECK(server.tool("uploads runs exp/").empty());
}

TEST_CASE(
    "object storage: a controller killed between any two steps of a commit leaves a run "
    "that resumes from the last checkpoint whose manifest is stored") {
  Sandbox box;
  S3Server server(box.root() / "s3");
  server.tool("mb runs");
  struct Case {
    const char* point;
    const char* resumed;  // what the rerun's train function found to resume from
  };
  // The first commit, then the second (which drops checkpoint_000000: --num-to-keep 1).
  for (auto [point, resumed] :
       {Case{"commit:staged", "none"}, Case{"commit:manifest", "report 0 of none"},
        Case{"commit:manifest@2", "report 1 of none"}, Case{"commit:state@2", "report 1 of none"},
        Case{"commit:deleted@2", "report 1 of none"}}) {
    CAPTURE(point);
    // The run's name holds ':' and '@': keys that SigV4 wants percent-encoded.
    const std::string run = std::string("c-") + point;
    const std::string args = kPlugin + "--entry checkpoints -n 2 --storage-path s3://runs/exp " +
                             "--num-to-keep 1 --name '" + run + "' ";
    ::setenv("TRAINRUN_CRASH_POINT", point, 1);
    auto crashed = box.run_in_root(args + "--config reports=3");
    ::unsetenv("TRAINRUN_CRASH_POINT");
    CHECK(crashed.exit_code == 86);  // the controller died there, as kill -9 would end it

    auto rerun = box.run_in_root(args + "--config reports=1");
    INFO(rerun.output);
    REQUIRE(rerun.exit_code == 0);
    auto reports = stored_reports(server, box.root(), "exp/" + run);
    CHECK(reports.back()["metrics"]["resumed"] == resumed);
    // The stored state and the stored checkpoints agree: every listed one has
    // its manifest and files, and nothing else is left.
    auto state =
        nlohmann::json::parse(server.tool("get runs 'exp/" + run + "/checkpoint_state.json'"));
    std::set<std::string> listed, stored_names;
    for (const auto& c : state["checkpoints"]) listed.insert(c["name"].get<std::string>());
    for (const auto& [key, size] : objects(server, "exp/" + run + "/checkpoint_")) {
      auto name = key.substr(key.find("checkpoint_"));
      if (name.find('/') != std::string::npos) stored_names.insert(name.substr(0, name.find('/')));
    }
    CHECK((listed == stored_names));
    for (const auto& name : listed) check_checkpoint(server, box.root(), "exp/" + run + "/" + name);
    CHECK(server.tool("uploads runs 'exp/" + run + "/'").empty());
  }
}

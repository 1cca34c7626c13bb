// Remote workers over TCP on loopback: the controller listens, workers started
// apart from it connect with the run key (CURVE), and everything a local run
// does keeps working.

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <regex>
#include <thread>

#include "run_helpers.h"

namespace {

const std::string kTestPlugin = std::string("--plugin '") + TEST_PLUGIN + "'";

// The endpoint the controller says remote workers connect to, once it has.
std::string wait_for_listening(const Sandbox& box) {
  std::regex listening("remote workers connect to (tcp://[0-9.]+:[0-9]+)");
  for (int i = 0; i < 400; ++i) {
    std::smatch match;
    auto out = box.output_so_far();
    if (std::regex_search(out, match, listening)) return match[1];
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return "";
}

std::string keygen(const Sandbox& box, const std::string& name) {
  auto path = (box.root() / name).string();
  auto out = box.run("keygen '" + path + "'");
  REQUIRE(out.exit_code == 0);
  return path;
}

}  // namespace

TEST_CASE("remote workers with the run key join over CURVE, one with another key gets nothing") {
  Sandbox box;
  auto key = keygen(box, "run.key");
  auto other = keygen(box, "other.key");
  pid_t controller = box.start(kTestPlugin +
                               " --entry context -n 3 --local-workers 1 --name remote"
                               " --listen tcp://127.0.0.1:0 --startup-timeout 30 --auth-key '" +
                               key + "'");
  auto endpoint = wait_for_listening(box);
  REQUIRE_FALSE(endpoint.empty());
  // A worker with another run's key first: it must not take a place.
  pid_t stranger = box.start_worker(
      "--connect " + endpoint + " --auth-key '" + other + "' --startup-timeout 20",
      "stranger.txt");
  // It is refused at its handshake, and says so, before the others come.
  CHECK(Sandbox::wait(stranger) == 2);
  pid_t a = box.start_worker("--connect " + endpoint + " --auth-key '" + key + "'", "a.txt");
  pid_t b = box.start_worker("--connect " + endpoint + " --auth-key '" + key + "'", "b.txt");
  CHECK(Sandbox::wait(controller) == 0);
  CHECK(Sandbox::wait(a) == 0);
  CHECK(Sandbox::wait(b) == 0);
  auto results = read_jsonl(box.run_dir("remote") / "result.jsonl");
  REQUIRE(results.size() == 3);
  CHECK(results[0]["metrics"]["world_size"] == 3);
  CHECK(results[0]["metrics"]["rank_sum"] == 3);  // 0 + 1 + 2: every rank took part
  // The remote workers printed on their own terminals and fetched the plugin.
  auto remote_output = read_text(box.root() / "a.txt") + read_text(box.root() / "b.txt");
  CHECK(remote_output.find("world_size=3") != std::string::npos);
  CHECK(std::filesystem::exists(box.root() / "remote-cache"));
  // The stranger never got an assignment, and said why at once.
  auto stranger_said = read_text(box.root() / "stranger.txt");
  CHECK(stranger_said.find("context") == std::string::npos);
  CHECK(stranger_said.find("refused this key") != std::string::npos);
  CHECK(read_text(box.run_dir("remote") / "logs" / "controller.log").find("refused a peer") !=
        std::string::npos);
}

namespace {

// Two runs of the `checkpoints` entry with two remote workers, the second
// resuming from the first's checkpoint; returns the controller's log.
std::string run_remote_checkpoints(Sandbox& box, const std::string& upload) {
  auto key = keygen(box, "run.key");
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::filesystem::remove(box.root() / "out.txt");  // the first run's endpoint is not this one's
    pid_t controller = box.start(
        kTestPlugin +
        " --entry checkpoints -n 2 --name ckpt --config reports=2"
        " --checkpoint-upload " +
        upload + " --startup-timeout 30 --listen tcp://127.0.0.1:0 --auth-key '" + key + "'");
    auto endpoint = wait_for_listening(box);
    REQUIRE_FALSE(endpoint.empty());
    pid_t a = box.start_worker("--connect " + endpoint + " --auth-key '" + key + "'", "a.txt");
    pid_t b = box.start_worker("--connect " + endpoint + " --auth-key '" + key + "'", "b.txt");
    INFO(box.output_so_far());
    CHECK(Sandbox::wait(controller) == 0);
    Sandbox::wait(a);
    Sandbox::wait(b);
  }
  // The rerun's rank 0 read what the first run's rank 0 saved.
  auto results = read_jsonl(box.run_dir("ckpt") / "result.jsonl");
  REQUIRE(results.size() == 4);
  CHECK(results[0]["metrics"]["resumed"] == "none");
  CHECK(results[3]["metrics"]["resumed"] == "report 1 of none");
  CHECK_FALSE(std::filesystem::exists(box.run_dir("ckpt") / ".storage-probe"));
  return read_text(box.run_dir("ckpt") / "logs" / "controller.log");  // both runs'
}

}  // namespace

TEST_CASE("remote workers stream their checkpoints, and a rerun resumes from them") {
  Sandbox box;
  // As on another host: through the controller, both ways.
  auto logs = run_remote_checkpoints(box, "stream");
  CHECK(logs.find("shares the run directory's filesystem") == std::string::npos);
}

TEST_CASE("remote workers that see the run directory copy their checkpoints there (auto)") {
  Sandbox box;
  auto logs = run_remote_checkpoints(box, "auto");
  INFO(logs);
  CHECK(logs.find("rank 0 (") != std::string::npos);
  std::regex shares("rank [01] \\([^)]+\\) shares the run directory's filesystem");
  auto found =
      std::distance(std::sregex_iterator(logs.begin(), logs.end(), shares), std::sregex_iterator());
  CHECK(found == 4);  // both ranks, in both runs
}

TEST_CASE("a run whose remote workers do not come fails at the startup timeout, saying so") {
  Sandbox box;
  auto out = box.run(kTestPlugin +
                     " --entry context -n 2 --name lonely --local-workers 1"
                     " --listen tcp://127.0.0.1:0 --startup-timeout 5");
  CHECK(out.exit_code == 1);
  auto error = read_json(box.run_dir("lonely") / "error.json");
  INFO(error.dump());
  CHECK(error["kind"] == "setup");
  // The local worker's HELLO may come late on a loaded machine: 0 or 1 of 2.
  CHECK(std::regex_search(error["message"].get<std::string>(),
                          std::regex("only [01] of 2 workers connected within 5 s \\(1 to "
                                     "connect to tcp://127\\.0\\.0\\.1:[0-9]+\\)")));
  CHECK_FALSE(box.any_worker_alive());
}

TEST_CASE("listening is refused without a key off loopback, and with a key other users can read") {
  Sandbox box;
  auto open = box.run(kTestPlugin + " -n 2 --listen tcp://0.0.0.0:0");
  CHECK(open.exit_code == 2);
  CHECK(open.output.find("without --auth-key lets anyone who reaches it join the run") !=
        std::string::npos);
  auto half = box.run(kTestPlugin + " -n 2 --local-workers 1");
  CHECK(half.exit_code == 2);
  CHECK(half.output.find("need --listen") != std::string::npos);
  auto key = keygen(box, "run.key");
  ::chmod(key.c_str(), 0644);
  auto readable =
      box.run(kTestPlugin + " -n 1 --listen tcp://127.0.0.1:0 --auth-key '" + key + "'");
  CHECK(readable.exit_code == 2);
  CHECK(readable.output.find("chmod 600") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(box.results()));  // nothing started, nothing written
}

TEST_CASE("a port already in use is a usage error that leaves no run directory") {
  Sandbox box;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  const auto endpoint = "tcp://127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  auto run =
      box.run(kTestPlugin + " --entry steps -n 1 --name p --local-workers 1 --listen " + endpoint);
  ::close(fd);
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK(run.output == "trainrun: cannot listen on " + endpoint + ": Address already in use\n");
  CHECK_FALSE(std::filesystem::exists(box.run_dir("p")));
}

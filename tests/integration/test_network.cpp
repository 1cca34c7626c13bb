#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "message_mutator.h"
#include "protocol/message.h"
#include "protocol/messages.h"
#include "run_helpers.h"

namespace {

// The controller's endpoint, from the log of a run in progress.
std::string wait_for_endpoint(const Sandbox& box, const std::string& name) {
  std::regex listening("listening on ([a-z]+://[^;]+);");
  for (int i = 0; i < 400; ++i) {
    std::smatch match;
    auto log = read_text(box.run_dir(name) / "logs" / "controller.log");
    if (std::regex_search(log, match, listening)) return match[1];
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return "";
}

// Starts a run of 4 slow steps named `name`; returns its pid and the
// controller's endpoint (empty if it did not show up in time).
std::pair<pid_t, std::string> start_slow_run(const Sandbox& box, const std::string& name,
                                             int steps = 4) {
  pid_t pid =
      box.start(std::string("--plugin '") + TEST_PLUGIN + "' --entry steps -n 2 --name " + name +
                " --config steps=" + std::to_string(steps) + " --config sleep_ms=300");
  return {pid, wait_for_endpoint(box, name)};
}

// The local addresses ("HEX:PORT" as /proc/net/tcp{,6} writes them) of the
// TCP sockets that `pids` hold open and listen on.
std::vector<std::string> listening_addresses(const std::vector<pid_t>& pids) {
  std::set<std::string> inodes;
  for (pid_t pid : pids) {
    std::error_code ec;
    for (const auto& fd :
         std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
      auto target = std::filesystem::read_symlink(fd.path(), ec).string();
      if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::vector<std::string> addresses;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (state == "0A" && inodes.count(inode)) addresses.push_back(local);
    }
  }
  return addresses;
}

// Whether a /proc/net address is on loopback: 127.0.0.0/8, ::1, or ::ffff:127.x.
bool is_loopback(const std::string& address) {
  auto host = address.substr(0, address.find(':'));
  if (host.size() == 8) return host.substr(6) == "7F";  // little-endian: the first octet last
  return host == "00000000000000000000000001000000" ||
         (host.substr(0, 24) == "0000000000000000FFFF0000" && host.substr(30) == "7F");
}

// A process's resident memory in MiB (0 once it is gone).
double resident_mib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

}  // namespace

TEST_CASE("mutated messages of every type from peers without the secret leave a run untouched") {
  Sandbox box;
  pid_t pid = box.start(std::string("--plugin '") + TEST_PLUGIN +
                        "' --entry steps -n 2 --name fuzz --config steps=8 --config sleep_ms=300");
  auto endpoint = wait_for_endpoint(box, "fuzz");
  REQUIRE_FALSE(endpoint.empty());
  trainrun::fuzz::MessageMutator mutator(20261121);
  zmq::context_t context;
  std::vector<zmq::socket_t> peers;
  double peak_mib = 0;
  int sent = 0;
  // Bounded in count and time; it stops early if the run ends.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (; sent < 30000 && std::chrono::steady_clock::now() < deadline; ++sent) {
    if (sent % 1000 == 0) {  // new peers now and then, as reconnecting intruders
      if (peers.size() == 8) peers.erase(peers.begin());
      peers.emplace_back(context, zmq::socket_type::dealer);
      peers.back().set(zmq::sockopt::linger, 0);
      peers.back().set(zmq::sockopt::sndhwm, 1000);
      peers.back().connect(endpoint);
      peak_mib = std::max(peak_mib, resident_mib(pid));
    }
    auto& peer = peers[static_cast<size_t>(sent) % peers.size()];
    auto frames = mutator.next();
    trainrun::fuzz::send_or_skip(peer, frames);
    while (!trainrun::protocol::recv_frames(peer, true).empty()) {  // REFUSED, mostly
    }
  }
  MESSAGE("sent " << sent << " mutated messages; controller peak " << peak_mib << " MiB");
  CHECK(sent > 1000);
  CHECK(peak_mib < 200);
  CHECK(Sandbox::wait(pid) == 0);
  CHECK(read_json(box.run_dir("fuzz") / "run.json")["status"] == "finished");
  CHECK(read_jsonl(box.run_dir("fuzz") / "result.jsonl").size() == 8);
  CHECK(std::filesystem::file_size(box.run_dir("fuzz") / "logs" / "controller.log") < (1 << 20));
}

TEST_CASE("a run's workers listen on no address but loopback, and run no store of their own") {
  Sandbox box;
  auto [pid, endpoint] = start_slow_run(box, "ports", 20);  // alive while they are looked at
  REQUIRE_FALSE(endpoint.empty());
  CHECK(endpoint.rfind("ipc://", 0) == 0);  // the controller itself has no TCP port
  // Once a report is in, the process group has formed.
  for (int i = 0; i < 400 && !std::filesystem::exists(box.run_dir("ports") / "result.jsonl"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  auto workers = box.worker_pids();
  REQUIRE(workers.size() == 2);
  auto addresses = listening_addresses(workers);
  for (const auto& address : addresses) {
    INFO("a worker listens on " << address);
    CHECK(is_loopback(address));
  }
  CHECK(listening_addresses({pid}).empty());
  CHECK(Sandbox::wait(pid) == 0);
}

TEST_CASE("garbage and other protocol versions on the controller's socket do not hurt the run") {
  Sandbox box;
  auto [pid, endpoint] = start_slow_run(box, "net");
  REQUIRE_FALSE(endpoint.empty());

  zmq::context_t context;
  zmq::socket_t peer(context, zmq::socket_type::dealer);
  peer.set(zmq::sockopt::linger, 0);
  peer.set(zmq::sockopt::rcvtimeo, 5000);
  peer.connect(endpoint);
  // Whether one of the next replies refuses the peer for `reason`.
  auto refused_for = [&](const std::string& reason) {
    for (int i = 0; i < 4; ++i) {
      auto frames = trainrun::protocol::recv_frames(peer);
      if (frames.empty()) return false;  // timed out
      auto reply = trainrun::protocol::Incoming::parse(std::move(frames));
      if (reply.type() == "REFUSED" &&
          reply.as<trainrun::protocol::Refused>().reason.find(reason) != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  // Garbage: one frame, random bytes, a type with a broken body.
  peer.send(zmq::str_buffer("x"), zmq::send_flags::none);
  peer.send(zmq::str_buffer("\x01\x02\x03"), zmq::send_flags::sndmore);
  peer.send(zmq::str_buffer("\xff\xfe"), zmq::send_flags::none);
  peer.send(zmq::str_buffer("REPORT"), zmq::send_flags::sndmore);
  peer.send(zmq::str_buffer("\x92\x01\xc1"), zmq::send_flags::none);
  CHECK(refused_for(""));
  // An ATTACH that claims a rank's train thread without the run's secret.
  trainrun::protocol::send(peer, trainrun::protocol::Attach{0, 1, ""});
  CHECK(refused_for("ATTACH without this run's worker secret"));
  // A HELLO with a worker's index and pid, which any local process can read
  // from /proc, but not the secret that only its environment holds.
  trainrun::protocol::send(peer, trainrun::protocol::Hello{0, "intruder", 1, "00"});
  CHECK(refused_for("HELLO without this run's worker secret"));
  // A HELLO from a peer speaking protocol v99.
  msgpack::sbuffer body;
  msgpack::packer<msgpack::sbuffer> packer(body);
  packer.pack_array(2);
  packer.pack(99);
  packer.pack(trainrun::protocol::Hello{0, "intruder", 1, ""});
  peer.send(zmq::str_buffer("HELLO"), zmq::send_flags::sndmore);
  peer.send(zmq::buffer(body.data(), body.size()), zmq::send_flags::none);
  CHECK(refused_for("protocol v99"));

  CHECK(Sandbox::wait(pid) == 0);
  CHECK(read_jsonl(box.run_dir("net") / "result.jsonl").size() == 4);
  CHECK(read_text(box.run_dir("net") / "logs" / "controller.log").find("dropped a message") !=
        std::string::npos);
}

TEST_CASE("a flood of junk on the controller's socket costs a few log lines, and the run goes on") {
  Sandbox box;
  auto [pid, endpoint] = start_slow_run(box, "flood");
  REQUIRE_FALSE(endpoint.empty());
  zmq::context_t context;
  zmq::socket_t peer(context, zmq::socket_type::dealer);
  peer.set(zmq::sockopt::linger, 0);
  peer.set(zmq::sockopt::sndhwm, 0);
  peer.connect(endpoint);
  const auto flooded = std::chrono::steady_clock::now();
  for (int i = 0; i < 20000; ++i) {
    peer.send(zmq::str_buffer("JUNK"), zmq::send_flags::sndmore);
    peer.send(zmq::str_buffer("\xc1"), zmq::send_flags::none);
  }
  CHECK(Sandbox::wait(pid) == 0);
  const auto seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - flooded).count();
  CHECK(read_jsonl(box.run_dir("flood") / "result.jsonl").size() == 4);
  auto log = read_text(box.run_dir("flood") / "logs" / "controller.log");
  size_t lines = 0;
  for (size_t at = log.find("dropped a message"); at != std::string::npos;
       at = log.find("dropped a message", at + 1)) {
    ++lines;
  }
  CHECK(lines > 0);
  // 10 a second at most (a window opens at its first line), however long the
  // flood took to read.
  CHECK(lines <= 10 * (static_cast<size_t>(std::ceil(seconds)) + 1));
  CHECK(log.find("more messages (only the first 10 a second are logged)") != std::string::npos);
}

TEST_CASE("a closed stdout does not end a run, and SIGHUP ends it as an interruption") {
  Sandbox box;
  // `| head -n 1`: the controller's stdout closes after one line.
  auto piped = box.run(std::string("--plugin '") + TEST_PLUGIN +
                       "' --entry context -n 2 --name piped --config reports=3 | head -n 1");
  CHECK(piped.exit_code == 0);  // head's
  auto info = read_json(box.run_dir("piped") / "run.json");
  CHECK(info["status"] == "finished");
  CHECK(read_jsonl(box.run_dir("piped") / "result.jsonl").size() == 3);

  pid_t pid =
      box.start(std::string("--plugin '") + TEST_PLUGIN + "' --entry sleeps -n 2 --name hup");
  for (int i = 0; i < 400 && box.worker_pids().size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(pid, SIGHUP);
  CHECK(Sandbox::wait(pid) == 130);
  CHECK(read_json(box.run_dir("hup") / "run.json")["status"] == "interrupted");
  CHECK(read_json(box.run_dir("hup") / "error.json")["message"] ==
        "interrupted by SIGHUP (Hangup)");
  CHECK_FALSE(box.any_worker_alive());
}

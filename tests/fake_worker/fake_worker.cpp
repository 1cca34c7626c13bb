// A worker that speaks trainrun's protocol from a script, without LibTorch:
// HELLO, ASSIGN, the plugin download (through the real chunk pull and cache),
// ATTACH, a rendezvous through the controller's store (each rank sets its key
// and waits for everyone's), metrics-only reports, DONE, SHUTDOWN. The
// controller starts it in place of trainrun-worker (TrainerOptions::worker_executable)
// with the same arguments. The run's config is the script:
//
//   reports=N             reports to make (default 3)
//   report_delay_ms=D     sleep before each report (a slow rank: slow_rank=R, or all)
//   early_done_rank=R     rank R also says DONE right after its first REPORT
//   exit_rank=R, exit_after=K      rank R exits with code 3 after K reports
//   short_rank=R, short_after=K    rank R says DONE after K reports
//   skip_rank=R           rank R reports iteration 2 first (out of step)
//   garbage_rank=R        rank R first sends frames that are not a message
//   silent_rank=R, silent_after=K  rank R goes silent after K reports
//   stuck_rank=R          rank R never starts its train function (no STARTED)
//   fail_rank=R           rank R sends FAILED (an exception) instead of reporting
//   fetch_plugin=true     download the plugin even when it is cached
//   scratch=true          each rank writes a file into $TMPDIR and prints
//                         "scratch <TMPDIR>" first
//   orphan_rank=R         rank R starts `sleep 60` and prints "child <pid>" first
//   deep_metrics=D        rank 0's first report carries metrics nested D deep
//   progress=true         rank 0 first prints "step 1/3\rstep 2/3\rstep 3/3\n" and
//                         "windows line\r\n"
//   spam_mib=M            rank 0 first writes M MiB to stdout without a newline
//   fuzz_rank=R, fuzz_messages=N, fuzz_seed=S
//                         rank R first sends N mutated messages of every type
//                         (tests/fuzz/message_mutator.h) on its three connections
//   latency_dir=DIR       each rank writes rank-<r>.txt: its ready time (s since
//                         the epoch), then per report when it sent the REPORT and
//                         when the REPORT_ACK came (CLOCK_MONOTONIC, ns: one
//                         clock for every process on the machine)
//
// Every wait is bounded by the assignment's heartbeat timeout or the startup
// timeout; a worker that waits longer exits with code 1.

#include <trainrun/error.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spawn.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/constants.h"
#include "common/parent.h"
#include "common/secret.h"
#include "message_mutator.h"
#include "protocol/message.h"
#include "protocol/messages.h"
#include "transfer/chunk_pull.h"
#include "transfer/plugin_cache.h"

extern char** environ;

namespace {

using namespace trainrun;
using Clock = std::chrono::steady_clock;

int64_t monotonic_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec * 1000000000LL + now.tv_nsec;
}

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class FakeWorker {
 public:
  FakeWorker(std::string endpoint, int index, std::filesystem::path cache_dir,
             std::chrono::milliseconds startup)
      : endpoint_(std::move(endpoint)), index_(index), cache_dir_(std::move(cache_dir)),
        limit_(startup) {
    main_.set(zmq::sockopt::linger, 1000);
    main_.connect(endpoint_);
  }

  int run() {
    protocol::send(main_, protocol::Hello{index_, "localhost", ::getpid(), secret_});
    auto assign = wait_main<protocol::Assign>();
    limit_ = std::chrono::milliseconds(assign.heartbeat_timeout_ms);
    interval_ = std::chrono::milliseconds(assign.heartbeat_interval_ms);
    script_ = nlohmann::json::from_msgpack(assign.config);
    rank_ = assign.world_rank;
    fetch_plugin(assign);
    train_.set(zmq::sockopt::linger, 1000);
    train_.connect(endpoint_);
    protocol::send(train_, protocol::Attach{rank_, ::getpid(), secret_});
    rendezvous(assign.world_size);
    if (is(rank_, "stuck_rank")) {  // as a plugin whose static constructor blocks
      wait_shutdown();
      return 0;
    }
    protocol::send(train_, protocol::Started{rank_});
    double ready = unix_time();
    if (is(rank_, "fuzz_rank") && !fuzz()) return 0;
    if (is(rank_, "fail_rank")) {
      protocol::send(train_, protocol::Failed{"scripted failure", "exception"});
      return wait_shutdown();
    }
    if (is(rank_, "garbage_rank")) {
      train_.send(zmq::str_buffer("not a type frame at all, and far too long to be one: xxxxxxxxx"),
                  zmq::send_flags::sndmore);
      train_.send(zmq::str_buffer("\xc1"), zmq::send_flags::none);
    }
    if (script_.value("scratch", false)) {
      const char* tmp = std::getenv("TMPDIR");
      std::ofstream(std::filesystem::path(tmp != nullptr ? tmp : "/tmp") / "scratch.bin") << "x";
      std::printf("scratch %s\n", tmp != nullptr ? tmp : "");
      std::fflush(stdout);
    }
    if (is(rank_, "orphan_rank")) {
      pid_t child = -1;
      char sleep[] = "sleep", sixty[] = "60";
      char* args[] = {sleep, sixty, nullptr};
      ::posix_spawnp(&child, "sleep", nullptr, nullptr, args, environ);
      std::printf("child %d\n", static_cast<int>(child));
      std::fflush(stdout);
    }
    if (script_.value("progress", false) && rank_ == 0) {
      std::printf("step 1/3\rstep 2/3\rstep 3/3\nwindows line\r\n");
      std::fflush(stdout);
    }
    if (int spam = get("spam_mib", 0); spam > 0 && rank_ == 0) {
      std::string mib(1 << 20, 'x');
      for (int i = 0; i < spam; ++i) std::fwrite(mib.data(), 1, mib.size(), stdout);
      std::fflush(stdout);
    }
    int reports = get("reports", 3);
    std::vector<std::pair<int64_t, int64_t>> times;  // REPORT sent, REPORT_ACK received
    for (int i = 1; i <= reports; ++i) {
      if (is(rank_, "exit_rank") && i > get("exit_after", 0)) return 3;
      if (is(rank_, "short_rank") && i > get("short_after", 0)) break;
      if (is(rank_, "silent_rank") && i > get("silent_after", 0)) {
        std::this_thread::sleep_for(limit_ * 3);  // the controller must give up first
        return 1;
      }
      int delay = get("report_delay_ms", 0);
      if (script_.contains("slow_rank") && !is(rank_, "slow_rank")) delay = 0;
      if (delay > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay));
      }
      protocol::Report report;
      report.iteration = is(rank_, "skip_rank") ? i + 1 : i;
      auto metrics = nlohmann::json::to_msgpack({{"i", i}, {"rank", rank_}});
      report.metrics.assign(metrics.begin(), metrics.end());
      if (int depth = get("deep_metrics", 0); depth > 0 && rank_ == 0) {
        // {"x": [[[...]]]}: one byte per level, far deeper than any decoder's stack.
        report.metrics = {'\x81', '\xa1', 'x'};
        report.metrics.insert(report.metrics.end(), static_cast<size_t>(depth), '\x91');
        report.metrics.push_back('\x00');
      }
      auto sent = monotonic_ns();
      protocol::send(train_, report);
      if (i == 1 && is(rank_, "early_done_rank")) protocol::send(train_, protocol::Done{0});
      auto ack = wait_train<protocol::ReportAck>();
      times.emplace_back(sent, monotonic_ns());
      if (ack.iteration != report.iteration) throw ProtocolError("acknowledged another report");
    }
    protocol::send(train_, protocol::Done{static_cast<int64_t>(times.size())});
    if (script_.contains("latency_dir")) {
      std::ofstream out(std::filesystem::path(script_["latency_dir"].get<std::string>()) /
                        ("rank-" + std::to_string(rank_) + ".txt"));
      char line[64];
      std::snprintf(line, sizeof(line), "%.6f\n", ready);
      out << line;
      for (auto [sent, acked] : times) out << sent << " " << acked << "\n";
    }
    return wait_shutdown();
  }

 private:
  bool is(int rank, const char* key) const {
    return script_.contains(key) && script_[key].is_number() && script_[key].get<int>() == rank;
  }
  int get(const char* key, int fallback) const {
    return script_.contains(key) && script_[key].is_number() ? script_[key].get<int>() : fallback;
  }

  // The plugin, from the cache or through the controller, as trainrun-worker gets it.
  void fetch_plugin(const protocol::Assign& assign) {
    bool force = script_.value("fetch_plugin", false);
    if (!force && find_cached_plugin(cache_dir_, assign.plugin_sha256)) return;
    PluginDownload download(cache_dir_, assign.plugin_sha256, assign.plugin_size);
    ChunkFetcher fetcher(protocol::kPluginSource, {assign.plugin_size});
    while (!fetcher.complete()) {
      for (const auto& fetch : fetcher.requests()) protocol::send(main_, fetch);
      auto message = next(main_, protocol::Chunk::kType);
      auto chunk = message.as<protocol::Chunk>();
      const auto& bytes = message.blobs().at(0);
      fetcher.accept(chunk, bytes.size());
      download.write(chunk.offset, bytes.data(), bytes.size());
    }
    download.commit();
  }

  // What Gloo's rendezvous does, in small: every rank sets its key in the
  // controller's store and waits until all ranks' keys are there.
  void rendezvous(int world_size) {
    store_.set(zmq::sockopt::linger, 1000);
    store_.connect(endpoint_);
    protocol::send(store_,
                   protocol::Attach{rank_, ::getpid(), secret_, protocol::kStoreChannel});
    protocol::StoreRequest set;
    set.id = 1;
    set.op = "SET";
    set.keys = {"fake/" + std::to_string(rank_)};
    set.values = {{'x'}};
    protocol::send(store_, set);
    protocol::StoreRequest wait;
    wait.id = 2;
    wait.op = "WAIT";
    for (int rank = 0; rank < world_size; ++rank) wait.keys.push_back("fake/" + std::to_string(rank));
    protocol::send(store_, wait);
    for (uint64_t id = 1; id <= 2; ++id) {
      auto reply = next(store_, protocol::StoreReply::kType).as<protocol::StoreReply>();
      if (reply.id != id || !reply.error.empty()) {
        throw Error("rendezvous store: " + (reply.error.empty() ? "reply out of order" : reply.error));
      }
    }
  }

  // Sends the script's mutated messages, reading whatever comes back; false
  // when the controller said SHUTDOWN meanwhile.
  bool fuzz() {
    fuzz::MessageMutator mutator(script_.value("fuzz_seed", 1));
    zmq::socket_t* sockets[] = {&main_, &train_, &store_};
    int count = script_.value("fuzz_messages", 1000);
    for (int i = 0; i < count; ++i) {
      auto frames = mutator.next();
      fuzz::send_or_skip(*sockets[mutator.random()() % 3], frames);
      if (i % 32 != 31) continue;
      heartbeat();
      for (auto* from : sockets) {
        while (true) {
          auto reply = protocol::recv_frames(*from, true);
          if (reply.empty()) break;
          if (from == &main_ && reply[0].to_string() == protocol::Shutdown::kType) return false;
        }
      }
    }
    return true;
  }

  template <typename T>
  T wait_main() {
    return next(main_, T::kType).template as<T>();
  }
  template <typename T>
  T wait_train() {
    return next(train_, T::kType).template as<T>();
  }

  // Waits for a message of `type` on `socket`, sending heartbeats meanwhile.
  // Like trainrun-worker, it gives up only when the controller has been
  // silent for the limit (its heartbeats arrive on the main connection).
  // Throws when the controller says SHUTDOWN or REFUSED, or falls silent.
  protocol::Incoming next(zmq::socket_t& socket, const char* type) {
    auto deadline = Clock::now() + limit_;
    while (Clock::now() < deadline) {
      heartbeat();
      zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0},
                                 {main_.handle(), 0, ZMQ_POLLIN, 0}};
      protocol::poll(items, &socket == &main_ ? 1 : 2,
                     std::min<std::chrono::milliseconds>(interval_, std::chrono::milliseconds(200)));
      for (int i = 0; i < 2; ++i) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        auto& from = i == 0 ? socket : main_;
        auto message = protocol::Incoming::parse(protocol::recv_frames(from));
        deadline = Clock::now() + limit_;
        if (i == 0 && message.type() == type) return message;
        if (message.type() == protocol::Shutdown::kType ||
            message.type() == protocol::Refused::kType) {
          throw Error("the controller said " + message.type());
        }
      }
    }
    throw TimeoutError(std::string("no ") + type + " in time");
  }

  void heartbeat() {
    if (Clock::now() < next_heartbeat_) return;
    protocol::send(main_, protocol::Heartbeat{});
    next_heartbeat_ = Clock::now() + interval_;
  }

  int wait_shutdown() {
    try {
      next(main_, protocol::Shutdown::kType);
    } catch (const TimeoutError&) {
      return 1;
    }
    return 0;
  }

  std::string endpoint_;
  int index_;
  std::filesystem::path cache_dir_;
  std::chrono::milliseconds limit_;
  zmq::context_t context_{1};
  zmq::socket_t main_{context_, zmq::socket_type::dealer};
  zmq::socket_t train_{context_, zmq::socket_type::dealer};
  zmq::socket_t store_{context_, zmq::socket_type::dealer};
  nlohmann::json script_;
  std::string secret_ = take_secret_from_environment();
  int rank_ = -1;
  Clock::time_point next_heartbeat_ = Clock::now();
  std::chrono::milliseconds interval_ = kHeartbeatInterval;
};

}  // namespace

int main(int argc, char** argv) {
  die_with_parent();
  CLI::App app{"fake_worker: a scripted trainrun worker for tests"};
  std::string connect;
  int index = -1;
  std::filesystem::path cache_dir;
  double startup_s = 10;
  app.add_option("--connect", connect)->required();
  app.add_option("--index", index);
  app.add_option("--cache-dir", cache_dir);
  app.add_option("--startup-timeout", startup_s);
  CLI11_PARSE(app, argc, argv);
  try {
    FakeWorker worker(connect, index, cache_dir, std::chrono::milliseconds(std::llround(startup_s * 1000)));
    int code = worker.run();
    std::fflush(stdout);
    return code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fake_worker: %s\n", e.what());
    return 1;
  }
}

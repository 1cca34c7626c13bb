#include "controller/controller.h"

#include <trainrun/error.h>

#include <sys/wait.h>
#include <unistd.h>
#include <zmq.hpp>

#include <csignal>
#include <optional>

#include "common/constants.h"
#include "controller/failure.h"
#include "controller/local_worker.h"
#include "controller/rank_assignment.h"
#include "controller/report_barrier.h"
#include "controller/signals.h"
#include "controller/worker_output.h"
#include "protocol/message.h"
#include "protocol/messages.h"

namespace trainrun {
namespace {

using Clock = std::chrono::steady_clock;

// Local workers only, so far: everything talks over loopback, and rank 0's
// store is reached there too.
constexpr const char* kLocalHost = "127.0.0.1";

// One worker process, from spawn to exit.
struct Slot {
  int index = 0;
  LocalWorker process;
  std::unique_ptr<WorkerOutput> output;
  std::optional<std::string> routing_id;  // set by HELLO
  std::string host;
  int rank = -1;
  bool done = false;
  bool failed = false;  // a failure of this worker was recorded
  bool exited = false;
  Clock::time_point last_heard;

  std::string describe() const {
    return "rank " + std::to_string(rank < 0 ? index : rank) + " (" +
           (host.empty() ? "local" : host) + ", pid " + std::to_string(process.pid) + ")";
  }
};

std::string format_metrics(const nlohmann::json& metrics) {
  std::string line;
  if (!metrics.is_object()) return line;
  for (const auto& item : metrics.items()) {
    line += (line.empty() ? "" : " ") + item.key() + "=" + format_value(item.value());
  }
  return line;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

struct Controller::State {
  ControllerSetup setup;
  RunStorage& storage;
  spdlog::logger& log;
  zmq::context_t context;
  zmq::socket_t router{context, zmq::socket_type::router};
  SignalPipe signals;
  std::vector<Slot> slots;
  std::vector<Slot*> by_rank;
  ReportBarrier barrier;
  FailureCollector failures;
  Result result;
  Clock::time_point start = Clock::now();
  bool assigned = false;

  State(ControllerSetup s, RunStorage& st)
      : setup(std::move(s)),
        storage(st),
        log(*setup.log),
        barrier(setup.options.scaling.num_workers) {}

  int world_size() const { return setup.options.scaling.num_workers; }

  void start_workers() {
    router.set(zmq::sockopt::linger, 0);
    router.bind(std::string("tcp://") + kLocalHost + ":*");
    auto endpoint = router.get(zmq::sockopt::last_endpoint);
    auto executable = setup.options.worker_executable;
    auto threads = std::to_string(setup.cpus_per_worker);
    slots.resize(static_cast<size_t>(world_size()));
    for (int i = 0; i < world_size(); ++i) {
      auto& slot = slots[static_cast<size_t>(i)];
      slot.index = i;
      slot.process =
          spawn_local_worker(executable,
                             {"--connect", endpoint, "--index", std::to_string(i), "--cache-dir",
                              setup.options.cache_dir.string(), "--startup-timeout-ms",
                              std::to_string(setup.options.run.startup_timeout.count())},
                             {"OMP_NUM_THREADS=" + threads, "MKL_NUM_THREADS=" + threads});
      slot.output = std::make_unique<WorkerOutput>(
          slot.process.stdout_fd, slot.process.stderr_fd, prefix(slot),
          storage.logs_dir() / ("worker-" + std::to_string(i) + ".log"), setup.options.verbose);
      slot.last_heard = Clock::now();
    }
    log.info("listening on {}; started {} workers ({} threads each)", endpoint, world_size(),
             setup.cpus_per_worker);
  }

  static std::string prefix(const Slot& slot) {
    return "(rank=" + std::to_string(slot.rank < 0 ? slot.index : slot.rank) +
           ", pid=" + std::to_string(slot.process.pid) +
           (slot.host.empty() ? "" : ", host=" + slot.host) + ")";
  }

  Slot* slot_by_routing_id(const std::string& id) {
    for (auto& slot : slots) {
      if (slot.routing_id == id) return &slot;
    }
    return nullptr;
  }

  void fail(Slot& slot, const std::string& kind, const std::string& message) {
    if (slot.failed) return;
    slot.failed = true;
    // Before ranks are assigned, a local worker's launch index is its rank-to-be.
    int rank = slot.rank >= 0 ? slot.rank : slot.index;
    failures.add(RunError{kind, message, rank, slot.host, slot.process.pid});
    log.error("{} {}", slot.describe(), message);
  }

  // ---- messages -------------------------------------------------------------

  void on_router_readable() {
    auto frames = protocol::recv_frames(router, true);
    if (frames.size() < 2) return;
    std::string id = frames[0].to_string();
    frames.erase(frames.begin());
    Slot* slot = slot_by_routing_id(id);
    try {
      auto message = protocol::Incoming::parse(std::move(frames));
      if (slot == nullptr) {
        on_hello(id, message);
        return;
      }
      slot->last_heard = Clock::now();
      handle(*slot, message);
    } catch (const ProtocolError& e) {
      if (slot == nullptr) {
        protocol::send(router, protocol::Refused{e.what()}, {}, id);
      }
      log.warn("dropped a message from {}: {}", slot ? slot->describe() : "an unknown peer",
               e.what());
    }
  }

  void on_hello(const std::string& id, const protocol::Incoming& message) {
    if (message.type() != protocol::Hello::kType) {
      throw ProtocolError("expected HELLO from a new peer, got " + message.type());
    }
    auto hello = message.as<protocol::Hello>();
    if (hello.index < 0 || hello.index >= world_size() ||
        slots[static_cast<size_t>(hello.index)].routing_id ||
        slots[static_cast<size_t>(hello.index)].process.pid != hello.pid) {
      throw ProtocolError("HELLO from an unexpected worker (index " + std::to_string(hello.index) +
                          ", pid " + std::to_string(hello.pid) + ")");
    }
    auto& slot = slots[static_cast<size_t>(hello.index)];
    slot.routing_id = id;
    slot.host = hello.host;
    slot.last_heard = Clock::now();
    bool all = std::all_of(slots.begin(), slots.end(), [](const Slot& s) { return s.routing_id; });
    if (all) assign_ranks();
  }

  void assign_ranks() {
    std::vector<std::string> hosts;
    for (const auto& slot : slots) hosts.push_back(slot.host);
    auto placements = trainrun::assign_ranks(hosts);
    auto config = nlohmann::json::to_msgpack(setup.options.config);
    by_rank.assign(slots.size(), nullptr);
    for (size_t i = 0; i < slots.size(); ++i) {
      Slot& slot = slots[i];
      const Placement& place = placements[i];
      slot.rank = place.world_rank;
      by_rank[static_cast<size_t>(slot.rank)] = &slot;
      slot.output->set_prefix(prefix(slot));
      protocol::Assign assign;
      assign.world_rank = place.world_rank;
      assign.local_rank = place.local_rank;
      assign.node_rank = place.node_rank;
      assign.world_size = world_size();
      assign.local_world_size = place.local_world_size;
      assign.run_name = setup.options.run.name;
      assign.storage_path = setup.options.run.storage_path.string();
      assign.entry = setup.entry;
      assign.config.assign(config.begin(), config.end());
      assign.plugin_sha256 = setup.plugin_sha256;
      assign.plugin_size = setup.plugin_bytes.size();
      assign.store_host = kLocalHost;
      assign.store_prefix = "trainrun/attempt-0";
      assign.bind_host = kLocalHost;
      assign.num_threads = setup.cpus_per_worker;
      assign.device =
          setup.options.scaling.use_gpu ? "cuda:" + std::to_string(place.local_rank) : "cpu";
      assign.heartbeat_timeout_ms = setup.options.run.heartbeat_timeout.count();
      protocol::send(router, assign, {}, slot.routing_id);
    }
    assigned = true;
  }

  void handle(Slot& slot, protocol::Incoming& message) {
    const auto& type = message.type();
    if (type == protocol::Heartbeat::kType) return;
    if (type == protocol::FetchPlugin::kType) {
      auto fetch = message.as<protocol::FetchPlugin>();
      const auto& bytes = setup.plugin_bytes;
      if (fetch.offset > bytes.size() || fetch.length > kPluginChunkSize ||
          fetch.length > bytes.size() - fetch.offset) {
        throw ProtocolError("FETCH_PLUGIN out of range (offset " + std::to_string(fetch.offset) +
                            ", length " + std::to_string(fetch.length) + ")");
      }
      std::vector<zmq::message_t> blob;
      blob.emplace_back(bytes.data() + fetch.offset, fetch.length);
      protocol::send(router, protocol::PluginChunk{fetch.offset}, std::move(blob), slot.routing_id);
    } else if (type == protocol::StoreReady::kType && slot.rank == 0) {
      protocol::StoreAddress address{kLocalHost, message.as<protocol::StoreReady>().port};
      for (auto* s : by_rank) {
        if (s->rank != 0) protocol::send(router, address, {}, s->routing_id);
      }
    } else if (type == protocol::Report::kType) {
      on_report(slot, message.as<protocol::Report>());
    } else if (type == protocol::Done::kType) {
      slot.done = true;
      check_report_counts();
    } else if (type == protocol::Failed::kType) {
      auto failed = message.as<protocol::Failed>();
      auto text = failed.kind == "exception" ? "raised: " + failed.message : failed.message;
      fail(slot, failed.kind, text);
    } else {
      throw ProtocolError("unknown message type " + type);
    }
  }

  void on_report(Slot& slot, const protocol::Report& report) {
    nlohmann::json metrics;
    if (slot.rank == 0) {
      try {
        metrics = nlohmann::json::from_msgpack(report.metrics);
      } catch (const nlohmann::json::exception& e) {
        throw ProtocolError(std::string("REPORT with malformed metrics: ") + e.what());
      }
    }
    if (auto error = barrier.arrive(slot.rank, report.iteration, std::move(metrics))) {
      fail(slot, "usage", *error);
      return;
    }
    if (!barrier.complete()) {
      check_report_counts();
      return;
    }
    int64_t iteration = barrier.iteration();
    record(iteration, barrier.release());
    for (auto* s : by_rank) {
      protocol::send(router, protocol::ReportAck{iteration}, {}, s->routing_id);
    }
  }

  void record(int64_t iteration, nlohmann::json metrics) {
    double elapsed = seconds_since(start);
    auto timestamp =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    nlohmann::json entry = {{"iteration", iteration},
                            {"timestamp", timestamp},
                            {"time_total_s", elapsed},
                            {"metrics", metrics}};
    storage.append_result(entry);
    result.metrics = std::move(metrics);
    result.iterations = iteration;
    log.info("report {} ({:.1f} s): {}", iteration, elapsed, format_metrics(result.metrics));
  }

  // A rank that returns while others wait in report() would leave them waiting
  // forever: every rank must report the same number of times.
  void check_report_counts() {
    Slot* finished = nullptr;
    Slot* waiting = nullptr;
    for (auto* s : by_rank) {
      if (s->done) {
        finished = s;
      } else if (barrier.waiting(s->rank)) {
        waiting = s;
      } else {
        return;  // someone is still training
      }
    }
    if (finished != nullptr && waiting != nullptr) {
      fail(*finished, "usage",
           "returned from train_func after " + std::to_string(barrier.iteration() - 1) +
               " reports while rank " + std::to_string(waiting->rank) + " waits in report " +
               std::to_string(barrier.iteration()) +
               ": every rank must call train::report the same number of times");
    }
  }

  // ---- processes and timers -------------------------------------------------

  void reap(bool expected) {
    for (auto& slot : slots) {
      if (slot.exited) continue;
      int status = 0;
      if (::waitpid(slot.process.pid, &status, WNOHANG) != slot.process.pid) continue;
      slot.exited = true;
      slot.output->drain();
      if (expected || (slot.done && WIFEXITED(status) && WEXITSTATUS(status) == 0)) continue;
      if (WIFSIGNALED(status)) {
        fail(slot, "signal", "was killed by " + signal_description(WTERMSIG(status)));
      } else {
        fail(slot, "exit",
             "exited with code " + std::to_string(WEXITSTATUS(status)) + " before finishing");
      }
    }
  }

  void check_timers() {
    auto now = Clock::now();
    if (!assigned && now - start > setup.options.run.startup_timeout) {
      for (auto& slot : slots) {
        if (!slot.routing_id && !slot.exited) {
          fail(slot, "setup",
               "did not connect to the controller within " +
                   std::to_string(setup.options.run.startup_timeout.count()) + " ms");
        }
      }
    }
    for (auto& slot : slots) {
      if (slot.routing_id && !slot.exited &&
          now - slot.last_heard > setup.options.run.heartbeat_timeout) {
        fail(slot, "lost",
             "sent nothing for " + std::to_string(setup.options.run.heartbeat_timeout.count()) +
                 " ms: stopped responding");
      }
    }
  }

  // One pass of the loop: wait for sockets, pipes and signals; handle them.
  void poll_once(std::chrono::milliseconds timeout) {
    std::vector<zmq::pollitem_t> items = {{router.handle(), 0, ZMQ_POLLIN, 0},
                                          {nullptr, signals.fd(), ZMQ_POLLIN, 0}};
    std::vector<std::pair<Slot*, int>> streams;
    for (auto& slot : slots) {
      for (int stream = 0; stream < 2; ++stream) {
        int fd = stream == 0 ? slot.output->stdout_fd() : slot.output->stderr_fd();
        if (fd < 0) continue;
        items.push_back({nullptr, fd, ZMQ_POLLIN, 0});
        streams.emplace_back(&slot, stream);
      }
    }
    protocol::poll(items.data(), items.size(), timeout);
    for (size_t i = 0; i < streams.size(); ++i) {
      if (items[i + 2].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) {
        streams[i].first->output->read(streams[i].second);
      }
    }
    if (items[1].revents & ZMQ_POLLIN) {
      for (int sig : signals.drain()) {
        if ((sig == SIGINT || sig == SIGTERM) && !result.interrupted()) {
          result.error =
              RunError{"interrupted", "interrupted by " + signal_description(sig), -1, "", 0};
        }
      }
    }
    if (items[0].revents & ZMQ_POLLIN) {
      for (int i = 0; i < 256 && (router.get(zmq::sockopt::events) & ZMQ_POLLIN); ++i) {
        on_router_readable();
      }
    }
  }

  void send_heartbeats() {
    for (auto& slot : slots) {
      if (slot.routing_id && !slot.exited) {
        protocol::send(router, protocol::Heartbeat{}, {}, slot.routing_id);
      }
    }
  }

  bool all_exited() const {
    return std::all_of(slots.begin(), slots.end(), [](const Slot& s) { return s.exited; });
  }

  // Ends every worker: SHUTDOWN when the run succeeded, SIGTERM to each worker's
  // process group otherwise; SIGKILL for any still alive after the grace period.
  void stop_workers(bool graceful) {
    for (auto& slot : slots) {
      if (slot.exited) continue;
      if (graceful && slot.routing_id) {
        protocol::send(router, protocol::Shutdown{"finished"}, {}, slot.routing_id);
      } else {
        ::kill(-slot.process.pid, SIGTERM);
      }
    }
    auto deadline = Clock::now() + kTerminateGrace;
    while (!all_exited() && Clock::now() < deadline) {
      poll_once(std::chrono::milliseconds(50));
      reap(true);
    }
    for (auto& slot : slots) {
      if (!slot.exited) ::kill(-slot.process.pid, SIGKILL);
    }
    while (!all_exited()) {
      poll_once(std::chrono::milliseconds(20));
      reap(true);
    }
    for (auto& slot : slots) slot.output->drain();  // the last lines before each exit
  }

  Result run() {
    start_workers();
    auto next_heartbeat = Clock::now() + kHeartbeatInterval;
    while (true) {
      poll_once(std::chrono::milliseconds(100));
      reap(false);
      check_timers();
      if (Clock::now() >= next_heartbeat) {
        send_heartbeats();
        next_heartbeat = Clock::now() + kHeartbeatInterval;
      }
      if (result.interrupted()) break;
      if (failures.settled(Clock::now(), kFailureGrace)) {
        result.error = failures.root_cause();
        break;
      }
      if (!failures.any() && assigned &&
          std::all_of(slots.begin(), slots.end(), [](const Slot& s) { return s.done; })) {
        break;
      }
    }
    stop_workers(!result.error.has_value());
    result.path = storage.dir();
    result.wall_seconds = seconds_since(start);
    return std::move(result);
  }
};

Controller::Controller(ControllerSetup setup, RunStorage& storage)
    : state_(std::make_unique<State>(std::move(setup), storage)) {}

Controller::~Controller() = default;

Result Controller::run() { return state_->run(); }

}  // namespace trainrun

#include "controller/controller.h"

#include <trainrun/error.h>

#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "common/constants.h"
#include "common/paths.h"
#include "controller/controller_state.h"

namespace trainrun {

// Local workers reach the controller on a Unix socket in a new directory only
// this user can enter: no other user can connect, and a report's round trip is
// ~30 us shorter than over TCP loopback. Where no such path can be made, TCP
// loopback.
std::string Controller::State::local_endpoint() {
  try {
    socket_dir = make_temp_dir("trainrun-controller-");
  } catch (const IoError& e) {
    log.warn("{}; listening on TCP loopback instead", e.what());
    return std::string("tcp://") + kLocalHost + ":*";
  }
  auto path = (socket_dir / "controller.sock").string();
  if (path.size() < sizeof(sockaddr_un::sun_path)) return "ipc://" + path;
  remove_socket_dir();
  return std::string("tcp://") + kLocalHost + ":*";  // a socket path that long is refused
}

void Controller::State::remove_socket_dir() {
  std::error_code ec;
  if (!socket_dir.empty()) std::filesystem::remove_all(socket_dir, ec);
  socket_dir.clear();
}

void Controller::State::start_workers() {
  router.set(zmq::sockopt::linger, 0);
  router.bind(local_endpoint());
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

std::string Controller::State::prefix(const Slot& slot) {
  return "(rank=" + std::to_string(slot.rank < 0 ? slot.index : slot.rank) +
         ", pid=" + std::to_string(slot.process.pid) +
         (slot.host.empty() ? "" : ", host=" + slot.host) + ")";
}

Slot* Controller::State::slot_by_routing_id(const std::string& id) {
  for (auto& slot : slots) {
    if (slot.routing_id == id || slot.train_id == id) return &slot;
  }
  return nullptr;
}

void Controller::State::fail(Slot& slot, const std::string& kind, const std::string& message) {
  if (slot.failed) return;
  slot.failed = true;
  // Before ranks are assigned, a local worker's launch index is its rank-to-be.
  int rank = slot.rank >= 0 ? slot.rank : slot.index;
  failures.add(RunError{kind, message, rank, slot.host, slot.process.pid});
  log.error("{} {}", slot.describe(), message);
}

void Controller::State::reap(bool expected) {
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

void Controller::State::check_timers() {
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
void Controller::State::poll_once(std::chrono::milliseconds timeout) {
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

void Controller::State::send_heartbeats() {
  for (auto& slot : slots) {
    if (slot.routing_id && !slot.exited) {
      protocol::send(router, protocol::Heartbeat{}, {}, slot.routing_id);
    }
  }
}

bool Controller::State::all_exited() const {
  return std::all_of(slots.begin(), slots.end(), [](const Slot& s) { return s.exited; });
}

// Ends every worker: SHUTDOWN when the run succeeded, SIGTERM to each worker's
// process group otherwise; SIGKILL for any still alive after the grace period.
void Controller::State::stop_workers(bool graceful) {
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

Result Controller::State::run() {
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

Controller::Controller(ControllerSetup setup, RunStorage& storage, CheckpointStore& checkpoints)
    : state_(std::make_unique<State>(std::move(setup), storage, checkpoints)) {}

Controller::~Controller() = default;

Result Controller::run() { return state_->run(); }

}  // namespace trainrun

#include "agent/node_agent.h"

#include <trainrun/error.h>
#include <trainrun/options.h>

#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <optional>
#include <regex>
#include <thread>
#include <utility>
#include <vector>

#include "common/constants.h"
#include "common/fd.h"
#include "common/local_worker.h"
#include "common/network.h"
#include "common/seconds.h"
#include "common/signals.h"
#include "common/silence.h"
#include "protocol/handshake.h"
#include "protocol/link_tally.h"
#include "protocol/message.h"
#include "protocol/messages.h"

namespace trainrun {
namespace {

using Clock = std::chrono::steady_clock;

/// The most bytes of a worker's output one OUTPUT carries.
constexpr size_t kOutputChunk = 64 * 1024;
/// How long the agent waits for each pass of its loop, and a reap between SIGCHLDs.
constexpr std::chrono::milliseconds kPollInterval{100};
constexpr std::chrono::seconds kReapInterval{1};
/// How long the last messages get to reach the controller before the agent exits.
constexpr std::chrono::seconds kFinalFlush{2};
/// The exit code reported for a worker whose status another process collected.
constexpr int kUnknownExit = 255;

/// The cores this process may run on (its affinity: a Slurm step's or a
/// container's share, not the whole machine).
int usable_cores() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

struct Child {
  LocalWorker process;  // its pid: its pipes are moved to fds
  bool exited = false;
  Fd fds[2];  // stdout, stderr; none once closed
};

/// A message for the controller, with its blob if it has one.
struct Outgoing {
  std::string type;
  zmq::message_t body;
  std::optional<zmq::message_t> blob;
};

template <typename T>
Outgoing outgoing(const T& payload, std::optional<zmq::message_t> blob = std::nullopt) {
  return Outgoing{T::kType, protocol::pack_body(payload), std::move(blob)};
}

class Agent {
 public:
  explicit Agent(const AgentOptions& options)
      : options_(options), dealer_(context_, zmq::socket_type::dealer) {
    dealer_.set(zmq::sockopt::linger, 2000);
    if (options_.keys) make_curve_client(dealer_, *options_.keys);
    handshake_.emplace(context_, dealer_);
    protocol::connect_dealer(dealer_, options_.connect);
    silence_limit_ =
        options_.startup_timeout.count() > 0 ? options_.startup_timeout : kDefaultStartupTimeout;
  }

  int run() {
    // The controller takes this agent's key before any worker starts: a
    // wrong one costs no worker, and is said at once.
    auto outcome = handshake_->wait(silence_limit_, signals_.fd());
    handshake_.reset();
    if (outcome != protocol::HandshakeWatch::Outcome::kDone) {
      spdlog::error("{}; no worker was started",
                    protocol::HandshakeWatch::describe(outcome, options_.connect,
                                                       options_.keys.has_value(), silence_limit_));
      return outcome == protocol::HandshakeWatch::Outcome::kRefused ||
                     outcome == protocol::HandshakeWatch::Outcome::kMismatch
                 ? 2
                 : 1;
    }
    start_workers(0);
    silence_ = Silence();
    auto next_heartbeat = Clock::now() + heartbeat_interval_;
    auto next_reap = Clock::now();
    // Workers that exited by themselves (finished, or crashed) leave the agent
    // waiting for the controller's word: SHUTDOWN, or a restart.
    while (!ending_ || !all_exited()) {
      poll_once();
      auto now = Clock::now();
      bool stalled = false;
      const auto silent = silence_.at(now, &stalled);
      if (stalled) {
        spdlog::warn(
            "this agent did not run for a while (stopped, or starved of CPU): the "
            "controller's silence counts from now");
      }
      if (child_exited_ || now >= next_reap) {
        child_exited_ = false;
        reap();
        next_reap = now + kReapInterval;
      }
      // Nothing left to stop (a failed start, workers that ended on their
      // own): the controller's silence counts again.
      if (all_exited() && !ending_ && stop_at_) {
        stop_at_.reset();
        terminated_ = killed_ = false;
      }
      if (all_exited() && restart_) {
        if (!between_attempts_) spdlog::info("workers ended for a new attempt");
        // Nothing to stop: the controller's silence counts again.
        stop_at_.reset();
        terminated_ = killed_ = false;
        between_attempts_ = true;
        if (*restart_ > 0) start_workers(*restart_);
      }
      if (now >= next_heartbeat) {
        if (queue_.empty()) queue_.push_back(outgoing(protocol::Heartbeat{}));
        next_heartbeat = now + heartbeat_interval_;
      }
      if (!stop_at_ && silent > silence_limit_) {
        spdlog::error(
            "lost the controller at {}: nothing heard for {} ms; ending the workers",
            options_.connect,
            std::chrono::duration_cast<std::chrono::milliseconds>(silence_limit_).count());
        exit_code_ = 1;
        end_for_good(Clock::duration::zero());
      }
      if (!escalate()) {
        spdlog::error("workers still running after SIGKILL: giving up on them");
        exit_code_ = 1;
        break;
      }
    }
    // The last lines and exits, while the controller still listens.
    auto deadline = Clock::now() + kFinalFlush;
    while (!queue_.empty() && Clock::now() < deadline) poll_once();
    return exit_code_ < 0 ? 0 : exit_code_;
  }

 private:
  // Starts the workers of an attempt and announces them (AGENT). The
  // controller hears why they could not all start: the attempt cannot go on
  // without them.
  void start_workers(int attempt) {
    children_.clear();
    restart_.reset();
    between_attempts_ = false;
    stop_at_.reset();
    terminated_ = killed_ = false;
    exit_code_ = -1;  // the exit code tells of the last attempt
    std::string error;
    try {
      spawn(attempt);
    } catch (const IoError& e) {
      error = e.what();
      spdlog::error("{}", error);
      begin_stop(Clock::duration::zero());
      exit_code_ = 1;
    }
    std::vector<int64_t> pids;
    for (const auto& child : children_) pids.push_back(child.process.pid);
    const auto& secret = options_.keys ? options_.keys->hello_secret : std::string();
    queue_.push_back(
        outgoing(protocol::AgentHello{host_name(), ::getpid(), secret, pids, error, attempt}));
    flush();  // now, before the workers can say HELLO: the controller knows them by it
  }

  // Ends the workers, and the agent once they have exited.
  void end_for_good(Clock::duration grace) {
    ending_ = true;
    restart_.reset();
    begin_stop(grace);
  }

  // `attempt`: the RESTART's, 0 for the first workers (the controller takes
  // them in whatever attempt it is in).
  void spawn(int attempt) {
    std::vector<std::string> args{"--connect",
                                  options_.connect,
                                  "--cache-dir",
                                  options_.cache_dir.string(),
                                  "--startup-timeout",
                                  seconds_arg(options_.startup_timeout)};
    if (!options_.key_file.empty()) {
      args.insert(args.end(),
                  {"--auth-key", std::filesystem::absolute(options_.key_file).string()});
    }
    if (!options_.interface.empty()) args.insert(args.end(), {"--interface", options_.interface});
    if (attempt > 0) args.insert(args.end(), {"--attempt", std::to_string(attempt)});
    args.insert(args.end(), {"--agent-pid", std::to_string(::getpid())});
    // The node's cores, shared: N workers with a thread per core each would
    // oversubscribe it N times (a run that names --cpus-per-worker overrides this).
    std::vector<std::string> env;
    if (std::getenv("OMP_NUM_THREADS") == nullptr) {
      auto threads = std::to_string(std::max(1, usable_cores() / options_.nproc));
      env = {"OMP_NUM_THREADS=" + threads, "MKL_NUM_THREADS=" + threads};
    }
    children_.reserve(static_cast<size_t>(options_.nproc));
    for (int i = 0; i < options_.nproc; ++i) {
      Child child;
      child.process = spawn_local_worker(options_.worker_executable, args, env);
      child.fds[0] = std::move(child.process.stdout_fd);
      child.fds[1] = std::move(child.process.stderr_fd);
      children_.push_back(std::move(child));
    }
    spdlog::info("started {} workers for {}", children_.size(), options_.connect);
  }

  bool all_exited() const {
    return std::all_of(children_.begin(), children_.end(),
                       [](const Child& child) { return child.exited; });
  }

  // One pass: the controller's socket, signals, and the workers' output, the
  // last only while nothing waits to be sent (the socket's backpressure reaches
  // the workers through their pipes).
  void poll_once() {
    std::vector<zmq::pollitem_t> items;
    short dealer_events = ZMQ_POLLIN | (queue_.empty() ? 0 : ZMQ_POLLOUT);
    items.push_back({dealer_.handle(), 0, dealer_events, 0});
    items.push_back({nullptr, signals_.fd(), ZMQ_POLLIN, 0});
    std::vector<std::pair<Child*, int>> watched;
    if (queue_.empty()) {
      for (auto& child : children_) {
        for (int stream = 0; stream < 2; ++stream) {
          if (!child.fds[stream]) continue;
          items.push_back({nullptr, child.fds[stream].get(), ZMQ_POLLIN, 0});
          watched.emplace_back(&child, stream);
        }
      }
    }
    protocol::poll(items.data(), items.size(), std::min(kPollInterval, heartbeat_interval_));
    if (items[0].revents & ZMQ_POLLIN) {
      for (auto frames = protocol::recv_frames(dealer_, true); !frames.empty();
           frames = protocol::recv_frames(dealer_, true)) {
        on_controller_message(std::move(frames));
      }
    }
    flush();
    if (items[1].revents & ZMQ_POLLIN) on_signals();
    for (size_t i = 0; i < watched.size(); ++i) {
      if (items[i + 2].revents & (ZMQ_POLLIN | ZMQ_POLLERR))
        read_output(*watched[i].first, watched[i].second);
    }
  }

  // Sends what is queued while the socket takes it, counted; a heartbeat
  // says what went before it.
  void flush() {
    while (!queue_.empty()) {
      auto& next = queue_.front();
      if (next.type == protocol::Heartbeat::kType)
        next.body = protocol::pack_body(link_.heartbeat());
      bool more = next.blob.has_value();
      if (!dealer_.send(zmq::buffer(next.type),
                        zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        return;  // the first frame decides: the rest of a message always follows
      }
      dealer_.send(next.body, more ? zmq::send_flags::sndmore : zmq::send_flags::none);
      if (more) dealer_.send(*next.blob, zmq::send_flags::none);
      link_.sent(next.type);
      queue_.pop_front();
    }
  }

  void on_controller_message(std::vector<zmq::message_t> frames) {
    silence_.heard(Clock::now());
    link_.received(frames[0].to_string_view());
    try {
      auto message = protocol::Incoming::parse(std::move(frames));
      const auto& type = message.type();
      if (type == protocol::Heartbeat::kType) {
        // A SHUTDOWN or RESTART lost to a reset connection: the controller
        // hears it, and ends the attempt (the next one starts afresh).
        if (auto loss = link_.settle(message.as<protocol::Heartbeat>()); loss.messages > 0) {
          auto reason = "its connection to the controller was reset, and " +
                        std::to_string(loss.messages) + " of the controller's messages were lost";
          spdlog::error("{}", reason);
          queue_.push_back(
              outgoing(protocol::Failed{reason, std::string(to_string(FailureKind::kLost))}));
        }
      } else if (type == protocol::AgentAccepted::kType) {
        auto accepted = message.as<protocol::AgentAccepted>();
        if (accepted.heartbeat_timeout_ms > 0) {
          silence_limit_ = std::chrono::milliseconds(accepted.heartbeat_timeout_ms);
          heartbeat_interval_ = heartbeat_interval(silence_limit_);
        }
      } else if (type == protocol::Shutdown::kType) {
        // The workers have their own SHUTDOWN: a grace period to take it.
        if (message.as<protocol::Shutdown>().restart && !ending_) {
          // This attempt ended: a RESTART whose workers have not started yet
          // is cancelled, and the next RESTART names the next attempt.
          restart_ = 0;
          if (!stop_at_ && !all_exited()) begin_stop(kTerminateGrace);
        } else {
          end_for_good(kTerminateGrace);  // an earlier, shorter stop stands
        }
      } else if (type == protocol::Restart::kType) {
        auto attempt = message.as<protocol::Restart>().attempt;
        if (!restart_ || ending_) throw ProtocolError("RESTART without a SHUTDOWN for a restart");
        spdlog::info("starting {} workers for attempt {}", options_.nproc, attempt);
        restart_ = std::max(1, attempt);
      } else if (type == protocol::Refused::kType) {
        spdlog::error("the controller refused this agent: {}",
                      message.as<protocol::Refused>().reason);
        exit_code_ = 2;
        end_for_good(Clock::duration::zero());
      } else {
        spdlog::warn("dropped a message of unknown type {} from the controller", type);
      }
    } catch (const ProtocolError& e) {
      spdlog::warn("dropped a message from the controller: {}", e.what());
    }
  }

  void on_signals() {
    for (int sig : signals_.drain()) {
      if (sig == SIGCHLD) {
        child_exited_ = true;
      } else {
        spdlog::warn("{}: ending the workers", signal_description(sig));
        if (exit_code_ < 0) exit_code_ = 1;
        end_for_good(Clock::duration::zero());
      }
    }
  }

  void read_output(Child& child, int stream) {
    Fd& fd = child.fds[stream];
    ssize_t n = ::read(fd.get(), buffer_.data(), buffer_.size());
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {  // EOF: the worker and whatever it started closed it
      fd.reset();
      return;
    }
    queue_.push_back(outgoing(protocol::Output{child.process.pid, stream},
                              zmq::message_t(buffer_.data(), static_cast<size_t>(n))));
  }

  void reap() {
    for (auto& child : children_) {
      if (child.exited) continue;
      int status = 0;
      pid_t got = ::waitpid(child.process.pid, &status, WNOHANG);
      // ECHILD: collected elsewhere (as PID 1's reaper in a container); gone all the same.
      bool lost = got < 0 && errno == ECHILD;
      if (got != child.process.pid && !lost) continue;
      child.exited = true;
      // Its last lines first; then what it started ends with it, as on the
      // controller's host.
      for (int stream = 0; stream < 2; ++stream) drain(child, stream);
      ::kill(-child.process.pid, SIGKILL);
      protocol::Exited exited{child.process.pid, 0, 0};
      if (lost) {
        exited.code = kUnknownExit;
      } else if (WIFSIGNALED(status)) {
        exited.signal = WTERMSIG(status);
      } else {
        exited.code = WEXITSTATUS(status);
      }
      std::optional<int> code;
      if (exited.signal == 0) code = exited.code;
      if (exited.code != 0 || exited.signal != 0) {
        spdlog::warn("worker pid {} {}", child.process.pid, exit_description(code, exited.signal));
        if (exit_code_ < 0) exit_code_ = 1;
      }
      queue_.push_back(outgoing(exited));
    }
  }

  // What a worker that exited left in its pipes, without waiting for EOF: a
  // process it started may hold them open.
  void drain(Child& child, int stream) {
    for (int i = 0; i < 64 && child.fds[stream]; ++i) {
      size_t before = queue_.size();
      read_output(child, stream);
      if (queue_.size() == before) break;
    }
    child.fds[stream].reset();
  }

  // SIGTERM to every worker's group after `grace` (they may be exiting on
  // their own), SIGKILL a grace period later; a later, shorter stop wins.
  void begin_stop(Clock::duration grace) {
    auto at = Clock::now() + grace;
    if (!stop_at_ || at < *stop_at_) stop_at_ = at;
  }

  // False once even SIGKILL has had its grace period: a process stuck in the
  // kernel (an uninterruptible wait on a dead device) is given up on.
  bool escalate() {
    if (!stop_at_ || all_exited()) return true;
    auto now = Clock::now();
    if (now >= *stop_at_ + 2 * kTerminateGrace) return false;
    if (!terminated_ && now >= *stop_at_) {
      signal_all(SIGTERM);
      terminated_ = true;
    } else if (!killed_ && now >= *stop_at_ + kTerminateGrace) {
      signal_all(SIGKILL);
      killed_ = true;
    }
    return true;
  }

  void signal_all(int signal) {
    for (const auto& child : children_) {
      if (child.exited) continue;
      ::kill(-child.process.pid, signal);
      // A stopped process (SIGSTOP) takes SIGTERM only once it continues.
      if (signal == SIGTERM) ::kill(-child.process.pid, SIGCONT);
    }
  }

  AgentOptions options_;
  SignalPipe signals_;
  zmq::context_t context_;
  zmq::socket_t dealer_;
  std::optional<protocol::HandshakeWatch> handshake_;  // until the first handshake
  protocol::LinkTally link_;
  std::vector<Child> children_;
  std::deque<Outgoing> queue_;
  std::vector<char> buffer_ = std::vector<char>(kOutputChunk);
  Silence silence_;  // the controller's
  std::chrono::milliseconds silence_limit_{0};
  std::chrono::milliseconds heartbeat_interval_ = kHeartbeatInterval;
  std::optional<Clock::time_point> stop_at_;
  // Set by a SHUTDOWN for a restart (0) and by RESTART (its attempt): the
  // workers end, and the next attempt's start once they all have.
  std::optional<int> restart_;
  bool between_attempts_ = false;
  bool ending_ = false;  // the agent exits once its workers have
  bool terminated_ = false;
  bool killed_ = false;
  bool child_exited_ = false;
  int exit_code_ = -1;
};

}  // namespace

int run_agent(const AgentOptions& options) {
  spdlog::set_pattern("[trainrun agent on " + host_name() + "] %^%l%$: %v");
  try {
    Agent agent(options);
    return agent.run();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}

namespace {

// A Slurm count the same on every node: "2", or "2(x3)" (2 on each of 3
// nodes). A list of different counts ("3,2") has no one answer for a node.
int slurm_count(const char* name, const char* value) {
  static const std::regex kCount("([0-9]{1,6})(\\(x[0-9]+\\))?");
  std::cmatch match;
  if (!std::regex_match(value, match, kCount) || std::stoi(match[1].str()) < 1) {
    throw UsageError(std::string(name) + "=" + std::string(value).substr(0, 64) +
                     " is not one task count for every node: give --nproc");
  }
  return std::stoi(match[1].str());
}

}  // namespace

std::optional<int> slurm_workers_per_node() {
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* per_node = std::getenv("SLURM_NTASKS_PER_NODE");
  const char* step_tasks = std::getenv("SLURM_STEP_NUM_TASKS");
  const char* step_nodes = std::getenv("SLURM_STEP_NUM_NODES");
  if (job == nullptr || per_node == nullptr || step_tasks == nullptr || step_nodes == nullptr) {
    return std::nullopt;
  }
  // A step of one task per worker (`srun -n 8 trainrun worker`): each task is a worker.
  if (slurm_count("SLURM_STEP_NUM_TASKS", step_tasks) !=
      slurm_count("SLURM_STEP_NUM_NODES", step_nodes)) {
    return std::nullopt;
  }
  return slurm_count("SLURM_NTASKS_PER_NODE", per_node);
}

}  // namespace trainrun

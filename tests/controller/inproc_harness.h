#pragma once

// The controller in this process, driven without processes or real time: it
// listens on an inproc:// endpoint of a ZeroMQ context the test shares, reads
// a ManualClock the test moves, and its peers (remote workers, node agents)
// are DEALER sockets the test scripts message by message. A heartbeat timeout,
// a failure's grace period or a back-off passes when the test moves the
// clock, so each scenario runs in milliseconds. The controller runs on its own
// thread; each Peer is used by the test's thread only.

#include <spdlog/logger.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "controller/checkpoint_store.h"
#include "controller/controller.h"
#include "controller/run_storage.h"
#include "protocol/message.h"
#include "protocol/messages.h"

namespace trainrun::testing {

/// A clock that moves only when told; the controller's waits stay short
/// (1 ms) so that it sees each move at once. hold() parks the controller
/// before its next wait, so that what the test sends until release() is read
/// in one pass of its loop, as messages that arrived together are.
class ManualClock final : public TimeSource {
 public:
  Clock::time_point now() const override {
    return Clock::time_point(Clock::duration(ticks_.load()));
  }
  std::chrono::milliseconds longest_wait(std::chrono::milliseconds wanted) const override {
    std::unique_lock lock(mutex_);
    parked_ = held_;
    changed_.notify_all();
    changed_.wait(lock, [this] { return !held_; });
    parked_ = false;
    return std::min(wanted, std::chrono::milliseconds(1));
  }
  void advance(Clock::duration by) { ticks_ += by.count(); }
  /// Returns once the controller is parked before its next wait; throws
  /// when it does not park within `patience` (it ended).
  void hold(std::chrono::seconds patience = std::chrono::seconds(20)) {
    std::unique_lock lock(mutex_);
    held_ = true;
    if (!changed_.wait_for(lock, patience, [this] { return parked_; })) {
      held_ = false;
      throw std::runtime_error("the controller did not come to its next wait");
    }
  }
  void release() {
    std::lock_guard lock(mutex_);
    held_ = false;
    changed_.notify_all();
  }

 private:
  std::atomic<Clock::rep> ticks_{Clock::now().time_since_epoch().count()};
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  mutable bool held_ = false;
  mutable bool parked_ = false;
};

/// How long, in real time, a test waits for anything before it fails.
constexpr std::chrono::seconds kPatience{20};

/// One connection to the controller, as a worker thread or a node agent has.
class Peer {
 public:
  Peer(zmq::context_t& context, const std::string& endpoint);

  template <typename T>
  void send(const T& message, std::vector<zmq::message_t> blobs = {}) {
    protocol::send(socket_, message, std::move(blobs));
  }

  /// The next message of type T, past the controller's heartbeats. Throws
  /// (failing the test) on any other type, or when none comes within
  /// kPatience. With a clock, moves it by `step` for each millisecond that
  /// passes without a message: time runs only while the test waits.
  template <typename T>
  T expect(ManualClock* clock = nullptr, Clock::duration step = {}) {
    auto message = next(clock, step, T::kType);
    return message.template as<T>();
  }

  /// Whether a message other than a heartbeat is waiting, or comes within `wait`.
  bool has_message(std::chrono::milliseconds wait = std::chrono::milliseconds(0));

 private:
  protocol::Incoming next(ManualClock* clock, Clock::duration step, const std::string& type);

  zmq::socket_t socket_;
  std::vector<protocol::Incoming> held_;  // read by has_message, not yet expected
};

/// A remote worker as the test plays it: its main connection, and its train
/// and upload connections once it has ATTACHed them.
struct ScriptedWorker {
  ScriptedWorker(zmq::context_t& context, std::string endpoint, std::string host, int64_t pid)
      : context(context),
        endpoint(std::move(endpoint)),
        host(std::move(host)),
        pid(pid),
        main(context, this->endpoint) {}

  /// HELLO, as a worker started by hand (agent_pid 0) or by a node agent.
  void hello(int attempt = 0, int64_t agent_pid = 0);
  /// ATTACHes the train connection (as the ASSIGN's rank) and says STARTED.
  void start(const protocol::Assign& assign, bool shares_storage = false);
  void attach_upload(const protocol::Assign& assign);
  /// REPORT of metrics {"step": iteration} and no checkpoint.
  void report(int64_t iteration);

  zmq::context_t& context;
  std::string endpoint;
  std::string host;
  int64_t pid;
  Peer main;
  std::optional<Peer> train;
  std::optional<Peer> upload;
};

/// A Controller on its own thread with a fresh run directory under `root`.
class InprocRun {
 public:
  /// `options` needs only what the scenario is about: storage, listening
  /// endpoint, local workers (none) and timeouts are set here unless given.
  InprocRun(const std::filesystem::path& root, TrainerOptions options);
  ~InprocRun();

  const std::string& endpoint() const { return endpoint_; }
  zmq::context_t& context() { return context_; }
  ManualClock& clock() { return clock_; }
  RunStorage& storage() { return *storage_; }
  /// Asks the run to stop, as Trainer::stop does.
  void stop();
  /// Whether a log line so far contains `text`.
  bool logged(const std::string& text) const;
  /// Waits until a log line contains `text`; false after kPatience.
  bool wait_for_log(const std::string& text) const;
  /// The run's outcome, moving the clock by `step` for each millisecond the
  /// test waits (none: the clock stays). Fails the test after kPatience.
  RunOutcome outcome(Clock::duration step = {});
  /// A new remote worker, not yet connected.
  ScriptedWorker worker(const std::string& host, int64_t pid) {
    return ScriptedWorker(context_, endpoint_, host, pid);
  }

 private:
  ManualClock clock_;
  zmq::context_t context_;
  std::string endpoint_;
  std::unique_ptr<RunStorage> storage_;
  std::unique_ptr<CheckpointStore> checkpoints_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> lines_;
  Fd stop_fd_;  // the host program's stop, as Trainer::stop writes it
  std::future<RunOutcome> outcome_;
  std::thread thread_;
};

/// A REPORT's metrics as train::report encodes them.
std::vector<char> encode_metrics(const nlohmann::json& metrics);

}  // namespace trainrun::testing

#include "worker/worker.h"

#include <trainrun/error.h>
#include <trainrun/options.h>

#include <dlfcn.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/constants.h"
#include "common/hash.h"
#include "common/network.h"
#include "common/silence.h"
#include "protocol/handshake.h"
#include "protocol/link_tally.h"
#include "protocol/message.h"
#include "protocol/messages.h"
#include "transfer/chunk_pull.h"
#include "transfer/plugin_cache.h"
#include "worker/checkpoint_handover.h"
#include "worker/stacks.h"
#include "worker/train_thread.h"

namespace trainrun {
namespace {

using Clock = std::chrono::steady_clock;

// How long an in-process worker waits, once stopped, for its train thread to
// end (it closes its connections after its last message).
constexpr auto kInProcessCloseWait = std::chrono::seconds(2);
// ... and longer once its train function has returned: it only closes.
constexpr auto kInProcessTeardownWait = std::chrono::seconds(10);

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Exports what torchrun exports, so code written for torchrun keeps working.
void export_torchrun_environment(const protocol::Assign& assign) {
  ::setenv("RANK", std::to_string(assign.world_rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(assign.local_rank).c_str(), 1);
  ::setenv("GROUP_RANK", std::to_string(assign.node_rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(assign.world_size).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(assign.local_world_size).c_str(), 1);
}

// Where a channel's connection tells the main thread it was reset (inproc:
// the main thread connects before the channel's socket exists).
std::string reset_watch(const char* channel) {
  return std::string("inproc://trainrun-reset-") + channel;
}

class Worker {
 public:
  explicit Worker(const WorkerOptions& options)
      : options_(options), dealer_(context_, zmq::socket_type::dealer) {
    dealer_.set(zmq::sockopt::linger, 2000);
    if (options_.index < 0) handshake_.emplace(context_, dealer_);  // a remote worker
    connect_to_controller(dealer_, options_);
    resets_.reserve(3);
    for (const char* channel :
         {protocol::kTrainChannel, protocol::kStoreChannel, protocol::kUploadChannel}) {
      auto& watch = resets_.emplace_back(context_, zmq::socket_type::pair);
      watch.set(zmq::sockopt::linger, 0);
      watch.connect(reset_watch(channel));
      reset_channels_.push_back(channel);
    }
  }

  ~Worker() {
    if (train_thread_.joinable()) train_thread_.join();
  }

  /// Whether destroying the worker is safe: the train thread has closed its
  /// connection (or never started). Destruction ends the ZeroMQ context, which
  /// flushes what is queued to the controller; with the train thread still
  /// inside LibTorch, its socket open, it would wait for it forever.
  bool can_close() const { return !train_thread_.joinable() || train_finished_; }

  /// Whether the train thread started and its train function has not
  /// returned (or was not reached: it is stuck before it).
  bool in_train_function() const { return train_thread_.joinable() && !entry_returned_; }

  /// Whether the worker can be closed within `bound`: its train thread, done
  /// or failed, ends a moment after the controller has its last message.
  bool can_close_within(std::chrono::milliseconds bound) const {
    const auto deadline = Clock::now() + bound;
    while (!can_close() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return can_close();
  }

  int run() {
    auto startup =
        options_.startup_timeout.count() > 0 ? options_.startup_timeout : kDefaultStartupTimeout;
    const auto began = Clock::now();  // the handshake's wait is the startup's too
    if (handshake_) {  // a remote worker's key is said wrong at once, not at the timeout
      auto outcome = handshake_->wait(startup, -1);
      handshake_.reset();
      if (outcome != protocol::HandshakeWatch::Outcome::kDone) {
        spdlog::error("{}", protocol::HandshakeWatch::describe(outcome, options_.connect,
                                                               options_.keys.has_value(), startup));
        return outcome == protocol::HandshakeWatch::Outcome::kTimedOut ? 1 : 2;
      }
    }
    // A remote worker proves itself with the secret derived from the run key.
    const auto& secret =
        options_.index < 0 && options_.keys ? options_.keys->hello_secret : options_.secret;
    send(protocol::Hello{options_.index, host_name(), ::getpid(), secret, options_.attempt,
                         options_.agent_pid});
    silence_limit_ = startup;
    silence_ = Silence(began);
    auto next_heartbeat = Clock::now() + heartbeat_interval_;
    while (exit_code_ < 0) {
      zmq::pollitem_t items[] = {{dealer_.handle(), 0, ZMQ_POLLIN, 0},
                                 {resets_[0].handle(), 0, ZMQ_POLLIN, 0},
                                 {resets_[1].handle(), 0, ZMQ_POLLIN, 0},
                                 {resets_[2].handle(), 0, ZMQ_POLLIN, 0},
                                 {nullptr, options_.stop_fd, ZMQ_POLLIN, 0}};
      protocol::poll(items, options_.stop_fd >= 0 ? 5 : 4, std::chrono::milliseconds(100));
      if (items[4].revents & ZMQ_POLLIN) {  // an in-process worker's SIGTERM: nothing more starts
        exit_code_ = 1;
        break;
      }
      if (items[0].revents & ZMQ_POLLIN) on_controller_message();
      for (size_t i = 0; i < resets_.size(); ++i) {
        if (items[i + 1].revents & ZMQ_POLLIN) on_reset(i);
      }
      if (waiting_for_plugin_) obtain_plugin();
      if (walk_.valid() && walk_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        answer_stacks();
      }
      auto now = Clock::now();
      if (now >= next_heartbeat) {
        send(link_.heartbeat(now_ms()));
        next_heartbeat = now + heartbeat_interval_;
      }
      if (!options_.in_process && silence_.at(now) > silence_limit_) {
        spdlog::error("lost the controller at {}: nothing heard for {} s", options_.connect,
                      std::chrono::duration_cast<std::chrono::seconds>(silence_limit_).count());
        exit_code_ = 1;
      }
    }
    return exit_code_;
  }

 private:
  void on_controller_message() {
    auto frames = protocol::recv_frames(dealer_, true);
    if (frames.empty()) return;
    silence_.heard(Clock::now());
    link_.received(frames[0].to_string_view());
    try {
      auto message = protocol::Incoming::parse(std::move(frames));
      const auto& type = message.type();
      if (type == protocol::Heartbeat::kType) {
        // The controller's messages lost to a reset connection: this worker
        // cannot go on as if it had them (an ASSIGN, a piece of the plugin).
        if (auto loss = link_.settle(message.as<protocol::Heartbeat>()); loss.messages > 0) {
          auto reason = "its connection to the controller was reset, and " +
                        std::to_string(loss.messages) + " of the controller's messages were lost";
          spdlog::error("{}", reason);
          send(protocol::Failed{reason, std::string(to_string(FailureKind::kLost))});
        }
      } else if (type == protocol::Stacks::kType) {
        on_stacks(message.as<protocol::Stacks>());
      } else if (type == protocol::Assign::kType) {
        on_assign(message.as<protocol::Assign>());
      } else if (type == protocol::Chunk::kType) {
        on_plugin_chunk(message);
      } else if (type == protocol::PeerLost::kType) {
        auto lost = message.as<protocol::PeerLost>();
        groups_.announce(lost.generation, std::move(lost.ranks));
      } else if (type == protocol::Shutdown::kType) {
        exit_code_ = 0;
      } else if (type == protocol::Refused::kType) {
        spdlog::error("the controller refused this worker: {}",
                      message.as<protocol::Refused>().reason);
        exit_code_ = 2;
      } else {
        spdlog::warn("dropped a message of unknown type {} from the controller", type);
      }
    } catch (const ProtocolError& e) {
      spdlog::warn("dropped a message from the controller: {}", e.what());
    }
  }

  void on_assign(const protocol::Assign& assign) {
    if (assign_) return;  // a duplicate; the first one stands
    assign_ = assign;
    if (assign.heartbeat_interval_ms > 0) {
      heartbeat_interval_ = std::chrono::milliseconds(assign.heartbeat_interval_ms);
    }
    if (assign.heartbeat_timeout_ms > 0) {
      silence_limit_ = std::chrono::milliseconds(assign.heartbeat_timeout_ms);
    }
    // An in-process worker's: set by the controller's thread before it started.
    if (!options_.in_process) export_torchrun_environment(assign);
    obtain_plugin();
  }

  // The plugin from the host's cache, or downloaded into it by whichever
  // worker of the host holds the download claim. The others look again once
  // they can take the claim shared (no download under way): a waiting worker
  // hashes the cached file only then, not on every pass.
  void obtain_plugin() {
    using Kind = DownloadClaim::Kind;
    const auto& sha256 = assign_->plugin_sha256;
    waiting_for_plugin_ = false;
    try {
      if (user_plugin_unchanged()) {
        start_training(options_.plugin);
        return;
      }
      std::optional<std::filesystem::path> cached;
      if (auto settled = DownloadClaim::try_take(options_.cache_dir, sha256, Kind::kShared)) {
        cached = find_cached_plugin(options_.cache_dir, sha256);
      }
      if (!cached) {
        auto claim = DownloadClaim::try_take(options_.cache_dir, sha256, Kind::kExclusive);
        if (!claim) {
          waiting_for_plugin_ = true;
          return;
        }
        // Another worker may have finished between the look and the claim.
        cached = find_cached_plugin(options_.cache_dir, sha256);
        if (!cached) {
          claim_.emplace(std::move(*claim));
          download_ =
              std::make_unique<PluginDownload>(options_.cache_dir, sha256, assign_->plugin_size);
        }
      }
      if (cached) {
        start_training(*cached);
        return;
      }
    } catch (const Error& e) {
      claim_.reset();
      fail_setup(e.what());
      return;
    }
    fetcher_.emplace(protocol::kPluginSource, std::vector<uint64_t>{assign_->plugin_size});
    request_chunks();
  }

  // Whether the user's plugin file (an in-process worker's) is still the one
  // the controller sent, and can be loaded in place: one that is gone or
  // changed is fetched as usual, and so is one rebuilt since this process
  // loaded that path (the loader would hand back the old one, which stays).
  bool user_plugin_unchanged() const {
    if (options_.plugin.empty()) return false;
    static std::mutex mutex;
    static std::map<std::filesystem::path, std::string> loaded;  // path -> sha256 loaded there
    try {
      const auto& sha256 = assign_->plugin_sha256;
      if (sha256_file(options_.plugin) != sha256) return false;
      const auto path = std::filesystem::canonical(options_.plugin);
      std::lock_guard lock(mutex);
      // Whether the loader holds an image of this file (by its name or its
      // inode): then only one of this very content may be used again.
      if (void* image = ::dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD)) {
        ::dlclose(image);
        auto found = loaded.find(path);
        return found != loaded.end() && found->second == sha256;
      }
      loaded[path] = sha256;
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }

  void request_chunks() {
    for (const auto& fetch : fetcher_->requests()) send(fetch);
  }

  void on_plugin_chunk(protocol::Incoming& message) {
    if (!download_) return;
    auto chunk = message.as<protocol::Chunk>();
    if (message.blobs().size() != 1) throw ProtocolError("CHUNK without its bytes");
    const auto& bytes = message.blobs()[0];
    try {
      fetcher_->accept(chunk, bytes.size());
      download_->write(chunk.offset, bytes.data(), bytes.size());
      request_chunks();
      if (fetcher_->complete()) {
        auto path = download_->commit();
        download_.reset();
        claim_.reset();
        start_training(path);
      }
    } catch (const Error& e) {
      download_.reset();
      claim_.reset();
      fail_setup(std::string("plugin download failed: ") + e.what());
    }
  }

  void start_training(const std::filesystem::path& plugin_path) {
    train_thread_ = std::thread([this, plugin_path] {
      run_train_thread(context_, options_, *assign_, plugin_path, entry_returned_, groups_);
      train_finished_ = true;
    });
  }

  // Every thread's stack, walked on a thread of its own: this one goes on
  // with the heartbeats meanwhile, and answers once the walk is done. A
  // request during a walk is answered by it.
  void on_stacks(const protocol::Stacks& request) {
    walk_id_ = request.id;
    if (walk_.valid()) return;
    walk_ = std::async(std::launch::async, [] { return stacks::all_threads(kStackWalkBound); });
  }

  void answer_stacks() {
    protocol::StacksReply reply{walk_id_, {}};
    for (auto& thread : walk_.get()) {
      reply.threads.push_back({thread.tid, std::move(thread.name), std::move(thread.frames),
                               thread.answered, thread.train});
    }
    send(reply);
  }

  // A channel's connection was reset while the train function ran: what was
  // in flight (a REPORT, its acknowledgement, a store's reply) may be lost, and
  // a rank waiting for it would wait for ever. The attempt ends, retryably.
  void on_reset(size_t index) {
    while (!protocol::recv_frames(resets_[index], true).empty()) {
    }
    if (reset_told_ || exit_code_ >= 0 || !train_thread_.joinable() || train_finished_) return;
    reset_told_ = true;
    auto reason = std::string("its ") + reset_channels_[index] +
                  " connection to the controller was reset, and what was in flight on it may "
                  "be lost";
    spdlog::error("{}", reason);
    send(protocol::Failed{reason, std::string(to_string(FailureKind::kLost))});
  }

  // Every message on the main connection goes through here, counted.
  template <typename T>
  void send(const T& message) {
    link_.sent(T::kType);
    protocol::send(dealer_, message);
  }

  void fail_setup(const std::string& message) {
    send(protocol::Failed{message, std::string(to_string(FailureKind::kSetup))});
  }

  WorkerOptions options_;
  zmq::context_t context_;
  zmq::socket_t dealer_;
  std::optional<protocol::HandshakeWatch> handshake_;  // a remote worker's, until it succeeds
  protocol::LinkTally link_;
  std::vector<zmq::socket_t> resets_;  // the channels' reset watches
  std::vector<const char*> reset_channels_;
  bool reset_told_ = false;
  std::optional<protocol::Assign> assign_;
  std::optional<DownloadClaim> claim_;  // held while this worker downloads the plugin
  bool waiting_for_plugin_ = false;     // for another worker of this host to download it
  std::unique_ptr<PluginDownload> download_;
  std::optional<ChunkFetcher> fetcher_;
  std::thread train_thread_;
  std::future<std::vector<stacks::ThreadStack>> walk_;  // every thread's stack, while walked
  int64_t walk_id_ = 0;                                 // the request it answers
  std::atomic<bool> train_finished_{false};
  std::atomic<bool> entry_returned_{false};  // the train function returned
  GroupAnnouncements groups_;                // in-place recovery's, for the train thread
  Silence silence_;                          // the controller's
  std::chrono::milliseconds silence_limit_{0};
  std::chrono::milliseconds heartbeat_interval_ = kHeartbeatInterval;
  int exit_code_ = -1;
};

}  // namespace

void connect_to_controller(zmq::socket_t& socket, const WorkerOptions& options,
                           const char* channel) {
  if (channel != nullptr) {
    // Best effort: without the watch a reset shows as a collective's timeout.
    (void)zmq_socket_monitor(socket.handle(), reset_watch(channel).c_str(), ZMQ_EVENT_DISCONNECTED);
  }
  if (options.keys) make_curve_client(socket, *options.keys);
  protocol::connect_dealer(socket, options.connect);
}

namespace {

// Runs a worker to its end; returns its exit code and whether its train
// function had not returned (its thread goes on).
std::pair<int, bool> serve(const WorkerOptions& options) {
  int code = 1;
  bool left_running = false;
  try {
    auto worker = std::make_unique<Worker>(options);
    code = worker->run();
    // A worker process's end stops its train thread; in a process that goes
    // on, a train function that has returned is let finish.
    if (options.in_process
            ? worker->can_close_within(worker->in_train_function() ? kInProcessCloseWait
                                                                   : kInProcessTeardownWait)
            : worker->can_close()) {
      worker.reset();
    } else {
      left_running = worker->in_train_function();
      (void)worker.release();  // its thread is still running with the worker's sockets
      // What it handed over for upload is its own still.
      if (options.in_process) return {code, left_running};
    }
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
  remove_handed_over_checkpoints();  // what an unfinished run never uploaded
  return {code, left_running};
}

}  // namespace

void run_worker(const WorkerOptions& options) {
  // Line-buffered stdout: the controller forwards lines as they are printed,
  // and a crash loses at most a partial line.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  spdlog::set_pattern("[trainrun worker] %^%l%$: %v");
  stacks::install();
  const int code = serve(options).first;
  std::fflush(stdout);
  std::fflush(stderr);
  // Skip static destructors: the train thread may still be inside LibTorch.
  std::_Exit(code);
}

int run_worker_in_process(const WorkerOptions& options, bool& train_left_running) {
  // The process's own: no handlers of a worker's, no pattern of its log.
  const auto [code, left_running] = serve(options);
  train_left_running = left_running;
  return code;
}

}  // namespace trainrun

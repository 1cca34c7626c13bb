#pragma once

// The worker processes of one run and what the controller knows of each: its
// process and output, its four connections (routing ids), host, rank and state.
// The pool spawns local workers, forwards their output, reaps their exits and
// signals them; the controller decides what each event means. Lookups by
// connection and by rank are O(1), and output is watched through one epoll
// descriptor, so a thousand workers cost the controller's loop no scan per
// message. Owned by the controller's thread.

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/fd.h"
#include "common/local_worker.h"
#include "controller/worker_output.h"
#include "protocol/link_tally.h"

namespace trainrun {

using Clock = std::chrono::steady_clock;

/// A worker on a thread of this process (LaunchOptions::in_process).
struct InProcessThread;

/// One worker process, from spawn to exit.
struct WorkerSlot {
  int index = 0;        // launch order, local workers first, then remote ones as they connect
  bool remote = false;  // connected over the network: no process, output or scratch here
  LocalWorker process;  // only its pid (a remote one's on its host): output owns the pipes
  std::unique_ptr<WorkerOutput> output;
  std::optional<std::string> main_id;    // its main thread's connection, set by HELLO
  std::optional<std::string> train_id;   // its train thread's, set by ATTACH
  std::optional<std::string> store_id;   // its rendezvous store's, set by ATTACH
  std::optional<std::string> upload_id;  // its upload thread's, set by ATTACH
  std::string host;
  std::string attach_secret;      // a remote worker's, sent in its ASSIGN; ATTACH carries it
  std::filesystem::path scratch;  // its TMPDIR, removed when it exits
  Fd pidfd;                       // a local worker's: readable once it exits (watched by epoll)
  std::shared_ptr<InProcessThread> thread;  // an in-process one's, in place of a process
  int rank = -1;                            // once assigned
  bool started = false;                     // its train function was called (STARTED)
  bool shares_storage = false;              // a remote worker that sees the run directory (STARTED)
  bool done = false;
  bool failed = false;  // a failure of this worker was recorded
  bool exited = false;
  bool departed = false;  // lost, and the group went on without it (in-place recovery)
  // A replacement of a lost rank: when it was started (its startup timeout
  // counts from then, not from the attempt's start).
  std::optional<Clock::time_point> replacing_since;
  Clock::time_point last_heard;
  protocol::LinkTally main_link;  // its main connection's messages, both ways

  /// A thread of this process: never signalled; SHUTDOWN or its stop eventfd ends it.
  bool in_process() const { return thread != nullptr; }
  /// Its rank, or before ranks are assigned its launch index (its rank-to-be).
  int display_rank() const { return rank < 0 ? index : rank; }
  /// "rank 1 (host, pid 42)".
  std::string describe() const;
};

/// "host/pid": how a remote process is known.
std::string process_key(const std::string& host, int64_t pid);

/// How local workers are started.
struct LaunchOptions {
  std::filesystem::path executable;
  std::string endpoint;  // the controller's ROUTER
  std::filesystem::path cache_dir;
  std::chrono::milliseconds startup_timeout{0};
  int threads = 1;                    // OMP_NUM_THREADS and MKL_NUM_THREADS
  std::filesystem::path scratch_dir;  // where each worker gets worker-<index>/, its TMPDIR
  std::string secret;                 // the run's worker secret, in each one's environment
  std::filesystem::path logs_dir;
  LineEcho echo;  // worker output on the terminal too (or the host's function); empty: not
  // The one worker is a thread of this process, run by this module's entry
  // (common/in_process.h); its output is this process's own.
  bool in_process = false;
  std::filesystem::path in_process_module;
  std::filesystem::path plugin;  // the user's file, which it loads in place when unchanged
};

class WorkerPool {
 public:
  WorkerPool();
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// Makes room for `capacity` workers in all, and `spare` more that replace
  /// lost ones (spawn_replacement); call before the first spawn.
  void reserve(int capacity, int spare = 0);
  /// Forgets every worker, for a new attempt (the local ones have exited),
  /// and makes room for `capacity`.
  void clear(int capacity);
  /// Starts `count` local workers (with launch.in_process, one thread).
  /// Throws IoError; those already started stay in the pool, to be stopped.
  void spawn(int count, const LaunchOptions& launch);
  /// Starts a local worker that replaces `rank` (in-place recovery): the rank
  /// is its from here on, and its log worker-<rank>-<index>.log. Throws as
  /// spawn does; needs the room.
  WorkerSlot& spawn_replacement(const LaunchOptions& launch, int rank);
  /// Its output's prefix anew, after its host became known (its HELLO).
  void rename(WorkerSlot& worker);
  /// Whether another worker fits.
  bool has_room() const { return workers_.size() < capacity_ + spare_; }
  /// A worker that connected from the network, as its HELLO describes it; null
  /// when the pool is full. Its output comes from its node agent, if it has one.
  WorkerSlot* add_remote(const std::string& host, pid_t pid);
  /// The remote worker with this host and pid, or null.
  WorkerSlot* remote_worker(const std::string& host, int64_t pid);

  std::vector<WorkerSlot>& workers() { return workers_; }
  const std::vector<WorkerSlot>& workers() const { return workers_; }
  int size() const { return static_cast<int>(workers_.size()); }
  /// The worker with this launch index, or null.
  WorkerSlot* at_index(int index);
  /// The worker with this rank, or null.
  WorkerSlot* at_rank(int rank);
  /// The worker one of whose connections this is, or null.
  WorkerSlot* by_connection(const std::string& routing_id);

  void set_main_id(WorkerSlot& worker, const std::string& routing_id);
  void set_train_id(WorkerSlot& worker, const std::string& routing_id);
  void set_store_id(WorkerSlot& worker, const std::string& routing_id);
  void set_upload_id(WorkerSlot& worker, const std::string& routing_id);
  /// Gives each worker its rank: ranks[i] for the worker with launch index i.
  /// Output logs are named by rank from here on.
  void assign(const std::vector<int>& ranks);

  /// Readable when some worker has written output or exited.
  int output_fd() const { return epoll_fd_.get(); }
  /// Forwards what the workers have written.
  void forward_output();
  /// Whether a local worker exited since the last call (seen by forward_output
  /// through its pidfd): time to reap. No SIGCHLD handler is needed.
  bool take_exits() { return std::exchange(exits_, false); }

  /// The workers that exited since the last call, with their wait status
  /// (none when another part of this process collected it first).
  std::vector<std::pair<WorkerSlot*, std::optional<int>>> reap();
  bool all_exited() const;
  /// Sends `signal` to the process group of every local worker still running;
  /// an in-process one, which is this process, is told to end instead.
  void signal_all(int signal);
  /// Whether an in-process worker left its train function running: only
  /// this process's end stops it.
  bool train_left_running() const;
  /// Ends the process group of every local worker, exited or not: what a train
  /// function started does not outlive the run.
  void end_groups();
  /// Reads every worker's output to its end.
  void drain_output();

 private:
  std::vector<WorkerSlot> workers_;
  size_t capacity_ = 0;  // workers_ never grows past it and spare_: pointers into it stay valid
  size_t spare_ = 0;
  std::vector<WorkerSlot*> by_rank_;
  std::unordered_map<std::string, WorkerSlot*> by_connection_;
  std::unordered_map<std::string, WorkerSlot*> remote_by_process_;  // "host/pid"
  std::filesystem::path logs_dir_;  // worker-<rank>.log files, from spawn's LaunchOptions
  LineEcho echo_;
  void spawn_in_process(const LaunchOptions& launch);

  Fd epoll_fd_;
  int running_ = 0;
  bool exits_ = false;
};

}  // namespace trainrun

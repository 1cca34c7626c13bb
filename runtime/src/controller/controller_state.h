#pragma once

// The controller's state, shared by the two files that work on it: the process
// lifecycle and the run loop (controller.cpp) and the message handlers, report
// barrier and results (controller_messages.cpp). Used by the controller's one
// thread only.

#include <zmq.hpp>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "controller/controller.h"
#include "controller/failure.h"
#include "controller/local_worker.h"
#include "controller/report_barrier.h"
#include "controller/signals.h"
#include "controller/worker_output.h"
#include "protocol/message.h"
#include "protocol/messages.h"

namespace trainrun {

using Clock = std::chrono::steady_clock;

// Local workers only, so far: they reach the controller on a Unix socket
// (local_endpoint), and rank 0's store over TCP loopback.
constexpr const char* kLocalHost = "127.0.0.1";

// One worker process, from spawn to exit.
struct Slot {
  int index = 0;
  LocalWorker process;
  std::unique_ptr<WorkerOutput> output;
  std::optional<std::string> routing_id;  // its main thread's connection, set by HELLO
  std::optional<std::string> train_id;    // its train thread's, set by ATTACH
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

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Controller::State {
  ControllerSetup setup;
  RunStorage& storage;
  CheckpointStore& checkpoints;
  int64_t iteration_offset = 0;  // reports recorded by earlier runs of this name
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
  // Rank 0's store, once it listens; the other ranks get it once attached.
  std::optional<protocol::StoreAddress> store_address;
  // The checkpoint the workers resume from (empty: none), and its files once a
  // worker has fetched its listing.
  std::filesystem::path resume_dir;
  std::vector<protocol::CheckpointFile> resume_files;

  // The directory of the ROUTER's Unix socket (empty: it listens on TCP).
  std::filesystem::path socket_dir;

  State(ControllerSetup s, RunStorage& st, CheckpointStore& cs)
      : setup(std::move(s)),
        storage(st),
        checkpoints(cs),
        iteration_offset(cs.latest() ? cs.latest()->iteration : 0),
        log(*setup.log),
        barrier(setup.options.scaling.num_workers) {}
  ~State() { remove_socket_dir(); }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  int world_size() const { return setup.options.scaling.num_workers; }

  // The endpoint for the ROUTER to bind, which local workers connect to; makes
  // socket_dir when it is a Unix socket.
  std::string local_endpoint();

  void remove_socket_dir();

  void start_workers();

  static std::string prefix(const Slot& slot);

  Slot* slot_by_routing_id(const std::string& id);

  void fail(Slot& slot, const std::string& kind, const std::string& message);

  void reap(bool expected);

  void check_timers();

  // One pass of the loop: wait for sockets, pipes and signals; handle them.
  void poll_once(std::chrono::milliseconds timeout);

  void send_heartbeats();

  bool all_exited() const;

  // Ends every worker: SHUTDOWN when the run succeeded, SIGTERM to each worker's
  // process group otherwise; SIGKILL for any still alive after the grace period.
  void stop_workers(bool graceful);

  Result run();

  void on_router_readable();

  // The first message of a new connection: a worker's HELLO, or the ATTACH of
  // its train thread.
  void on_new_peer(const std::string& id, const protocol::Incoming& message);

  void on_hello(const std::string& id, const protocol::Hello& hello);

  void on_attach(const std::string& id, const protocol::Attach& attach);

  void assign_ranks();

  // A message on a worker's main connection, and on its train thread's.
  void handle_main(Slot& slot, protocol::Incoming& message);

  void handle_train(Slot& slot, protocol::Incoming& message);

  // Sends to the slot's train thread.
  template <typename T>
  void to_train(const Slot& slot, const T& message, std::vector<zmq::message_t> blobs = {}) {
    protocol::send(router, message, std::move(blobs), slot.train_id);
  }

  void on_report(Slot& slot, const protocol::Report& report);

  void on_upload_chunk(Slot& slot, protocol::Incoming& message);

  void on_uploaded(Slot& slot, const protocol::Uploaded& uploaded);

  void on_failed(Slot& slot, const protocol::Failed& failed);

  // A checkpoint upload failed: its staging goes, and the run fails with what
  // was committed intact.
  void abort_upload(const std::string& message);

  // The run fails with kind `storage` (the message says what could not be written).
  void fail_storage(const std::string& message);

  // Commits, acknowledges and records the report once every rank has reported
  // and every checkpoint file is in.
  void release_report();

  void on_fetch_checkpoint(Slot& slot, const protocol::FetchCheckpoint& fetch);

  void on_fetch_checkpoint_chunk(Slot& slot, const protocol::FetchCheckpointChunk& fetch);

  // Whether this worker streams its checkpoint files through the controller
  // rather than copying them into storage itself. Local workers share the
  // controller's filesystem, so only when asked to.
  bool streams_checkpoints(const Slot&) const { return setup.options.checkpoint.always_stream; }

  void record(int64_t iteration, nlohmann::json metrics, const std::string& checkpoint);

  // A rank that returns while others wait in report() would leave them waiting
  // forever: every rank must report the same number of times.
  void check_report_counts();
};

}  // namespace trainrun

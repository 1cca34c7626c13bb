#pragma once

// The controller of one run: binds the ROUTER socket, starts the local workers
// and routes every message to the part whose job it is:
//   WorkerPool         processes, connections, output, exits
//   ReportCoordinator  the report barrier and its records
//   CheckpointService  uploads, commits, the checkpoint to resume from
//   FailureCollector   the root cause of a failure
//   RendezvousStore    the process group's store
// The run goes through the phases of run_phase.h; what one attempt owns is an
// Attempt, made anew for each. The Controller's methods live by concern:
//   controller.cpp              the run: attempts in a row, its records, failures
//   controller_attempts.cpp     one attempt: start, ranks, end, back-off, standby workers
//   controller_liveness.cpp     the loop: heartbeats, timeouts, exits, signals, stopping
//   controller_agents.cpp       node agents: admission, their workers, output, exits
//   controller_reports.cpp      reports: the barrier, progress, DONE
//   controller_checkpoints.cpp  checkpoints: uploads, commits, deferred reports, fetches
//   controller_routing.cpp      dispatch: which connection a message came on, HELLO, ATTACH
// Everything happens on the calling thread, in one EventLoop. It never loads
// LibTorch: workers do.

#include <trainrun/options.h>
#include <trainrun/result.h>

#include <spdlog/logger.h>
#include <zmq.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "common/run_key.h"
#include "common/secret.h"
#include "common/signals.h"
#include "controller/attempt.h"
#include "controller/checkpoint_service.h"
#include "controller/checkpoint_store.h"
#include "controller/controller_dir.h"
#include "controller/event_loop.h"
#include "controller/node_agent.h"
#include "controller/rate_limiter.h"
#include "controller/run_phase.h"
#include "controller/run_storage.h"
#include "controller/worker_pool.h"
#include "controller/zap_handler.h"
#include "protocol/message.h"
#include "protocol/messages.h"
#include "tensorboard/event_writer.h"
#include "transfer/chunk_pull.h"

namespace trainrun {

/// Where rank 0's training loader is, as its worker said (checked).
struct ProgressSample {
  int attempt = 1;
  int world_size = 1;
  int64_t epoch = 0;
  int64_t batch = 0;
  int64_t batches = 0;  // 0: not known (the loader's sampler cannot be counted)
  int64_t steps = 0;
  int64_t samples = 0;  // on rank 0
};

struct ControllerSetup {
  TrainerOptions options;
  std::string entry;
  std::shared_ptr<const std::string> plugin_bytes;
  std::string plugin_sha256;
  int cpus_per_worker = 1;      // for local workers
  std::optional<RunKeys> keys;  // from the run key: CURVE on the listening endpoint
  std::shared_ptr<spdlog::logger> log;
  /// Called on the controller's thread when an attempt starts and when it ends.
  std::function<void(const std::vector<AttemptInfo>&)> on_attempts;
  /// The attempts earlier runs of this name made: this run's are recorded
  /// (AttemptInfo, ReportRecord, RunError) with numbers after theirs.
  int attempt_offset = 0;
  /// Called on the controller's thread with each recorded report.
  std::function<void(const ReportRecord&)> on_report;
  /// Asked of each report before the ranks go on: a reason ends the run
  /// there, as interrupted, with the report recorded and the ranks stopped
  /// while they wait for it.
  std::function<std::optional<std::string>(const ReportRecord&)> should_stop;
  /// Called on the controller's thread with each committed checkpoint (also
  /// those on_report names), when it is committed.
  std::function<void(const CheckpointInfo&)> on_checkpoint;
  /// Called on the controller's thread with rank 0's progress: at most every
  /// kProgressGap, and at each epoch's end.
  std::function<void(const ProgressSample&)> on_progress;
  /// Readable when the host program asks the run to stop (an eventfd); -1: none.
  int stop_fd = -1;
  /// Where worker output goes on its way to the terminal (whole lines; stream
  /// 0 is stdout, 1 stderr): the console or the host program's function;
  /// stdout and stderr when empty.
  LineEcho output;
  /// What the controller reads the time from; null: the steady clock. A test
  /// passes a clock it moves itself (it must outlive the controller).
  const TimeSource* time = nullptr;
  /// The ZeroMQ context of the controller's sockets; null: one of its own. A
  /// test shares its context to reach an `inproc://` listening endpoint.
  zmq::context_t* context = nullptr;
};

/// How a run ended.
struct RunOutcome {
  std::optional<RunError> error;  // the root cause; none when the run finished
  double wall_seconds = 0;
  std::vector<AttemptInfo> attempts;
};

class Controller {
 public:
  Controller(ControllerSetup setup, RunStorage& storage, CheckpointStore& checkpoints);
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  /// Runs to the end, in as many attempts as its failures allow; what the run
  /// recorded is in its directory.
  RunOutcome run();

  /// Whether a failure of this kind starts a new attempt (when failures
  /// remain): not a usage or plugin error, an interrupt, a storage or an
  /// internal error, which another attempt would meet again.
  static bool retryable(FailureKind kind);

 private:
  // Local workers reach the controller on a Unix socket (ControllerDir); in a
  // run of local workers only, Gloo binds their pairs to loopback.
  static constexpr const char* kLocalHost = "127.0.0.1";
  /// The most bytes of worker output one OUTPUT may carry.
  static constexpr size_t kMaxOutputChunk = 1 << 20;
  /// The longest one wait of the loop: timers are checked at least this often.
  static constexpr std::chrono::milliseconds kLongestWait{100};

  // --- The run (controller.cpp) ---------------------------------------------
  Clock::time_point now() const { return time_.now(); }
  /// Seconds since the run started.
  double elapsed() const;
  /// Moves the run to `next`, which its phase must allow; the same phase again
  /// is nothing.
  void enter(RunPhase next);
  /// Binds the listening endpoint for remote workers, with CURVE and its ZAP
  /// handler when there is a run key.
  void listen();
  /// Writes the storage probe; without it remote workers stream.
  void write_storage_probe();
  void on_refused_peer(const std::string& where, const char* why);
  void notify_attempts();
  /// Where worker output goes besides its log (ControllerSetup::output).
  LineEcho worker_echo() const;
  /// Logs how many "dropped a message" lines were held back.
  void summarize_dropped();
  /// Records a failure of the attempt, which from then on fails.
  void record_failure(RunError error);
  void fail(WorkerSlot& worker, FailureKind kind, const std::string& message,
            std::vector<std::string> stack = {});
  void fail_storage(const std::string& message);

  // --- Recovery in place (controller_recovery.cpp) -----------------------------
  /// Why `lost` cannot be survived in place: nullopt when the run does not
  /// recover in place at all, "" when it can.
  std::optional<std::string> in_place_refusal(const WorkerSlot& lost) const;
  /// Drops `lost` (which ended as `cause` says) from the group and lets the
  /// others go on without it, when the run recovers in place and can;
  /// false when the failure takes its usual course.
  bool recover_in_place(WorkerSlot& lost, FailureKind kind, const std::string& cause);
  void on_step_vote(WorkerSlot& worker, const protocol::StepVote& vote);
  /// The next generation, to the members left, for the ranks lost this pass.
  void announce_losses();
  /// A local worker in place of `lost`, which joins the group at a step
  /// boundary and catches up from a peer; a log line says why when none is.
  /// `loss` is what the group restarts for when rank 0's cannot start.
  void start_replacement(const WorkerSlot& lost, RunError loss);
  /// The replacement of `rank`, which needs one (needs_replacement), will not
  /// join (`why`): the attempt fails with the loss of that rank, and the group
  /// restarts from the latest checkpoint.
  void restart_without_writer(int rank, RunError loss, const std::string& why);
  /// Whether `rank` writes files into checkpoints: it did into one the whole
  /// group committed at this world size; none when there is none.
  std::optional<bool> writes_checkpoints(int rank) const;
  /// Whether the group goes on without `rank` only until its replacement
  /// joins: rank 0 (a train function saves on rank 0) or a rank known to
  /// write into the checkpoints, which none is kept without.
  bool needs_replacement(int rank) const {
    return rank == 0 || writes_checkpoints(rank).value_or(false);
  }
  /// The world ranks out of the group: lost in place and not replaced yet.
  std::vector<int> absent_ranks() const;
  /// Commits what was staged for the report of `iteration`, unless it lacks
  /// the files of a rank in `absent` (those absent when it was reported)
  /// that writes into checkpoints: then it is dropped, and a line says why.
  /// Returns the checkpoint's name, or empty. Throws IoError.
  std::string commit_unless_lacking(int64_t iteration, const nlohmann::json& metrics,
                                    const std::vector<int>& absent);
  /// Why no replacement is started for `lost`; "" when one can be.
  std::string replacement_refusal(const WorkerSlot& lost) const;
  /// The replacement's HELLO: its ASSIGN.
  void assign_replacement(WorkerSlot& worker);
  void on_joinable(WorkerSlot& worker, bool joinable);
  /// The replacement has gone before it joined (exited, or too slow to start):
  /// the group goes on without it (or restarts, without rank 0).
  void drop_replacement(const std::string& why);
  /// Whether `worker` is the replacement, not yet in the group.
  bool pending_replacement(const WorkerSlot& worker) const;
  void abort_upload(const std::string& message);

  // The phase, as the handlers ask it.
  /// Train functions run, and reports, uploads and commits are taken.
  bool records() const { return phase_ == RunPhase::kTraining; }
  /// Nothing failed and nothing stops: the attempt gathers, trains or regroups.
  bool healthy() const {
    return phase_ == RunPhase::kGathering || phase_ == RunPhase::kTraining ||
           phase_ == RunPhase::kRegrouping;
  }
  /// Workers are being stopped or are gone: their exits are no longer failures.
  bool stopping() const { return !healthy() && phase_ != RunPhase::kFailing; }
  /// Between two attempts: stopping for the next one, or waiting for it.
  bool between_attempts() const {
    return phase_ == RunPhase::kRestarting || phase_ == RunPhase::kBackingOff;
  }

  // --- One attempt (controller_attempts.cpp) ----------------------------------
  /// Makes the next Attempt, on the standby workers or new ones, and starts it.
  void start_attempt();
  /// What the last attempt leaves to the next: node agents that fell silent
  /// are dropped, the others forget their workers; the standby workers are
  /// taken when none exited. Returns the next attempt's pool.
  std::unique_ptr<WorkerPool> carry_over();
  struct AttemptEnd {
    std::optional<RunError> error;  // its root cause; none when it finished or regroups
    bool regroup = false;           // stopped at a checkpoint to take waiting workers
  };
  /// Serves the attempt until it ends.
  AttemptEnd run_attempt();
  /// How the attempt ended, once it has.
  std::optional<AttemptEnd> attempt_end() const;
  void end_attempt(const AttemptEnd& end);
  /// Waits before the next attempt when attempts keep failing before any report.
  void back_off();
  /// Assigns the ranks once enough workers are here: all of them, or on a
  /// restart every worker still to be had when they are at least the fewest.
  void maybe_assign();
  void assign_ranks();
  /// The ASSIGN of `worker` at `place` (all but the replacement's joining).
  protocol::Assign assign_for(WorkerSlot& worker, const Placement& place);
  /// Starts the standby workers once every rank's train function runs.
  void start_standby();
  /// Reaps the standby workers that exited (which are then not taken).
  void reap_standby();
  /// Whether the standby workers can be the next attempt's: none exited.
  bool standby_ready() const;
  void stop_standby();
  WorkerPool& pool() { return *attempt_->pool; }
  const WorkerPool& pool() const { return *attempt_->pool; }
  /// This attempt's world size, once its ranks are assigned (before: the most).
  int world_size() const { return attempt_->world_size; }
  int max_workers() const { return setup_.options.scaling.num_workers; }
  int min_workers() const {
    int min = setup_.options.scaling.min_workers;
    return min > 0 && min < max_workers() ? min : max_workers();
  }
  bool elastic() const { return min_workers() < max_workers(); }
  /// Room in an attempt's pool for workers that replace lost ones.
  int spare_workers() const { return setup_.options.failure.in_place ? max_workers() : 0; }

  // --- The loop and liveness (controller_liveness.cpp) ------------------------
  /// Registers what the loop waits for beyond the attempt's workers.
  void watch_sources();
  /// Watches this attempt's workers' output and exits (instead of the last's).
  void watch_pool();
  /// Serves the socket, the workers, signals and timers, and sends heartbeats,
  /// until `done` holds or `deadline` passes (checked before each wait).
  void serve_until(Clock::time_point deadline, const std::function<bool()>& done);
  void on_stop_fd();
  void on_signals();
  void on_monitor();
  void on_exits();
  void on_worker_exit(WorkerSlot& worker, std::optional<int> code, int signal);
  void check_timers();
  void check_startup();
  bool remote_workers_accounted() const;
  std::string silent_agent(const WorkerSlot& worker, Clock::time_point now) const;
  void send_heartbeats();
  /// `restart`: node agents stay, to start the next attempt's workers.
  void stop_workers(bool graceful, bool restart = false);
  /// An in-process worker's train thread and upload thread, which no signal
  /// ends, are told the run stops: what waits on the controller there raises.
  void tell_in_process_threads(const WorkerSlot& worker);

  // --- Node agents (controller_agents.cpp) ------------------------------------
  void on_agent_hello(const std::string& id, const protocol::AgentHello& hello);
  void admit_agent(const std::string& id, const protocol::AgentHello& hello);
  /// The workers an agent started for this attempt (its first AGENT, or one
  /// after RESTART).
  void accept_agent_workers(NodeAgent& agent, const protocol::AgentHello& hello);
  void handle_agent(NodeAgent& agent, protocol::Incoming& message);
  void on_agent_output(NodeAgent& agent, protocol::Incoming& message);
  void agent_failed(const NodeAgent& agent, const std::string& reason);
  void check_agent_worker(const protocol::Hello& hello);
  void remember_refused(const std::string& host, int64_t pid);
  void on_agent_exited(NodeAgent& agent, const protocol::Exited& exited);
  /// Gives a remote worker what its node agent forwarded before it connected.
  void hand_over_early_output(WorkerSlot& worker, int64_t pid);
  /// Drops the agents that fell silent; the others forget this attempt's workers.
  void carry_over_agents();
  /// Whether every node agent said each of its workers exited.
  bool agents_done() const;
  /// Workers the group may still take.
  int free_room() const;
  /// How long an agent may be silent before it counts as gone with its node:
  /// half the heartbeat timeout (its workers are lost after the whole), two
  /// heartbeats at least.
  std::chrono::milliseconds agent_silence_limit() const;

  // --- Reports (controller_reports.cpp) ---------------------------------------
  void on_report(WorkerSlot& worker, const protocol::Report& report);
  void on_arrive(WorkerSlot& worker, const protocol::Arrive& arrive);
  void on_done(WorkerSlot& worker);
  void on_progress(const WorkerSlot& worker, const protocol::Progress& progress);
  void release_report();
  /// The report's numeric metrics, into the run's TensorBoard event file.
  void write_tensorboard(const ReportRecord& record);
  void check_stalled();
  /// A rank that raised, on a connection its peer closed, while another rank
  /// had returned from train_func: the error is the returned rank's (a usage
  /// error), with the raise as evidence.
  RunError after_early_return(RunError error) const;

  // --- Stacks and hangs (controller_stacks.cpp) --------------------------------
  /// Asks the live workers of `ranks` (empty: every live worker) for their
  /// threads' stacks, for `reason`; they are written to logs/stacks-<n>.txt
  /// once all answered or after kStacksWait. One collection at a time: a
  /// second request while one runs is dropped.
  void collect_stacks(const std::string& reason, const std::vector<int>& ranks = {});
  void on_stacks_reply(WorkerSlot& worker, protocol::StacksReply reply);
  /// Writes the collection once it is complete, or with what answered when
  /// `force`d (its deadline passed, or the attempt ends).
  void finish_stacks(bool force);
  /// The bound of a report's wait: every rank's stacks at half the collective
  /// timeout, and the attempt fails at all of it, naming who did not arrive.
  void check_report_wait();

  // --- Checkpoints (controller_checkpoints.cpp) -------------------------------
  /// Answers a REPORT's checkpoint with UPLOAD; false when that failed the run.
  bool begin_upload(WorkerSlot& worker, const protocol::Report& report);
  /// `upload_channel`: it came on the upload thread's connection, where an
  /// asynchronous checkpoint's must come (a synchronous one's on the train
  /// thread's); the credit goes back the same way.
  void on_upload_chunk(WorkerSlot& worker, protocol::Incoming& message, bool upload_channel);
  void on_uploaded(WorkerSlot& worker, const protocol::Uploaded& uploaded, bool upload_channel);
  /// Runs one step of a rank's upload; a ProtocolError or IoError aborts the
  /// upload and fails the run (false).
  bool upload_step(const WorkerSlot& worker, const std::function<void()>& step);
  /// UPLOAD to a rank's upload thread, or once its connection attaches.
  void send_async_upload(const WorkerSlot& worker, const protocol::Upload& upload);
  /// Commits the asynchronous checkpoint once its report was released and
  /// every rank's upload is in; then replays the REPORTs that waited for it.
  void commit_async_checkpoint();
  /// Commits and records the asynchronous checkpoint; false when the attempt fails.
  bool commit_async(const Attempt::AsyncCheckpoint& pending);
  /// Drops the checkpoint of report `iteration`, which lacks the files of the
  /// lost ranks `lacking`.
  void drop_checkpoint(int64_t iteration, const std::vector<int>& lacking);
  /// An elastic group grows at a committed checkpoint when node agents wait.
  void maybe_regroup(const std::string& checkpoint);
  void on_fetch_checkpoint(WorkerSlot& worker, const protocol::FetchCheckpoint& fetch);
  void on_fetch_chunk(WorkerSlot& worker, const protocol::FetchChunk& fetch);

  // --- Dispatch (controller_routing.cpp) --------------------------------------
  /// Handles one message; false when none was waiting.
  bool on_router_readable();
  void on_new_peer(const std::string& id, const protocol::Incoming& message);
  void on_hello(const std::string& id, const protocol::Hello& hello);
  void on_remote_hello(const std::string& id, const protocol::Hello& hello);
  void on_attach(const std::string& id, const protocol::Attach& attach);
  void handle_main(WorkerSlot& worker, protocol::Incoming& message);
  void handle_train(WorkerSlot& worker, protocol::Incoming& message);
  void handle_store(WorkerSlot& worker, protocol::Incoming& message);
  void handle_upload(WorkerSlot& worker, protocol::Incoming& message);
  template <typename T>
  void to_main(WorkerSlot& worker, const T& message, std::vector<zmq::message_t> blobs = {}) {
    worker.main_link.sent(T::kType);
    protocol::send(router_, message, std::move(blobs), worker.main_id);
  }
  template <typename T>
  void to_agent(const std::string& id, NodeAgent& agent, const T& message) {
    agent.link.sent(T::kType);
    protocol::send(router_, message, {}, id);
  }
  template <typename T>
  void to_train(const WorkerSlot& worker, const T& message,
                std::vector<zmq::message_t> blobs = {}) {
    protocol::send(router_, message, std::move(blobs), worker.train_id);
  }

  // What the whole run keeps, whatever its attempts.
  ControllerSetup setup_;
  RunStorage& storage_;
  spdlog::logger& log_;
  const TimeSource& time_;
  ControllerDir dir_;                   // outlives the socket and the workers, which live in it
  std::string secret_ = make_secret();  // what local workers prove themselves with
  std::optional<zmq::context_t> own_context_;  // unless the setup shares one
  zmq::context_t& context_;
  std::optional<ZapHandler> zap_;  // bound before the router, which it guards
  zmq::socket_t router_{context_, zmq::socket_type::router};
  std::string listening_;  // the bound TCP endpoint, once listening
  // With --checkpoint-upload auto, a file in the run directory that remote
  // workers look for: those that find storage_token_ in it share the storage.
  std::filesystem::path storage_probe_;
  std::string storage_token_ = make_secret();
  // The router's failed handshakes (peers without the run key), once listening.
  std::optional<zmq::socket_t> monitor_;
  RateLimiter refused_{1, std::chrono::seconds(10)};  // "refused a peer" log lines
  std::optional<SignalPipe> signals_;                 // with TrainerOptions::handle_signals
  // Rank 0's metrics for TensorBoard (RunConfig::tensorboard), from the first
  // report on; dropped, with a warning, when a write fails.
  std::optional<TensorBoardWriter> tensorboard_;
  bool tensorboard_failed_ = false;
  EventLoop loop_;
  EventLoop::Id pool_watch_ = 0;  // the current pool's output and exits
  const Clock::time_point start_;
  RunPhase phase_ = RunPhase::kGathering;
  // What ends the run whatever its phase: a signal, or the host program's stop.
  std::optional<RunError> interrupted_;
  std::unique_ptr<Attempt> attempt_;  // the current attempt; a new one for each
  // The next attempt's local workers, started while this attempt trains and
  // failures remain: connected, LibTorch loaded, waiting for ASSIGN. A restart
  // takes them instead of starting new processes.
  std::unique_ptr<WorkerPool> standby_;
  std::unordered_map<std::string, NodeAgent> agents_;  // by connection
  // Agents refused (process_key), whose workers are refused too; at most kMaxRefusedAgents.
  static constexpr size_t kMaxRefusedAgents = 1024;
  std::unordered_set<std::string> refused_agents_;
  CheckpointService checkpoints_;
  RateLimiter dropped_{10, std::chrono::seconds(1)};  // "dropped a message" log lines
  // PROGRESS passed on to on_progress: at most one every kProgressGap, and
  // each epoch's end once, at most kProgressEnds a second.
  static constexpr auto kProgressGap = std::chrono::milliseconds(100);
  static constexpr int kProgressEnds = 50;
  Clock::time_point progress_passed_{};
  int64_t progress_end_steps_ = -1;  // the steps of the last epoch's end passed
  // The ranks that wrote files into a checkpoint the whole group committed in
  // this run at the world size `writers_world_` (0: none yet). Kept across
  // attempts of that size: which ranks write does not change.
  std::vector<int> checkpoint_writers_;
  int writers_world_ = 0;
  RateLimiter progress_ends_{kProgressEnds, std::chrono::seconds(1)};
  ChunkSource plugin_;
  LaunchOptions launch_;  // how local workers start
  int failures_used_ = 0;
  int idle_failures_ = 0;  // attempts in a row that failed before any report
  /// Attempts run.json lists: the first and the latest.
  static constexpr size_t kAttemptsKept = 100;
  std::vector<AttemptInfo> attempts_;
  double earlier_seconds_ = 0;  // the time_total_s earlier runs of this name reached
  // The loop's timers.
  Clock::time_point next_heartbeat_;
  bool child_exited_ = false;  // SIGCHLD seen since the last reap
  Clock::time_point next_reap_;
  Clock::time_point next_drop_summary_;
  // The last n of logs/stacks-<n>.txt, earlier runs of this name included.
  int64_t stacks_taken_ = 0;
};

}  // namespace trainrun

#pragma once

// What a run is given: the plugin, the scaling, where results go, which
// checkpoints are kept (Ray Train's ScalingConfig, RunConfig and
// CheckpointConfig). Plain values; the Trainer checks them.

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <string>
#include <utility>

namespace trainrun {

/// A peer (worker or controller) silent this long is declared lost.
inline constexpr std::chrono::milliseconds kDefaultHeartbeatTimeout{30000};
/// How long the controller waits for every worker to connect, and a worker
/// for its assignment.
inline constexpr std::chrono::milliseconds kDefaultStartupTimeout{120000};
/// How long one collective may wait for its peers (c10d's default).
inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout{1800000};

/// How many workers, and what each gets (Ray Train's ScalingConfig).
struct ScalingConfig {
  /// Workers in the group; with min_workers, the most.
  int num_workers = 1;
  /// Elastic (Ray Train's num_workers=(min, max)): the fewest workers an
  /// attempt starts with, 0 = num_workers (a fixed size). The first attempt
  /// waits up to the startup timeout for num_workers; a restart goes on with
  /// the workers that remain when they are at least this many; node agents
  /// that join later grow the group, up to num_workers, at the next committed
  /// checkpoint or restart. Ranks, world size and the sampler follow; the
  /// global batch changes with the world size.
  int min_workers = 0;
  /// LibTorch intra-op threads per worker; 0 = cores / local workers (at least 1).
  int cpus_per_worker = 0;
  /// One CUDA device per worker (by local rank) and an NCCL process group.
  /// Needs a LibTorch built with CUDA; otherwise Trainer refuses it.
  bool use_gpu = false;
  /// Workers the controller starts on this host; the rest connect to
  /// NetworkConfig::listen. -1 = all of them without `listen`, none with it.
  int local_workers = -1;
  /// Runs the train function in this process, as rank 0 of a world of 1, on
  /// a thread of its own (Ray Train's local mode, `trainrun --local`): the
  /// same SDK calls, storage, checkpoints and Result, where a debugger or a
  /// sanitizer attached to this process reaches the user's code. Loads
  /// LibTorch into this process and exports RANK=0, WORLD_SIZE=1 and the
  /// rest of torchrun's variables in it. Takes one worker, no `listen`, and
  /// no retries (FailureConfig::max_failures 0); no timeout ends it for
  /// silence, since a debugger stops every thread. The train function's
  /// output and the worker's messages are this process's own: not through
  /// Callbacks::on_output or log_sink, nor in logs/. A stopped run's train
  /// function raises at its next report(); one that never reports runs on
  /// until the process ends (the log says so). A plugin file rebuilt since
  /// this process loaded it is loaded from the plugin cache.
  bool in_process = false;
};

/// Where workers on other hosts reach the controller, and how they prove they
/// belong to the run (torchrun's rendezvous endpoint; Ray's head address).
struct NetworkConfig {
  /// A ZeroMQ TCP endpoint to listen on, "tcp://ADDRESS:PORT" (port 0: any free
  /// one, which the log names); empty = local workers only.
  std::string listen;
  /// The run key (`trainrun keygen FILE`): the control plane is encrypted and
  /// authenticated with ZeroMQ CURVE keys derived from it. Empty = no key,
  /// accepted only on a loopback address or with `insecure`.
  std::filesystem::path auth_key_file;
  /// Listen on a non-loopback address without a key: anyone who reaches the
  /// port can join the run and read its config.
  bool insecure = false;
};

/// Where results go and what the run is called (Ray Train's RunConfig).
struct RunConfig {
  /// Run name; empty = "trainrun-<timestamp>".
  std::string name;
  /// Storage root; empty = ~/trainrun_results. The run directory is storage_path/name.
  std::filesystem::path storage_path;
  /// Start from this committed checkpoint (any run's checkpoint_NNNNNN) when
  /// the run has none of its own; empty = none.
  std::filesystem::path resume_from;
  /// Start from resume_from even when the run has checkpoints of its own:
  /// each attempt starts from it until this fit() commits a checkpoint (Ray
  /// Tune's Population Based Training: a trial goes on from another's).
  bool resume_from_first = false;
  std::chrono::milliseconds heartbeat_timeout = kDefaultHeartbeatTimeout;
  std::chrono::milliseconds startup_timeout = kDefaultStartupTimeout;
  /// The process group's timeout (Gloo's, NCCL's): a collective that waits
  /// this long for a peer (stopped, deadlocked, skipping it) fails its rank,
  /// which ends the run rather than hanging it.
  std::chrono::milliseconds collective_timeout = kDefaultCollectiveTimeout;
  /// Rank 0's numeric metrics as TensorBoard event files in the run directory,
  /// at each report's iteration (`tensorboard --logdir <storage_path>`). One
  /// small record per report.
  bool tensorboard = true;
};

/// Which checkpoints to keep (Ray Train's CheckpointConfig).
struct CheckpointConfig {
  /// Checkpoints kept on disk, the best by score; the latest is kept as well
  /// (a rerun resumes from it). 0 = all.
  int num_to_keep = 0;
  /// The reported metric that ranks checkpoints; empty = the most recent are best.
  std::string score_attribute;
  /// Whether a higher score is better ("max") or a lower one ("min").
  bool score_max = true;
  /// Workers that share the controller's filesystem copy their checkpoint files
  /// into storage themselves; with this, every worker streams them through the
  /// controller's socket instead (as a worker on another host must), and
  /// get_checkpoint() fetches the checkpoint the same way.
  bool always_stream = false;
};

/// What the run does when a worker fails (Ray Train's FailureConfig).
struct FailureConfig {
  /// Failures the run survives: after each, every worker is stopped and the
  /// group starts again from the latest committed checkpoint (a new attempt).
  /// 0 = the first failure ends the run; -1 = no limit. A usage or plugin
  /// error, an interrupt and a storage error are never retried.
  int max_failures = 0;
  /// While an attempt trains, and failures remain, the next attempt's local
  /// workers are started and wait (LibTorch loaded, connected): a restart
  /// then skips the slowest part of a worker's start. Costs an idle process
  /// per local worker (about 60 MB of private memory each on CPU).
  bool standby = true;
  /// When a rank's process dies (a crash, a kill -9) while every rank trains,
  /// the others go on in place instead of restarting: the step in flight is
  /// done again in a group of the survivors, and no step is thrown away. Needs
  /// failures left (max_failures) and a CPU run (Gloo); the models prepared
  /// with train::prepare_model are what goes on. A rank that raises or falls
  /// silent, rank 0, a loss while a checkpoint uploads or before every train
  /// function started, and a train function that takes train::process_group()
  /// itself, restart the group as before. docs/fault-tolerance.md.
  bool in_place = false;
};

struct TrainerOptions {
  std::filesystem::path plugin;
  /// The plugin's entry; empty = its only one.
  std::string entry;
  /// Handed to train_func as train::Config; must be a JSON object.
  nlohmann::json config = nlohmann::json::object();
  ScalingConfig scaling;
  RunConfig run;
  CheckpointConfig checkpoint;
  NetworkConfig network;
  FailureConfig failure;
  /// The worker executable; empty = `trainrun-worker` beside this program or on PATH.
  std::filesystem::path worker_executable;
  /// Workers' plugin cache; empty = $TRAINRUN_CACHE_DIR or ~/.cache/trainrun.
  std::filesystem::path cache_dir;
  /// Print rank 0's metrics and worker output on the terminal.
  bool verbose = true;
  /// Handlers for SIGINT, SIGTERM and SIGHUP for the length of fit(), which
  /// end the run as interrupted (the trainrun command sets this), and SIGPIPE
  /// ignored. Off, the run installs no process-wide handler: a host program
  /// keeps its own, and ends a run with Trainer::stop().
  bool handle_signals = false;
  /// Progress (epoch, batch, samples/s, ETA) as a plain line this often,
  /// wherever the run's lines go (stdout, on_output, log_sink). Zero: none
  /// (nor the status line). Nothing with verbose off. At most a day.
  std::chrono::seconds progress_interval{30};
  /// When stdout is a terminal (and there is no on_output or log_sink), a
  /// live status line below the scrolling output instead of the plain lines
  /// (the trainrun command sets this). Off, a host program's terminal gets
  /// whole lines only (errors in red on a terminal, unless NO_COLOR is set).
  bool status_line = false;
  /// Profiles steps first to last (from 1; a step is one backward pass through
  /// a model that train::prepare_model prepared) on every rank with LibTorch's
  /// profiler, into <run>/profiles/rank-<R>.json (Chrome trace: Perfetto,
  /// TensorBoard). {0, 0}: none.
  std::pair<int64_t, int64_t> profile_steps{0, 0};
};

/// TrainerOptions as JSON and back (nlohmann's to_json and from_json, so
/// `nlohmann::json j = options;` works): every field, durations in
/// milliseconds (progress_interval in seconds). from_json takes what is
/// missing from a default TrainerOptions and throws UsageError in one line on
/// a value of the wrong type.
void to_json(nlohmann::json& j, const TrainerOptions& options);
void from_json(const nlohmann::json& j, TrainerOptions& options);

}  // namespace trainrun

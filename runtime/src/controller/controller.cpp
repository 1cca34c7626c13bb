#include "controller/controller.h"

#include <trainrun/error.h>

#include <sys/resource.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <csignal>

#include "common/constants.h"
#include "common/metrics_format.h"
#include "common/paths.h"
#include "controller/rank_assignment.h"

namespace trainrun {
namespace {

// Local workers only, so far: they reach the controller on a Unix socket
// (bind_endpoint), and rank 0's store over TCP loopback.
constexpr const char* kLocalHost = "127.0.0.1";
// A REPORT lists a checkpoint's files, an UPLOAD_CHUNK carries kChunkSize bytes.
constexpr int64_t kMaxFrame = 64 << 20;
constexpr int kPeerQueue = 64;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The kind a worker's FAILED names: what a worker can know of itself (an
// exception, a plugin or setup error); a claim to be a crash or an interrupt,
// which would outrank the real cause, is not taken.
FailureKind worker_failure_kind(const std::string& name, FailureKind otherwise) {
  auto kind = parse_failure_kind(name);
  if (kind == FailureKind::kException || kind == FailureKind::kPlugin ||
      kind == FailureKind::kSetup) {
    return *kind;
  }
  return otherwise;
}

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Each worker costs the controller about four descriptors (two pipes, a log
// file, a connection); the soft limit (often 1024) is raised to the hard one.
void raise_descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

Controller::Controller(ControllerSetup setup, RunStorage& storage, CheckpointStore& checkpoints)
    : setup_(std::move(setup)),
      storage_(storage),
      log_(*setup_.log),
      reports_(setup_.options.scaling.num_workers,
               checkpoints.latest() ? checkpoints.latest()->iteration : 0),
      checkpoints_(checkpoints, setup_.options.run.resume_from,
                   setup_.options.checkpoint.always_stream),
      plugin_(ChunkSource::from_memory(protocol::kPluginSource, setup_.plugin_bytes)) {}

Controller::~Controller() { remove_socket_dir(); }

// Local workers reach the controller on a Unix socket in a new directory only
// this user can enter: no other user can connect, and a report's round trip is
// ~30 us shorter than over TCP loopback. Where no such path can be made, TCP
// loopback.
std::string Controller::bind_endpoint() {
  try {
    socket_dir_ = make_temp_dir("trainrun-controller-");
  } catch (const IoError& e) {
    log_.warn("{}; listening on TCP loopback instead", e.what());
    return std::string("tcp://") + kLocalHost + ":*";
  }
  auto path = (socket_dir_ / "controller.sock").string();
  if (path.size() < sizeof(sockaddr_un::sun_path)) return "ipc://" + path;
  remove_socket_dir();
  return std::string("tcp://") + kLocalHost + ":*";  // a socket path that long is refused
}

void Controller::remove_socket_dir() {
  std::error_code ec;
  if (!socket_dir_.empty()) std::filesystem::remove_all(socket_dir_, ec);
  socket_dir_.clear();
}

RunOutcome Controller::run() {
  raise_descriptor_limit();
  router_.set(zmq::sockopt::linger, 0);
  router_.set(zmq::sockopt::router_mandatory, false);
  // Bounds on what one peer costs: a frame larger than any message needs ends
  // its connection, and at most kPeerQueue messages wait for a peer that does
  // not read (a chunk is 1 MiB; a well-behaved worker has at most its credit
  // of chunks and a few replies queued). Beyond that its messages are dropped.
  router_.set(zmq::sockopt::maxmsgsize, kMaxFrame);
  router_.set(zmq::sockopt::sndhwm, kPeerQueue);
  router_.bind(bind_endpoint());
  LaunchOptions launch;
  launch.executable = setup_.options.worker_executable;
  launch.endpoint = router_.get(zmq::sockopt::last_endpoint);
  launch.cache_dir = setup_.options.cache_dir;
  launch.startup_timeout = setup_.options.run.startup_timeout;
  launch.threads = setup_.cpus_per_worker;
  launch.logs_dir = storage_.logs_dir();
  launch.echo = setup_.options.verbose;
  try {
    pool_.spawn(world_size(), launch);
    log_.info("listening on {}; started {} workers ({} threads each)", launch.endpoint,
              world_size(), setup_.cpus_per_worker);
  } catch (const IoError& e) {
    failures_.add(RunError{FailureKind::kSetup, e.what(), -1, "", 0});
    log_.error("{}", e.what());
  }
  auto next_heartbeat = Clock::now() + kHeartbeatInterval;
  std::optional<RunError> error;
  while (true) {
    poll_once(std::chrono::milliseconds(100));
    on_exits();
    check_timers();
    if (Clock::now() >= next_heartbeat) {
      send_heartbeats();
      next_heartbeat = Clock::now() + kHeartbeatInterval;
    }
    if (interrupted_) {
      error = interrupted_;
      break;
    }
    if (failures_.settled(Clock::now(), kFailureGrace)) {
      error = failures_.root_cause();
      break;
    }
    if (!failures_.any() && assigned_ &&
        std::all_of(pool_.workers().begin(), pool_.workers().end(),
                    [](const WorkerSlot& w) { return w.done; })) {
      break;
    }
  }
  stop_workers(!error.has_value());
  return RunOutcome{error, seconds_since(start_)};
}

// One pass of the loop: wait for the socket, the workers' output and signals;
// handle them.
void Controller::poll_once(std::chrono::milliseconds timeout) {
  zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, signals_.fd(), ZMQ_POLLIN, 0},
                             {nullptr, pool_.output_fd(), ZMQ_POLLIN, 0}};
  protocol::poll(items, 3, timeout);
  if (items[2].revents & ZMQ_POLLIN) pool_.forward_output();
  if (items[1].revents & ZMQ_POLLIN) on_signals();
  if (items[0].revents & ZMQ_POLLIN) {
    // Until the socket is empty (at most 256 messages, so that output and
    // signals get their turn): asking ZMQ_EVENTS before each one costs more.
    for (int i = 0; i < 256 && on_router_readable(); ++i) {
    }
  }
}

void Controller::on_signals() {
  for (int sig : signals_.drain()) {
    if (sig == SIGCHLD) {
      child_exited_ = true;
    } else if ((sig == SIGINT || sig == SIGTERM || sig == SIGHUP) && !interrupted_) {
      interrupted_ = RunError{FailureKind::kInterrupted,
                              "interrupted by " + signal_description(sig), -1, "", 0};
    }
  }
}

// Reaps the workers that exited: when SIGCHLD says some did, on every pass
// while the run is failing (a crash's exit must be seen within the grace
// period to be named the cause), and once a second in case a signal was lost.
// Not on every pass otherwise: a waitpid per worker per pass costs a thousand
// system calls a pass at scale.
void Controller::on_exits() {
  auto now = Clock::now();
  if (!child_exited_ && !failures_.any() && now < next_reap_) return;
  child_exited_ = false;
  next_reap_ = now + std::chrono::seconds(1);
  for (auto [worker, wait_status] : pool_.reap()) {
    if (!wait_status) {
      if (!worker->done) {
        fail(*worker, FailureKind::kExit,
             "exited before finishing (another part of this process collected its status)");
      }
      continue;
    }
    int status = *wait_status;
    if (worker->done && WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    if (WIFSIGNALED(status)) {
      fail(*worker, FailureKind::kSignal,
           "was killed by " + signal_description(WTERMSIG(status)));
    } else {
      fail(*worker, FailureKind::kExit,
           "exited with code " + std::to_string(WEXITSTATUS(status)) + " before finishing");
    }
  }
}

// Startup and heartbeat timeouts, checked every 100 ms rather than every pass.
void Controller::check_timers() {
  auto now = Clock::now();
  if (now < next_timer_check_) return;
  next_timer_check_ = now + std::chrono::milliseconds(100);
  const auto& run = setup_.options.run;
  bool starting = !assigned_ && now - start_ > run.startup_timeout;
  for (auto& worker : pool_.workers()) {
    if (worker.exited) continue;
    if (starting && !worker.main_id) {
      fail(worker, FailureKind::kSetup,
           "did not connect to the controller within " +
               std::to_string(run.startup_timeout.count()) + " ms");
    } else if (worker.main_id && now - worker.last_heard > run.heartbeat_timeout) {
      fail(worker, FailureKind::kLost,
           "sent nothing for " + std::to_string(run.heartbeat_timeout.count()) +
               " ms: stopped responding");
    }
  }
}

void Controller::send_heartbeats() {
  for (auto& worker : pool_.workers()) {
    if (worker.main_id && !worker.exited) to_main(worker, protocol::Heartbeat{});
  }
}

// Ends every worker: SHUTDOWN when the run succeeded, SIGTERM to each worker's
// process group otherwise; SIGKILL for any still alive after the grace period.
void Controller::stop_workers(bool graceful) {
  if (graceful) {
    for (auto& worker : pool_.workers()) {
      if (worker.main_id && !worker.exited) to_main(worker, protocol::Shutdown{"finished"});
    }
  } else {
    pool_.signal_all(SIGTERM);
  }
  auto reap = [&](std::chrono::milliseconds wait) {
    poll_once(wait);
    pool_.reap();
  };
  auto deadline = Clock::now() + kTerminateGrace;
  while (!pool_.all_exited() && Clock::now() < deadline) reap(std::chrono::milliseconds(50));
  pool_.signal_all(SIGKILL);
  // SIGKILL ends a process unless it is stuck in the kernel (an uninterruptible
  // wait on a dead device): bounded, then given up on.
  deadline = Clock::now() + kTerminateGrace;
  while (!pool_.all_exited() && Clock::now() < deadline) reap(std::chrono::milliseconds(20));
  for (auto& worker : pool_.workers()) {
    if (!worker.exited) log_.error("{} did not exit after SIGKILL", worker.describe());
  }
  pool_.drain_output();  // the last lines before each exit
}

bool Controller::on_router_readable() {
  auto frames = protocol::recv_frames(router_, true);
  if (frames.empty()) return false;
  if (frames.size() < 2) return true;
  std::string id = frames[0].to_string();
  frames.erase(frames.begin());
  WorkerSlot* worker = pool_.by_connection(id);
  try {
    auto message = protocol::Incoming::parse(std::move(frames));
    if (worker == nullptr) {
      on_new_peer(id, message);
      return true;
    }
    worker->last_heard = Clock::now();
    if (worker->train_id == id) {
      handle_train(*worker, message);
    } else {
      handle_main(*worker, message);
    }
  } catch (const ProtocolError& e) {
    if (worker == nullptr) protocol::send(router_, protocol::Refused{e.what()}, {}, id);
    log_.warn("dropped a message from {}: {}", worker ? worker->describe() : "an unknown peer",
              e.what());
  }
  return true;
}

void Controller::on_new_peer(const std::string& id, const protocol::Incoming& message) {
  if (message.type() == protocol::Hello::kType) {
    on_hello(id, message.as<protocol::Hello>());
  } else if (message.type() == protocol::Attach::kType) {
    on_attach(id, message.as<protocol::Attach>());
  } else {
    throw ProtocolError("expected HELLO or ATTACH from a new peer, got " + message.type());
  }
}

void Controller::on_hello(const std::string& id, const protocol::Hello& hello) {
  WorkerSlot* worker = pool_.at_index(hello.index);
  if (worker == nullptr || worker->main_id || worker->process.pid != hello.pid) {
    throw ProtocolError("HELLO from an unexpected worker (index " + std::to_string(hello.index) +
                        ", pid " + std::to_string(hello.pid) + ")");
  }
  pool_.set_main_id(*worker, id);
  worker->host = hello.host;
  worker->last_heard = Clock::now();
  if (++hellos_ == world_size()) assign_ranks();
}

void Controller::on_attach(const std::string& id, const protocol::Attach& attach) {
  WorkerSlot* worker = assigned_ ? pool_.at_rank(attach.rank) : nullptr;
  if (worker == nullptr || worker->train_id || worker->process.pid != attach.pid) {
    throw ProtocolError("ATTACH from an unexpected train thread (rank " +
                        std::to_string(attach.rank) + ", pid " + std::to_string(attach.pid) + ")");
  }
  pool_.set_train_id(*worker, id);
  worker->last_heard = Clock::now();
  if (store_address_ && worker->rank != 0) to_train(*worker, *store_address_);
}

void Controller::assign_ranks() {
  std::vector<std::string> hosts;
  for (const auto& worker : pool_.workers()) hosts.push_back(worker.host);
  auto placements = trainrun::assign_ranks(hosts);
  std::vector<int> ranks;
  for (const auto& place : placements) ranks.push_back(place.world_rank);
  pool_.assign(ranks);
  auto config = nlohmann::json::to_msgpack(setup_.options.config);
  protocol::Assign assign;
  assign.world_size = world_size();
  assign.run_name = setup_.options.run.name;
  assign.storage_path = setup_.options.run.storage_path.string();
  assign.entry = setup_.entry;
  assign.config.assign(config.begin(), config.end());
  assign.plugin_sha256 = setup_.plugin_sha256;
  assign.plugin_size = setup_.plugin_bytes->size();
  assign.store_host = kLocalHost;
  assign.store_prefix = "trainrun/attempt-0";
  assign.bind_host = kLocalHost;
  assign.num_threads = setup_.cpus_per_worker;
  assign.heartbeat_timeout_ms = setup_.options.run.heartbeat_timeout.count();
  assign.checkpoint_dir = checkpoints_.resume_dir().string();
  assign.fetch_checkpoint = checkpoints_.streams();
  for (auto& worker : pool_.workers()) {
    const Placement& place = placements[static_cast<size_t>(worker.index)];
    assign.world_rank = place.world_rank;
    assign.local_rank = place.local_rank;
    assign.node_rank = place.node_rank;
    assign.local_world_size = place.local_world_size;
    assign.device =
        setup_.options.scaling.use_gpu ? "cuda:" + std::to_string(place.local_rank) : "cpu";
    to_main(worker, assign);
  }
  assigned_ = true;
}

void Controller::handle_main(WorkerSlot& worker, protocol::Incoming& message) {
  const auto& type = message.type();
  if (type == protocol::Heartbeat::kType) return;
  if (type == protocol::FetchChunk::kType) {
    auto [chunk, bytes] = plugin_.read(message.as<protocol::FetchChunk>());
    std::vector<zmq::message_t> blob;
    blob.push_back(std::move(bytes));
    to_main(worker, chunk, std::move(blob));
  } else if (type == protocol::Failed::kType) {  // before its train thread could start
    auto failed = message.as<protocol::Failed>();
    fail(worker, worker_failure_kind(failed.kind, FailureKind::kSetup), failed.message);
  } else {
    throw ProtocolError("unexpected message type " + type + " on a worker's main connection");
  }
}

void Controller::handle_train(WorkerSlot& worker, protocol::Incoming& message) {
  const auto& type = message.type();
  if (type == protocol::StoreReady::kType && worker.rank == 0) {
    on_store_ready(message.as<protocol::StoreReady>());
  } else if (type == protocol::Report::kType) {
    on_report(worker, message.as<protocol::Report>());
  } else if (type == protocol::UploadChunk::kType) {
    on_upload_chunk(worker, message);
  } else if (type == protocol::Uploaded::kType) {
    on_uploaded(worker, message.as<protocol::Uploaded>());
  } else if (type == protocol::FetchCheckpoint::kType) {
    on_fetch_checkpoint(worker, message.as<protocol::FetchCheckpoint>());
  } else if (type == protocol::FetchChunk::kType) {
    on_fetch_chunk(worker, message.as<protocol::FetchChunk>());
  } else if (type == protocol::Done::kType) {
    on_done(worker);
  } else if (type == protocol::Failed::kType) {
    auto failed = message.as<protocol::Failed>();
    auto kind = worker_failure_kind(failed.kind, FailureKind::kException);
    fail(worker, kind,
         kind == FailureKind::kException ? "raised: " + failed.message : failed.message);
  } else {
    throw ProtocolError("unexpected message type " + type + " on a train thread's connection");
  }
}

void Controller::on_store_ready(const protocol::StoreReady& ready) {
  store_address_ = protocol::StoreAddress{kLocalHost, ready.port};
  for (auto& worker : pool_.workers()) {
    if (worker.rank != 0 && worker.train_id) to_train(worker, *store_address_);
  }
}

void Controller::on_report(WorkerSlot& worker, const protocol::Report& report) {
  // A failing run records and commits nothing more; its workers are about to stop.
  if (failures_.any()) return;
  nlohmann::json metrics;
  if (worker.rank == 0) {
    try {
      metrics = nlohmann::json::from_msgpack(report.metrics);
    } catch (const nlohmann::json::exception& e) {
      throw ProtocolError(std::string("REPORT with malformed metrics: ") + e.what());
    }
  }
  if (worker.done) {
    throw ProtocolError("REPORT after DONE");
  }
  if (auto error = reports_.arrive(worker.rank, report.iteration, std::move(metrics))) {
    fail(worker, FailureKind::kUsage, *error);
    return;
  }
  if (report.checkpoint) {
    try {
      to_train(worker, checkpoints_.begin_upload(worker.rank, report.iteration, report.files));
    } catch (const UsageError& e) {
      fail(worker, FailureKind::kUsage, e.what());
      return;
    } catch (const Error& e) {
      abort_upload(e.what());
      return;
    }
  }
  release_report();
}

void Controller::on_upload_chunk(WorkerSlot& worker, protocol::Incoming& message) {
  if (failures_.any()) return;
  auto chunk = message.as<protocol::UploadChunk>();
  if (message.blobs().size() != 1) throw ProtocolError("UPLOAD_CHUNK without its bytes");
  try {
    checkpoints_.write_chunk(worker.rank, chunk, message.blobs()[0]);
  } catch (const Error& e) {
    abort_upload(e.what());
    return;
  }
  to_train(worker, protocol::UploadCredit{1});
}

void Controller::on_uploaded(WorkerSlot& worker, const protocol::Uploaded& uploaded) {
  if (failures_.any()) return;
  try {
    checkpoints_.finish_upload(worker.rank, uploaded);
  } catch (const Error& e) {
    abort_upload(e.what());
    return;
  }
  release_report();
}

// The worker waits for every answer here, so whatever goes wrong fails the run
// rather than leaving it waiting.
void Controller::on_fetch_checkpoint(WorkerSlot& worker, const protocol::FetchCheckpoint& fetch) {
  try {
    to_train(worker, checkpoints_.listing(fetch));
  } catch (const Error& e) {
    fail(worker, FailureKind::kStorage,
         std::string("cannot send the checkpoint to resume from: ") + e.what());
  }
}

void Controller::on_fetch_chunk(WorkerSlot& worker, const protocol::FetchChunk& fetch) {
  try {
    auto [chunk, bytes] = checkpoints_.read_chunk(fetch);
    std::vector<zmq::message_t> blob;
    blob.push_back(std::move(bytes));
    to_train(worker, chunk, std::move(blob));
  } catch (const Error& e) {
    fail(worker, FailureKind::kStorage,
         std::string("cannot send the checkpoint to resume from: ") + e.what());
  }
}

void Controller::on_done(WorkerSlot& worker) {
  if (worker.done) return;
  if (reports_.waiting(worker.rank)) throw ProtocolError("DONE while its report waits");
  worker.done = true;
  reports_.finished(worker.rank);
  check_stalled();
}

// Once every rank has reported and every checkpoint file is in, the report is
// committed, acknowledged and recorded.
void Controller::release_report() {
  if (!reports_.complete()) {
    check_stalled();
    return;
  }
  if (checkpoints_.uploading()) return;
  auto record = reports_.release();
  try {
    record.checkpoint = checkpoints_.commit(record.iteration, record.metrics);
  } catch (const IoError& e) {
    fail_storage(std::string("checkpoint commit failed: ") + e.what());
    return;
  }
  record.timestamp = unix_time();  // the report's time includes its commit
  record.time_total_s = seconds_since(start_);
  // The ranks go on while the report is recorded: its checkpoint, if any, is
  // committed, and this loop records it before it reads another message.
  for (int rank = 0; rank < world_size(); ++rank) {
    to_train(*pool_.at_rank(rank), protocol::ReportAck{reports_.iteration() - 1});
  }
  try {
    storage_.append_result(record);
  } catch (const IoError& e) {  // a full disk: what was recorded before stays
    fail_storage(std::string("cannot record a report: ") + e.what());
    return;
  }
  log_.info("report {} ({:.1f} s): {}{}", record.iteration, record.time_total_s,
            format_metrics(record.metrics),
            record.checkpoint.empty() ? "" : " -> " + record.checkpoint);
}

void Controller::check_stalled() {
  if (auto stalled = reports_.stalled()) {
    fail(*pool_.at_rank(stalled->first), FailureKind::kUsage, stalled->second);
  }
}

void Controller::fail(WorkerSlot& worker, FailureKind kind, const std::string& message) {
  if (worker.failed) return;
  worker.failed = true;
  failures_.add(RunError{kind, message, worker.display_rank(), worker.host, worker.process.pid});
  log_.error("{} {}", worker.describe(), message);
}

void Controller::fail_storage(const std::string& message) {
  failures_.add(RunError{FailureKind::kStorage, message, -1, "", 0});
  log_.error("{}", message);
}

void Controller::abort_upload(const std::string& message) {
  checkpoints_.abort();
  // Earlier checkpoints are intact; the run cannot go on without this one.
  fail_storage("checkpoint upload failed: " + message);
}

}  // namespace trainrun

// What each message means: the controller's router. A message from a new
// connection must be a HELLO or an ATTACH; one from a known worker goes to the
// handler for its connection (main, train, store or upload), which hands it to the
// part whose job it is (WorkerPool, ReportCoordinator, CheckpointService,
// RendezvousStore) and sends the answer. A part's IoError is a storage failure
// of the run; its ProtocolError (a request this peer had no business making)
// reaches on_router_readable, which drops the message with a log line. The
// loop and the workers' lifecycle are in controller.cpp.

#include <trainrun/error.h>

#include "common/metrics_format.h"
#include "controller/controller.h"
#include "controller/rank_assignment.h"

namespace trainrun {
namespace {

// The kind a worker's FAILED names: what a worker can know of itself (an
// exception, a plugin or setup error, messages of its connection lost); a claim to be a crash or an
// interrupt, which would outrank the real cause, is not taken.
FailureKind worker_failure_kind(const std::string& name, FailureKind otherwise) {
  auto kind = parse_failure_kind(name);
  if (kind == FailureKind::kException || kind == FailureKind::kPlugin ||
      kind == FailureKind::kSetup || kind == FailureKind::kLost) {
    return *kind;
  }
  return otherwise;
}

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

bool Controller::on_router_readable() {
  auto frames = protocol::recv_frames(router_, true);
  if (frames.empty()) return false;
  if (frames.size() < 2) return true;
  std::string id = frames[0].to_string();
  frames.erase(frames.begin());
  WorkerSlot* worker = pool_->by_connection(id);
  NodeAgent* agent = nullptr;
  if (worker == nullptr && standby_) {
    if (WorkerSlot* waiting = standby_->by_connection(id)) {  // it waits for the next attempt
      waiting->last_heard = Clock::now();
      waiting->main_link.received(frames[0].to_string_view());
      return true;
    }
  }
  if (worker == nullptr) {
    auto found = agents_.find(id);
    if (found != agents_.end()) agent = &found->second;
  }
  // Counted by their type frame, whatever the rest holds: the sender counted them so.
  if (agent != nullptr) agent->link.received(frames[0].to_string_view());
  if (worker != nullptr && worker->main_id == id) {
    worker->main_link.received(frames[0].to_string_view());
  }
  try {
    auto message = protocol::Incoming::parse(std::move(frames));
    if (agent != nullptr) {
      handle_agent(*agent, message);
      return true;
    }
    if (worker == nullptr) {
      on_new_peer(id, message);
      return true;
    }
    worker->last_heard = Clock::now();
    if (worker->train_id == id) {
      handle_train(*worker, message);
    } else if (worker->store_id == id) {
      handle_store(*worker, message);
    } else if (worker->upload_id == id) {
      handle_upload(*worker, message);
    } else {
      handle_main(*worker, message);
    }
  } catch (const ProtocolError& e) {
    if (worker == nullptr && agent == nullptr) {
      protocol::send(router_, protocol::Refused{e.what()}, {}, id);
    }
    if (agent != nullptr && agent->refused) {  // its workers are refused with it
      log_.warn("{} is refused: {}", agent->describe(), e.what());
      to_agent(id, *agent, protocol::Refused{e.what()});
      remember_refused(agent->host, agent->pid);
      agents_.erase(id);
      return true;
    }
    if (dropped_.allow(Clock::now())) {
      log_.warn("dropped a message from {}: {}",
                worker  ? worker->describe()
                : agent ? agent->describe()
                        : "an unknown peer",
                e.what());
    }
  }
  return true;
}

void Controller::on_new_peer(const std::string& id, const protocol::Incoming& message) {
  if (message.type() == protocol::Hello::kType) {
    on_hello(id, message.as<protocol::Hello>());
  } else if (message.type() == protocol::Attach::kType) {
    on_attach(id, message.as<protocol::Attach>());
  } else if (message.type() == protocol::AgentHello::kType) {
    on_agent_hello(id, message.as<protocol::AgentHello>());
  } else {
    throw ProtocolError("expected HELLO, ATTACH or AGENT from a new peer, got " + message.type());
  }
}

void Controller::on_hello(const std::string& id, const protocol::Hello& hello) {
  if (hello.index < 0) {
    on_remote_hello(id, hello);
    return;
  }
  if (!secret_matches(hello.secret, secret_)) {
    throw ProtocolError("HELLO without this run's worker secret (index " +
                        std::to_string(hello.index) + ", pid " + std::to_string(hello.pid) + ")");
  }
  WorkerSlot* worker = pool_->at_index(hello.index);
  if (standby_ && (worker == nullptr || worker->process.pid != hello.pid)) {
    WorkerSlot* waiting = standby_->at_index(hello.index);
    if (waiting != nullptr && !waiting->main_id && waiting->process.pid == hello.pid) {
      standby_->set_main_id(*waiting, id);
      waiting->main_link.received(protocol::Hello::kType);
      waiting->host = hello.host;
      waiting->last_heard = Clock::now();
      return;  // it waits: the next attempt's HELLO
    }
  }
  if (worker == nullptr || worker->main_id || worker->process.pid != hello.pid) {
    throw ProtocolError("HELLO from an unexpected worker (index " + std::to_string(hello.index) +
                        ", pid " + std::to_string(hello.pid) + ")");
  }
  pool_->set_main_id(*worker, id);
  worker->main_link.received(protocol::Hello::kType);
  worker->host = hello.host;
  worker->last_heard = Clock::now();
  ++hellos_;
  maybe_assign();
}

// A worker from the network: with a run key it proved itself in the CURVE
// handshake and carries the HELLO secret derived from the key; without one
// (loopback, or --insecure) anyone who reaches the port may join.
void Controller::on_remote_hello(const std::string& id, const protocol::Hello& hello) {
  if (listening_.empty())
    throw ProtocolError("HELLO of a remote worker, but this run does not listen");
  if (setup_.keys && !secret_matches(hello.secret, setup_.keys->hello_secret)) {
    throw ProtocolError("HELLO without this run's key (a remote worker on " +
                        hello.host.substr(0, 64) + ")");
  }
  if (hello.agent_pid != 0) check_agent_worker(hello);
  if (hello.attempt > 0 && hello.attempt != attempt_) {
    // Started by its agent for an attempt that ended before it connected.
    protocol::send(router_, protocol::Shutdown{"its attempt is over", true}, {}, id);
    return;
  }
  if (assigned_ || stopping_) {
    // A worker of an agent that joined an elastic run during this attempt:
    // it is the next attempt's. Any other is one too many.
    for (const auto& [agent_id, agent] : agents_) {
      if (agent.waiting && agent.host == hello.host && agent.workers.count(hello.pid)) {
        protocol::send(router_, protocol::Shutdown{"it joins at the next attempt", true}, {}, id);
        return;
      }
    }
    throw ProtocolError("the ranks of this attempt are assigned (" + std::to_string(world_size()) +
                        " workers)");
  }
  // Full once every worker said HELLO.
  WorkerSlot* worker = pool_->add_remote(hello.host.substr(0, 255), static_cast<pid_t>(hello.pid));
  if (worker == nullptr) {
    throw ProtocolError("the run has all its " + std::to_string(max_workers()) + " workers");
  }
  pool_->set_main_id(*worker, id);
  worker->main_link.received(protocol::Hello::kType);
  log_.info("a worker on {} (pid {}) connected", worker->host, worker->process.pid);
  // What it wrote before it connected, if its node agent forwarded any.
  for (auto& [agent_id, agent] : agents_) {
    auto early = agent.early_output.find(hello.pid);
    if (agent.host != worker->host || early == agent.early_output.end()) continue;
    for (int stream : {protocol::kStdout, protocol::kStderr}) {
      const auto& bytes = early->second[static_cast<size_t>(stream)];
      worker->output->feed(stream, bytes.data(), bytes.size());
      agent.early_bytes -= bytes.size();
    }
    agent.early_output.erase(early);
  }
  ++hellos_;
  maybe_assign();
}

// A node agent's worker takes a place only as one its agent announced: the
// workers of an agent that was refused are refused too, so that which agent
// gets the room does not depend on whose workers connect first. (An agent
// announces its workers as it starts them, on a connection whose handshake is
// done: its AGENT comes before their HELLOs.)
void Controller::check_agent_worker(const protocol::Hello& hello) {
  const auto agent_key = process_key(hello.host.substr(0, 255), hello.agent_pid);
  if (refused_agents_.count(agent_key)) {
    throw ProtocolError("its node agent (pid " + std::to_string(hello.agent_pid) + ") was refused");
  }
  for (const auto& [id, agent] : agents_) {
    if (agent.host == hello.host && agent.pid == hello.agent_pid &&
        (agent.announced || agent.waiting) && !agent.workers.count(hello.pid)) {
      throw ProtocolError("its node agent (pid " + std::to_string(hello.agent_pid) +
                          ") did not announce pid " + std::to_string(hello.pid));
    }
  }
}

// A node agent: it proves itself as a remote worker does. It comes before the
// ranks are assigned (it sends AGENT as soon as its workers are started, a
// second before they connect) and claims no more workers than the run has
// room for, none claimed already.
void Controller::on_agent_hello(const std::string& id, const protocol::AgentHello& hello) {
  try {
    admit_agent(id, hello);
  } catch (const ProtocolError&) {
    // Its workers are refused too; only for an agent that proved itself,
    // lest a stranger name another's pid.
    if (!setup_.keys || secret_matches(hello.secret, setup_.keys->hello_secret)) {
      remember_refused(hello.host.substr(0, 255), hello.pid);
    }
    throw;
  }
}

// Bounded: a peer may say AGENT many times.
void Controller::remember_refused(const std::string& host, int64_t pid) {
  if (refused_agents_.size() < kMaxRefusedAgents) refused_agents_.insert(process_key(host, pid));
}

void Controller::admit_agent(const std::string& id, const protocol::AgentHello& hello) {
  if (listening_.empty()) throw ProtocolError("AGENT, but this run does not listen");
  if (setup_.keys && !secret_matches(hello.secret, setup_.keys->hello_secret)) {
    throw ProtocolError("AGENT without this run's key (on " + hello.host.substr(0, 64) + ")");
  }
  if (hello.workers.empty() && hello.error.empty()) throw ProtocolError("AGENT of no workers");
  // Between the attempts of a run that restarts (a replacement node), or during
  // an attempt of an elastic run: it waits, and the next attempt takes it.
  const bool waits = (stopping_ && restarting_) || (assigned_ && !stopping_ && elastic());
  if ((stopping_ && !restarting_) || (assigned_ && !waits) ||
      agents_.size() >= static_cast<size_t>(max_workers())) {
    throw ProtocolError("the run has all its " + std::to_string(max_workers()) + " workers");
  }
  NodeAgent agent;
  agent.host = hello.host.substr(0, 255);
  agent.pid = hello.pid;
  agent.last_heard = Clock::now();
  agent.link.received(protocol::AgentHello::kType);
  if (waits || attempt_ > 1) {
    // Room left by the workers of this attempt and of the agents still to
    // announce theirs: one that cannot fit is refused, and the run goes on.
    const int room = free_room();
    if (!hello.error.empty() || hello.workers.size() > static_cast<size_t>(std::max(0, room))) {
      throw ProtocolError("the run has room for " + std::to_string(std::max(0, room)) +
                          " more workers");
    }
  }
  if (waits) {
    for (int64_t pid : hello.workers) {
      if (!agent.workers.insert(pid).second || claimed_.count(process_key(agent.host, pid))) {
        throw ProtocolError("AGENT claims pid " + std::to_string(pid) + " twice");
      }
    }
    for (int64_t pid : hello.workers) claimed_.insert(process_key(agent.host, pid));
    agent_claims_ += static_cast<int>(hello.workers.size());
    agent.nproc = static_cast<int>(hello.workers.size());
    agent.waiting = true;
    log_.info("{} joined with {} workers: they join the group at its next {}", agent.describe(),
              agent.workers.size(), assigned_ && !stopping_ ? "checkpoint" : "attempt");
    auto& added = agents_.emplace(id, std::move(agent)).first->second;
    to_agent(id, added, protocol::AgentAccepted{setup_.options.run.heartbeat_timeout.count()});
    to_agent(id, added, protocol::Shutdown{"it joins at the next attempt", true});
    return;
  }
  accept_agent_workers(agent, hello);
  auto& added = agents_.emplace(id, std::move(agent)).first->second;
  to_agent(id, added, protocol::AgentAccepted{setup_.options.run.heartbeat_timeout.count()});
  maybe_assign();
}

// Workers the group may still take: the most, less the local ones, those
// agents announced, and those of agents still to announce theirs (as many as
// they had), not counting agents that fell silent (gone with their node).
int Controller::free_room() const {
  int room = max_workers() - setup_.options.scaling.local_workers - agent_claims_;
  const auto now = Clock::now();
  for (const auto& [id, agent] : agents_) {
    if (agent.announced || agent.waiting) {
      if (now - agent.last_heard > agent_silence_limit()) {
        room += static_cast<int>(agent.workers.size());
      }
    } else if (now - agent.last_heard <= agent_silence_limit()) {
      room -= agent.nproc;
    }
  }
  return room;
}

// The workers an agent started for this attempt: no more than there is room
// for, none claimed already.
void Controller::accept_agent_workers(NodeAgent& agent, const protocol::AgentHello& hello) {
  const int alone = max_workers() - setup_.options.scaling.local_workers;
  const int room = alone - agent_claims_;
  if (hello.workers.size() > static_cast<size_t>(alone)) {  // it could never fit: the user's to fix
    auto message = agent.describe() + " started " + std::to_string(hello.workers.size()) +
                   " workers, but the run has room for " + std::to_string(alone) +
                   " (--num-workers " + std::to_string(max_workers()) + ")";
    failures_.add(RunError{FailureKind::kUsage, message, -1, agent.host, agent.pid});
    log_.error("{}", message);
    throw ProtocolError(message);
  }
  if (hello.workers.size() > static_cast<size_t>(room)) {
    // Other agents came first: refused, as it would be once the ranks were
    // assigned, and the run goes on.
    throw ProtocolError("the run has room for " + std::to_string(std::max(0, room)) +
                        " more workers (others came first)");
  }
  std::unordered_set<int64_t> pids;
  for (int64_t pid : hello.workers) {
    if (!pids.insert(pid).second || claimed_.count(process_key(agent.host, pid))) {
      throw ProtocolError("AGENT claims pid " + std::to_string(pid) + " twice");
    }
  }
  for (int64_t pid : hello.workers) claimed_.insert(process_key(agent.host, pid));
  agent.workers = std::move(pids);
  agent.nproc = static_cast<int>(agent.workers.size());
  agent.announced = true;
  agent_claims_ += static_cast<int>(hello.workers.size());
  log_.info("{} started {} workers", agent.describe(), agent.workers.size());
  if (!hello.error.empty()) {
    auto message =
        agent.describe() + " could not start its workers: " + hello.error.substr(0, 1024);
    failures_.add(RunError{FailureKind::kSetup, message, -1, agent.host, agent.pid});
    log_.error("{}", message);
  }
}

void Controller::handle_agent(NodeAgent& agent, protocol::Incoming& message) {
  agent.last_heard = Clock::now();
  const auto& type = message.type();
  if (type == protocol::Heartbeat::kType) {
    auto loss = agent.link.settle(message.as<protocol::Heartbeat>());
    if (loss.output > 0) {
      log_.warn("{}: its connection was reset, and {} pieces of its workers' output were lost",
                agent.describe(), loss.output);
    }
    if (loss.messages > 0) {
      agent_failed(agent, "its connection to the controller was reset, and " +
                              std::to_string(loss.messages) + " of its messages were lost");
    }
  } else if (type == protocol::Failed::kType) {  // it lost messages of the controller's
    agent_failed(agent, message.as<protocol::Failed>().message.substr(0, 1024));
  } else if (type == protocol::Output::kType) {
    on_agent_output(agent, message);
  } else if (type == protocol::AgentHello::kType) {  // after RESTART
    auto hello = message.as<protocol::AgentHello>();
    if (assigned_ || stopping_ || !agent.workers.empty() || attempt_ < 2 ||
        hello.attempt != attempt_) {
      throw ProtocolError("AGENT for attempt " + std::to_string(hello.attempt) +
                          ", which the run did not ask for");
    }
    if (hello.workers.empty() && hello.error.empty()) throw ProtocolError("AGENT of no workers");
    try {
      accept_agent_workers(agent, hello);
    } catch (const ProtocolError&) {
      agent.refused = true;  // on_router_readable sends it away
      throw;
    }
    maybe_assign();
  } else if (type == protocol::Exited::kType) {
    on_agent_exited(agent, message.as<protocol::Exited>());
  } else {
    throw ProtocolError("unexpected message type " + type + " from " + agent.describe());
  }
}

// What an agent cannot go on from ends the attempt (a retryable loss); its
// workers are restarted with the others'.
void Controller::agent_failed(const NodeAgent& agent, const std::string& reason) {
  if (stopping_) return;
  auto message = agent.describe() + ": " + reason;
  failures_.add(RunError{FailureKind::kLost, message, -1, agent.host, agent.pid});
  log_.error("{}", message);
}

void Controller::on_agent_output(NodeAgent& agent, protocol::Incoming& message) {
  auto output = message.as<protocol::Output>();
  if (message.blobs().size() != 1 || message.blobs()[0].size() > kMaxOutputChunk) {
    throw ProtocolError("OUTPUT without its bytes, or with more than " +
                        std::to_string(kMaxOutputChunk));
  }
  if (output.stream != protocol::kStdout && output.stream != protocol::kStderr) {
    throw ProtocolError("OUTPUT for an unknown stream");
  }
  if (!agent.workers.count(output.pid)) {
    throw ProtocolError("OUTPUT for pid " + std::to_string(output.pid) +
                        ", which is not one of its workers");
  }
  const auto& bytes = message.blobs()[0];
  const char* data = static_cast<const char*>(bytes.data());
  if (WorkerSlot* worker = pool_->remote_worker(agent.host, output.pid)) {
    worker->output->feed(output.stream, data, bytes.size());
    return;
  }
  if (agent.early_bytes + bytes.size() > NodeAgent::kMaxEarlyOutput) {
    if (agent.dropped_bytes == 0) {
      log_.warn("{}: its workers wrote more than {} KiB before connecting; the rest is dropped",
                agent.describe(), NodeAgent::kMaxEarlyOutput / 1024);
    }
    agent.dropped_bytes += bytes.size();
    return;
  }
  agent.early_output[output.pid][static_cast<size_t>(output.stream)].append(data, bytes.size());
  agent.early_bytes += bytes.size();
}

void Controller::on_agent_exited(NodeAgent& agent, const protocol::Exited& exited) {
  if (agent.workers.erase(exited.pid) == 0) {
    throw ProtocolError("EXITED for pid " + std::to_string(exited.pid) +
                        ", which is not one of its running workers");
  }
  if (agent.waiting) return;  // ended to wait for the next attempt
  std::optional<int> code;
  if (exited.signal == 0) code = exited.code;
  if (WorkerSlot* worker = pool_->remote_worker(agent.host, exited.pid)) {
    if (!worker->exited) on_worker_exit(*worker, code, exited.signal);
    return;
  }
  // It never connected: what it wrote says why. Before the ranks are assigned
  // the run cannot start without it; after, it was one too many.
  auto early = agent.early_output.find(exited.pid);
  if (early != agent.early_output.end()) {
    WorkerOutput output(
        -1, -1, "[a worker on " + agent.host + " (pid " + std::to_string(exited.pid) + ")]",
        storage_.logs_dir() / ("worker-pid-" + std::to_string(exited.pid) + ".log"), worker_echo());
    for (int stream : {protocol::kStdout, protocol::kStderr}) {
      const auto& bytes = early->second[static_cast<size_t>(stream)];
      output.feed(stream, bytes.data(), bytes.size());
      agent.early_bytes -= bytes.size();
    }
    agent.early_output.erase(early);
  }
  auto message = "a worker on " + agent.host + " (pid " + std::to_string(exited.pid) + ") " +
                 exit_description(code, exited.signal) + " before connecting to the controller";
  if (stopping_ || assigned_) {
    log_.info("{}", message);
    return;
  }
  failures_.add(RunError{code ? FailureKind::kExit : FailureKind::kSignal, message, -1, agent.host,
                         exited.pid});
  log_.error("{}", message);
}

void Controller::on_attach(const std::string& id, const protocol::Attach& attach) {
  WorkerSlot* claimed = assigned_ ? pool_->at_rank(attach.rank) : nullptr;
  // A remote worker presents the secret its ASSIGN gave it; a local one the run's.
  const auto& expected = claimed && claimed->remote ? claimed->attach_secret : secret_;
  if (!secret_matches(attach.secret, expected)) {
    throw ProtocolError("ATTACH without this run's worker secret (rank " +
                        std::to_string(attach.rank) + ", pid " + std::to_string(attach.pid) + ")");
  }
  const bool store = attach.channel == protocol::kStoreChannel;
  const bool upload = attach.channel == protocol::kUploadChannel;
  if (!store && !upload && attach.channel != protocol::kTrainChannel) {
    throw ProtocolError("ATTACH for an unknown channel");
  }
  WorkerSlot* worker = claimed;
  if (worker == nullptr ||
      (store    ? worker->store_id
       : upload ? worker->upload_id
                : worker->train_id) ||
      worker->process.pid != attach.pid) {
    throw ProtocolError("ATTACH from an unexpected " + attach.channel.substr(0, 16) +
                        " connection (rank " + std::to_string(attach.rank) + ", pid " +
                        std::to_string(attach.pid) + ")");
  }
  if (store) {
    pool_->set_store_id(*worker, id);
  } else if (upload) {
    pool_->set_upload_id(*worker, id);
    if (auto owed = owed_uploads_.find(worker->rank); owed != owed_uploads_.end()) {
      protocol::send(router_, owed->second, {}, id);
      owed_uploads_.erase(owed);
    }
  } else {
    pool_->set_train_id(*worker, id);
  }
  worker->last_heard = Clock::now();
}

void Controller::assign_ranks() {
  std::vector<std::string> hosts;
  for (const auto& worker : pool_->workers()) hosts.push_back(worker.host);
  auto placements = trainrun::assign_ranks(hosts);
  // The attempt's group: every worker here (fewer than the most in an elastic
  // run that goes on without some).
  world_size_ = pool_->size();
  reports_ = ReportCoordinator(world_size_,
                               storage_.last_result() ? storage_.last_result()->iteration : 0);
  store_ = RendezvousStore(RendezvousStore::capacity_for(world_size_));
  attempts_.back().world_size = world_size_;
  notify_attempts();
  assigned_at_ = Clock::now();
  // An elastic group that starts without an agent's workers (they came late)
  // takes them at its next checkpoint or attempt.
  for (auto& [id, agent] : agents_) {
    if (agent.waiting || agent.workers.empty()) continue;
    bool any_here = false;
    for (int64_t pid : agent.workers) any_here = any_here || pool_->remote_worker(agent.host, pid);
    if (any_here) continue;
    agent.waiting = true;
    log_.info("{}: its workers join the group at its next checkpoint", agent.describe());
    to_agent(id, agent, protocol::Shutdown{"it joins at the next attempt", true});
  }
  std::vector<int> ranks;
  for (const auto& place : placements) ranks.push_back(place.world_rank);
  pool_->assign(ranks);
  // Where the ranks run, a line per node: a node's ranks are consecutive.
  std::vector<std::pair<int, int>> node_ranks;  // first and last rank, by node rank
  for (const auto& place : placements) {
    auto node = static_cast<size_t>(place.node_rank);
    if (node_ranks.size() <= node) node_ranks.resize(node + 1, {world_size(), -1});
    node_ranks[node].first = std::min(node_ranks[node].first, place.world_rank);
    node_ranks[node].second = std::max(node_ranks[node].second, place.world_rank);
  }
  for (size_t node = 0; node < node_ranks.size(); ++node) {
    auto [first, last] = node_ranks[node];
    log_.info("node {} ({}): ranks {}-{}", node, pool_->at_rank(first)->host, first, last);
  }
  auto config = nlohmann::json::to_msgpack(setup_.options.config);
  protocol::Assign assign;
  assign.world_size = world_size();
  assign.run_name = setup_.options.run.name;
  assign.storage_path = setup_.options.run.storage_path.string();
  assign.entry = setup_.entry;
  assign.config.assign(config.begin(), config.end());
  assign.plugin_sha256 = setup_.plugin_sha256;
  assign.plugin_size = setup_.plugin_bytes->size();
  assign.store_prefix = "trainrun/attempt-" + std::to_string(attempt_);
  // Local workers alone: Gloo on loopback. With remote ones, each worker
  // binds the address that reaches the controller (or its --interface).
  assign.bind_host = listening_.empty() ? kLocalHost : "";
  assign.heartbeat_timeout_ms = setup_.options.run.heartbeat_timeout.count();
  assign.heartbeat_interval_ms = heartbeat_interval(setup_.options.run.heartbeat_timeout).count();
  assign.collective_timeout_ms = setup_.options.run.collective_timeout.count();
  assign.checkpoint_dir = checkpoints_.resume_dir().string();
  for (auto& worker : pool_->workers()) {
    // A remote worker's own default unless the run names a thread count.
    assign.num_threads =
        worker.remote ? setup_.options.scaling.cpus_per_worker : setup_.cpus_per_worker;
    assign.fetch_checkpoint = checkpoints_.streams() || worker.remote;
    if (worker.remote) worker.attach_secret = make_secret();
    assign.attach_secret = worker.attach_secret;
    assign.storage_probe = worker.remote ? storage_probe_.string() : "";
    assign.storage_token = worker.remote ? storage_token_ : "";
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
  if (type == protocol::Heartbeat::kType) {
    auto loss = worker.main_link.settle(message.as<protocol::Heartbeat>());
    if (loss.messages > 0) {
      fail(worker, FailureKind::kLost,
           "its connection to the controller was reset, and " + std::to_string(loss.messages) +
               " of its messages were lost");
    }
    return;
  }
  if (type == protocol::FetchChunk::kType) {
    auto fetch = message.as<protocol::FetchChunk>();
    if (fetch.offset == 0) ++plugin_downloads_;
    auto [chunk, bytes] = plugin_.read(fetch);
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
  if (type == protocol::Report::kType) {
    on_report(worker, message.as<protocol::Report>());
  } else if (type == protocol::Arrive::kType) {
    on_arrive(worker, message.as<protocol::Arrive>());
  } else if (type == protocol::UploadChunk::kType) {
    on_upload_chunk(worker, message, /*upload_channel=*/false);
  } else if (type == protocol::Uploaded::kType) {
    on_uploaded(worker, message.as<protocol::Uploaded>(), /*upload_channel=*/false);
  } else if (type == protocol::FetchCheckpoint::kType) {
    on_fetch_checkpoint(worker, message.as<protocol::FetchCheckpoint>());
  } else if (type == protocol::FetchChunk::kType) {
    on_fetch_chunk(worker, message.as<protocol::FetchChunk>());
  } else if (type == protocol::Started::kType) {
    worker.started = true;
    if (std::all_of(pool_->workers().begin(), pool_->workers().end(),
                    [](const WorkerSlot& w) { return w.started; })) {
      start_standby();
    }
    worker.shares_storage = message.as<protocol::Started>().shares_storage;
    if (worker.remote && worker.shares_storage) {
      log_.info("{} shares the run directory's filesystem: it copies its checkpoints there",
                worker.describe());
    }
  } else if (type == protocol::Progress::kType) {
    on_progress(worker, message.as<protocol::Progress>());
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

void Controller::handle_store(WorkerSlot& worker, protocol::Incoming& message) {
  if (message.type() != protocol::StoreRequest::kType) {
    throw ProtocolError("unexpected message type " + message.type() +
                        " on a rendezvous store's connection");
  }
  for (auto& [rank, reply] : store_.handle(worker.rank, message.as<protocol::StoreRequest>())) {
    const WorkerSlot* to = pool_->at_rank(rank);
    if (to != nullptr && to->store_id) protocol::send(router_, reply, {}, *to->store_id);
  }
}

// Only uploads come here, and one that goes wrong ends the run: nothing else
// would end the wait for it.
void Controller::handle_upload(WorkerSlot& worker, protocol::Incoming& message) {
  const auto& type = message.type();
  try {
    if (type == protocol::UploadChunk::kType) {
      on_upload_chunk(worker, message, /*upload_channel=*/true);
    } else if (type == protocol::Uploaded::kType) {
      on_uploaded(worker, message.as<protocol::Uploaded>(), /*upload_channel=*/true);
    } else {
      throw ProtocolError("unexpected message type " + type + " on an upload connection");
    }
  } catch (const ProtocolError& e) {
    if (failures_.any() || stopping_ || regroup_) throw;
    abort_upload(worker.describe() + ": " + e.what());
  }
}

void Controller::on_report(WorkerSlot& worker, const protocol::Report& report) {
  // A failing or stopping attempt records and commits nothing more; its
  // workers are about to stop.
  if (failures_.any() || stopping_ || regroup_) return;
  nlohmann::json metrics;
  if (worker.rank == 0) {
    try {
      metrics = protocol::decode_metrics(report.metrics);
    } catch (const ProtocolError& e) {
      fail(worker, FailureKind::kUsage, std::string("reported ") + e.what());
      return;
    }
  }
  if (worker.done) {
    throw ProtocolError("REPORT after DONE");
  }
  // A checkpoint waits, its report unanswered, for the commit of the
  // asynchronous one before it.
  if (report.checkpoint && async_checkpoint_ && async_checkpoint_->released) {
    for (const auto& deferred : deferred_reports_) {
      if (deferred.first == worker.rank) throw ProtocolError("REPORT while its report waits");
    }
    deferred_reports_.emplace_back(worker.rank, report);
    return;
  }
  if (auto error = reports_.arrive(worker.rank, report.iteration, std::move(metrics))) {
    fail(worker, FailureKind::kUsage, *error);
    return;
  }
  if (report.checkpoint) {
    // This report's checkpoint is asynchronous when async_checkpoint_ exists
    // (not yet released), synchronous when something is staged without it.
    const bool async = async_checkpoint_.has_value();
    if (report.async ? checkpoints_.staging() && !async : async) {
      fail(worker, FailureKind::kUsage,
           "rank " + std::to_string(worker.rank) + " passed its checkpoint with upload mode " +
               (report.async ? "async" : "sync") + " where another rank passed " +
               (report.async ? "sync" : "async") +
               ": every rank must pass the same train::CheckpointUploadMode");
      return;
    }
    try {
      auto upload = checkpoints_.begin_upload(worker.rank, report.iteration, report.files,
                                              /*stream=*/worker.remote && !worker.shares_storage);
      if (report.async) {
        if (!async_checkpoint_) async_checkpoint_.emplace();
        send_async_upload(worker, upload);
      } else {
        to_train(worker, upload);
      }
    } catch (const UsageError& e) {
      fail(worker, FailureKind::kUsage, e.what());
      return;
    } catch (const IoError& e) {
      abort_upload(e.what());
      return;
    }
  }
  release_report();
}

void Controller::on_arrive(WorkerSlot& worker, const protocol::Arrive& arrive) {
  if (failures_.any() || stopping_ || regroup_) return;
  if (worker.done) throw ProtocolError("ARRIVE after DONE");
  if (auto error = reports_.arrive_early(worker.rank, arrive.iteration)) {
    fail(worker, FailureKind::kUsage, *error);
    return;
  }
  if (!reports_.early_complete()) {
    check_stalled();
    return;
  }
  reports_.release_early();
  for (int rank = 0; rank < world_size(); ++rank) {
    to_train(*pool_->at_rank(rank), protocol::ArriveAck{arrive.iteration});
  }
}

void Controller::send_async_upload(const WorkerSlot& worker, const protocol::Upload& upload) {
  if (worker.upload_id) {
    protocol::send(router_, upload, {}, *worker.upload_id);
  } else {
    owed_uploads_[worker.rank] = upload;
  }
}

void Controller::on_upload_chunk(WorkerSlot& worker, protocol::Incoming& message,
                                 bool upload_channel) {
  if (failures_.any() || stopping_ || regroup_) return;
  if (upload_channel != async_checkpoint_.has_value()) {
    throw ProtocolError("UPLOAD_CHUNK on the wrong connection");
  }
  // An upload that goes wrong ends: nothing else would end the wait for it.
  try {
    auto chunk = message.as<protocol::UploadChunk>();
    if (message.blobs().size() != 1) throw ProtocolError("UPLOAD_CHUNK without its bytes");
    checkpoints_.write_chunk(worker.rank, chunk, message.blobs()[0]);
  } catch (const ProtocolError& e) {
    abort_upload(worker.describe() + ": " + e.what());
    return;
  } catch (const IoError& e) {
    abort_upload(e.what());
    return;
  }
  protocol::send(router_, protocol::UploadCredit{1}, {},
                 upload_channel ? worker.upload_id : worker.train_id);
}

void Controller::on_uploaded(WorkerSlot& worker, const protocol::Uploaded& uploaded,
                             bool upload_channel) {
  if (failures_.any() || stopping_ || regroup_) return;
  if (!uploaded.error.empty()) {  // whatever the state, the worker's reason is the one to keep
    abort_upload(uploaded.error);
    return;
  }
  if (upload_channel != async_checkpoint_.has_value()) {
    throw ProtocolError("UPLOADED on the wrong connection");
  }
  try {
    checkpoints_.finish_upload(worker.rank, uploaded);
  } catch (const ProtocolError& e) {
    abort_upload(worker.describe() + ": " + e.what());
    return;
  } catch (const IoError& e) {
    abort_upload(e.what());
    return;
  }
  if (async_checkpoint_) {
    commit_async_checkpoint();
  } else {
    release_report();
  }
}

void Controller::commit_async_checkpoint() {
  if (!async_checkpoint_ || !async_checkpoint_->released || checkpoints_.uploading()) return;
  auto pending = std::move(*async_checkpoint_);
  async_checkpoint_.reset();
  std::string name;
  try {
    name = checkpoints_.commit(pending.iteration, pending.metrics);
  } catch (const IoError& e) {
    fail_storage(std::string("checkpoint commit failed: ") + e.what());
    return;
  }
  try {
    storage_.append_checkpoint(pending.iteration, name, unix_time());
  } catch (const IoError& e) {
    fail_storage(name + " is committed, but result.jsonl cannot record it: " + e.what());
    return;
  }
  log_.info("{} committed: the checkpoint of report {}, {:.1f} s after it", name, pending.iteration,
            std::chrono::duration<double>(Clock::now() - pending.reported).count());
  if (setup_.on_checkpoint) setup_.on_checkpoint(*checkpoints_.latest());
  maybe_regroup(name);
  // The reports with a checkpoint that waited for this commit.
  auto deferred = std::move(deferred_reports_);
  deferred_reports_.clear();
  for (const auto& [rank, report] : deferred) {
    WorkerSlot* worker = pool_->at_rank(rank);
    if (worker == nullptr) continue;
    try {
      on_report(*worker, report);
    } catch (const ProtocolError& e) {
      log_.warn("dropped a message from {}: {}", worker->describe(), e.what());
    }
  }
}

// The worker waits for every answer here, so whatever goes wrong fails the run
// rather than leaving it waiting.
void Controller::on_fetch_checkpoint(WorkerSlot& worker, const protocol::FetchCheckpoint& fetch) {
  try {
    to_train(worker, checkpoints_.listing(fetch));
  } catch (const IoError& e) {
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
  } catch (const IoError& e) {
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

void Controller::on_progress(const WorkerSlot& worker, const protocol::Progress& progress) {
  constexpr int64_t kMost = int64_t{1} << 50;  // beyond any real count; keeps the arithmetic safe
  auto in = [&](int64_t v) { return v >= 0 && v <= kMost; };
  if (!in(progress.epoch) || !in(progress.batch) || !in(progress.batches) || !in(progress.steps) ||
      !in(progress.samples)) {
    throw ProtocolError("PROGRESS with counts out of range");
  }
  if (worker.rank != 0 || !setup_.on_progress || failures_.any() || stopping_) return;
  ProgressSample sample{attempt_,         world_size(),   progress.epoch,  progress.batch,
                        progress.batches, progress.steps, progress.samples};
  // A sampler that yields more than the loader counted: the epoch is done.
  if (sample.batches > 0) sample.batch = std::min(sample.batch, sample.batches);
  // At most one every kProgressGap. An epoch's end passes too, so the display
  // shows it complete, once (the worker already spaces them; messages can
  // arrive bunched), and never more than kProgressEnds a second.
  const auto now = Clock::now();
  const bool epoch_end = sample.batches > 0 && sample.batch == sample.batches;
  if (epoch_end) {
    if (sample.steps == progress_end_steps_ || !progress_ends_.allow(now)) return;
    progress_end_steps_ = sample.steps;
  } else if (now - progress_passed_ < kProgressGap) {
    return;
  }
  progress_passed_ = now;
  setup_.on_progress(sample);
}

// Once every rank has reported and every checkpoint file is in, the report is
// committed, acknowledged and recorded.
void Controller::release_report() {
  if (!reports_.complete()) {
    check_stalled();
    return;
  }
  // A synchronous checkpoint is committed before the report is released; an
  // asynchronous one (what is staged belongs to it) afterwards.
  if (!async_checkpoint_ && checkpoints_.uploading()) return;
  auto record = reports_.release();
  const bool async = async_checkpoint_ && !async_checkpoint_->released;
  if (async) {
    *async_checkpoint_ = {true, record.iteration, record.metrics, Clock::now()};
  } else if (!async_checkpoint_) {
    try {
      record.checkpoint = checkpoints_.commit(record.iteration, record.metrics);
    } catch (const IoError& e) {
      fail_storage(std::string("checkpoint commit failed: ") + e.what());
      return;
    }
  }
  record.timestamp = unix_time();  // includes a synchronous checkpoint's commit
  record.time_total_s = earlier_seconds_ + elapsed();
  record.attempt = attempt_;
  // The ranks go on while the report is recorded: its checkpoint, if any, is
  // committed, and this loop records it before it reads another message.
  for (int rank = 0; rank < world_size(); ++rank) {
    to_train(*pool_->at_rank(rank), protocol::ReportAck{reports_.iteration() - 1});
  }
  try {
    storage_.append_result(record);
    ++reported_this_attempt_;
    if (setup_.on_report) setup_.on_report(record);
  } catch (const IoError& e) {  // a full disk: what was recorded before stays
    fail_storage(std::string("cannot record a report: ") + e.what());
    return;
  }
  log_.info("report {} ({:.1f} s): {}{}", record.iteration, record.time_total_s,
            format_metrics(record.metrics),
            async                       ? " (its checkpoint uploads)"
            : record.checkpoint.empty() ? ""
                                        : " -> " + record.checkpoint);
  if (async) {
    commit_async_checkpoint();  // when every upload was already in
  } else if (!record.checkpoint.empty()) {
    if (setup_.on_checkpoint) setup_.on_checkpoint(*checkpoints_.latest());
    maybe_regroup(record.checkpoint);
  }
}

void Controller::maybe_regroup(const std::string& checkpoint) {
  if (!checkpoint.empty() && world_size_ < max_workers() &&
      std::any_of(agents_.begin(), agents_.end(),
                  [](const auto& entry) { return entry.second.waiting; })) {
    regroup_ = true;
  }
}

void Controller::check_stalled() {
  if (auto stalled = reports_.stalled()) {
    fail(*pool_->at_rank(stalled->first), FailureKind::kUsage, stalled->second);
  }
}

}  // namespace trainrun

// Node agents (`trainrun worker --nproc N`): which are admitted and when,
// the workers each announces, their output and exits as it reports them, and
// what the run keeps of them from one attempt to the next.

#include <trainrun/error.h>

#include "common/constants.h"
#include "controller/controller.h"

namespace trainrun {

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
  const bool assigned = attempt_->assigned();
  const bool waits = between_attempts() || (assigned && !stopping() && elastic());
  if ((stopping() && !between_attempts()) || (assigned && !waits) ||
      agents_.size() >= static_cast<size_t>(max_workers())) {
    throw ProtocolError("the run has all its " + std::to_string(max_workers()) + " workers");
  }
  NodeAgent agent;
  agent.host = hello.host.substr(0, 255);
  agent.pid = hello.pid;
  agent.last_heard = now();
  agent.link.received(protocol::AgentHello::kType);
  if (waits || attempt_->number > 1) {
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
      if (!agent.workers.insert(pid).second ||
          attempt_->claimed.count(process_key(agent.host, pid))) {
        throw ProtocolError("AGENT claims pid " + std::to_string(pid) + " twice");
      }
    }
    for (int64_t pid : hello.workers) attempt_->claimed.insert(process_key(agent.host, pid));
    attempt_->agent_claims += static_cast<int>(hello.workers.size());
    agent.nproc = static_cast<int>(hello.workers.size());
    agent.waiting = true;
    log_.info("{} joined with {} workers: they join the group at its next {}", agent.describe(),
              agent.workers.size(), assigned && !stopping() ? "checkpoint" : "attempt");
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
  int room = max_workers() - setup_.options.scaling.local_workers - attempt_->agent_claims;
  const auto now = this->now();
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
  const int room = alone - attempt_->agent_claims;
  if (hello.workers.size() > static_cast<size_t>(alone)) {  // it could never fit: the user's to fix
    auto message = agent.describe() + " started " + std::to_string(hello.workers.size()) +
                   " workers, but the run has room for " + std::to_string(alone) +
                   " (--num-workers " + std::to_string(max_workers()) + ")";
    record_failure(RunError{FailureKind::kUsage, message, -1, agent.host, agent.pid});
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
    if (!pids.insert(pid).second || attempt_->claimed.count(process_key(agent.host, pid))) {
      throw ProtocolError("AGENT claims pid " + std::to_string(pid) + " twice");
    }
  }
  for (int64_t pid : hello.workers) attempt_->claimed.insert(process_key(agent.host, pid));
  agent.workers = std::move(pids);
  agent.nproc = static_cast<int>(agent.workers.size());
  agent.announced = true;
  attempt_->agent_claims += static_cast<int>(hello.workers.size());
  log_.info("{} started {} workers", agent.describe(), agent.workers.size());
  if (!hello.error.empty()) {
    auto message =
        agent.describe() + " could not start its workers: " + hello.error.substr(0, 1024);
    record_failure(RunError{FailureKind::kSetup, message, -1, agent.host, agent.pid});
    log_.error("{}", message);
  }
}

void Controller::handle_agent(NodeAgent& agent, protocol::Incoming& message) {
  agent.last_heard = now();
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
    if (attempt_->assigned() || stopping() || !agent.workers.empty() || attempt_->number < 2 ||
        hello.attempt != attempt_->number) {
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
  if (stopping()) return;
  auto message = agent.describe() + ": " + reason;
  record_failure(RunError{FailureKind::kLost, message, -1, agent.host, agent.pid});
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
  if (WorkerSlot* worker = pool().remote_worker(agent.host, output.pid)) {
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
  if (WorkerSlot* worker = pool().remote_worker(agent.host, exited.pid)) {
    if (!worker->exited) on_worker_exit(*worker, code, exited.signal);
    return;
  }
  // It never connected: what it wrote says why. Before the ranks are assigned
  // the run cannot start without it; after, it was one too many.
  auto early = agent.early_output.find(exited.pid);
  if (early != agent.early_output.end()) {
    WorkerOutput output(
        Fd(), Fd(), "[a worker on " + agent.host + " (pid " + std::to_string(exited.pid) + ")]",
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
  if (stopping() || attempt_->assigned()) {
    log_.info("{}", message);
    return;
  }
  record_failure(RunError{code ? FailureKind::kExit : FailureKind::kSignal, message, -1, agent.host,
                          exited.pid});
  log_.error("{}", message);
}

// What a remote worker wrote before it connected, if its node agent forwarded any.
void Controller::hand_over_early_output(WorkerSlot& worker, int64_t pid) {
  for (auto& [agent_id, agent] : agents_) {
    auto early = agent.early_output.find(pid);
    if (agent.host != worker.host || early == agent.early_output.end()) continue;
    for (int stream : {protocol::kStdout, protocol::kStderr}) {
      const auto& bytes = early->second[static_cast<size_t>(stream)];
      worker.output->feed(stream, bytes.data(), bytes.size());
      agent.early_bytes -= bytes.size();
    }
    agent.early_output.erase(early);
  }
}

// An agent that fell silent is gone with its node: the next attempt goes on
// without it (the run's startup timeout waits for workers to replace it). The
// others forget the last attempt's workers and wait for RESTART.
void Controller::carry_over_agents() {
  auto now = this->now();
  for (auto it = agents_.begin(); it != agents_.end();) {
    auto& agent = it->second;
    if (now - agent.last_heard > agent_silence_limit()) {
      log_.warn("{} is gone: the next attempt goes on without it", agent.describe());
      to_agent(it->first, agent, protocol::Shutdown{"it fell silent", false});
      it = agents_.erase(it);
      continue;
    }
    agent.workers.clear();
    agent.announced = agent.waiting = false;  // a waiting one is this attempt's
    agent.early_output.clear();
    agent.early_bytes = 0;
    ++it;
  }
}

// An agent that missed two of its heartbeats (one a second) is gone, or cut
// off: its workers' exits will not come.
bool Controller::agents_done() const {
  auto now = this->now();
  return std::all_of(agents_.begin(), agents_.end(), [&](const auto& entry) {
    return entry.second.workers.empty() || now - entry.second.last_heard > 2 * kHeartbeatInterval;
  });
}

std::chrono::milliseconds Controller::agent_silence_limit() const {
  const auto timeout = setup_.options.run.heartbeat_timeout;
  return std::max<std::chrono::milliseconds>(2 * heartbeat_interval(timeout), timeout / 2);
}

}  // namespace trainrun

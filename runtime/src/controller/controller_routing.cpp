// Dispatch: which peer a message came from and on which of its connections.
// A message from a new connection must be a HELLO, an ATTACH or an AGENT; one
// from a known worker goes to the handler for its connection (main, train,
// store or upload), one from a node agent to controller_agents.cpp. Handlers
// hand it to the part whose job it is and send the answer. A part's IoError is
// a storage failure of the run; its ProtocolError (a request this peer had no
// business making) reaches on_router_readable, which drops the message with a
// log line.

#include <trainrun/error.h>

#include "common/crash_report.h"
#include "controller/controller.h"

namespace trainrun {
namespace {

// The kind a worker's FAILED names: what a worker can know of itself (an
// exception, a plugin or setup error, messages of its connection lost); a
// claim to be a crash or an interrupt, which would outrank the real cause, is
// not taken.
FailureKind worker_failure_kind(const std::string& name, FailureKind otherwise) {
  auto kind = parse_failure_kind(name);
  if (kind == FailureKind::kException || kind == FailureKind::kPlugin ||
      kind == FailureKind::kSetup || kind == FailureKind::kLost) {
    return *kind;
  }
  return otherwise;
}

}  // namespace

bool Controller::on_router_readable() {
  auto frames = protocol::recv_frames(router_, true);
  if (frames.empty()) return false;
  if (frames.size() < 2) return true;
  std::string id = frames[0].to_string();
  frames.erase(frames.begin());
  WorkerSlot* worker = pool().by_connection(id);
  NodeAgent* agent = nullptr;
  if (worker == nullptr && standby_) {
    if (WorkerSlot* waiting = standby_->by_connection(id)) {  // it waits for the next attempt
      waiting->last_heard = now();
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
    // A rank the group went on without: what it sent before it died (a
    // report, an arrival, a store request) must not count for the others.
    if (worker->departed) return true;
    worker->last_heard = now();
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
    if (dropped_.allow(now())) {
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
  WorkerSlot* worker = pool().at_index(hello.index);
  if (standby_ && (worker == nullptr || worker->process.pid != hello.pid)) {
    WorkerSlot* waiting = standby_->at_index(hello.index);
    if (waiting != nullptr && !waiting->main_id && waiting->process.pid == hello.pid) {
      standby_->set_main_id(*waiting, id);
      waiting->main_link.received(protocol::Hello::kType);
      waiting->host = hello.host;
      waiting->last_heard = now();
      return;  // it waits: the next attempt's HELLO
    }
  }
  if (worker == nullptr || worker->main_id || worker->process.pid != hello.pid) {
    throw ProtocolError("HELLO from an unexpected worker (index " + std::to_string(hello.index) +
                        ", pid " + std::to_string(hello.pid) + ")");
  }
  pool().set_main_id(*worker, id);
  worker->main_link.received(protocol::Hello::kType);
  worker->host = hello.host;
  worker->last_heard = now();
  if (pending_replacement(*worker)) {  // the group trains: it joins it
    pool().rename(*worker);
    assign_replacement(*worker);
    return;
  }
  ++attempt_->hellos;
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
  if (hello.attempt > 0 && hello.attempt != attempt_->number) {
    // Started by its agent for an attempt that ended before it connected.
    protocol::send(router_, protocol::Shutdown{"its attempt is over", true}, {}, id);
    return;
  }
  if (attempt_->assigned() || stopping()) {
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
  WorkerSlot* worker = pool().add_remote(hello.host.substr(0, 255), static_cast<pid_t>(hello.pid));
  if (worker == nullptr) {
    throw ProtocolError("the run has all its " + std::to_string(max_workers()) + " workers");
  }
  pool().set_main_id(*worker, id);
  worker->main_link.received(protocol::Hello::kType);
  worker->last_heard = now();
  log_.info("a worker on {} (pid {}) connected", worker->host, worker->process.pid);
  hand_over_early_output(*worker, hello.pid);
  ++attempt_->hellos;
  maybe_assign();
}

void Controller::on_attach(const std::string& id, const protocol::Attach& attach) {
  WorkerSlot* claimed = attempt_->assigned() ? pool().at_rank(attach.rank) : nullptr;
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
    pool().set_store_id(*worker, id);
  } else if (upload) {
    pool().set_upload_id(*worker, id);
    auto& owed = attempt_->owed_uploads;
    if (auto owed_upload = owed.find(worker->rank); owed_upload != owed.end()) {
      protocol::send(router_, owed_upload->second, {}, id);
      owed.erase(owed_upload);
    }
  } else {
    pool().set_train_id(*worker, id);
  }
  worker->last_heard = now();
  if (worker->in_process() && stopping() && !store) tell_in_process_threads(*worker);
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
    if (fetch.offset == 0) ++attempt_->plugin_downloads;
    auto [chunk, bytes] = plugin_.read(fetch);
    std::vector<zmq::message_t> blob;
    blob.push_back(std::move(bytes));
    to_main(worker, chunk, std::move(blob));
  } else if (type == protocol::StacksReply::kType) {
    on_stacks_reply(worker, message.as<protocol::StacksReply>());
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
  } else if (type == protocol::StepVote::kType) {
    on_step_vote(worker, message.as<protocol::StepVote>());
  } else if (type == protocol::GroupTaken::kType) {
    if (attempt_->group_taken_by < 0) attempt_->group_taken_by = worker.rank;
  } else if (type == protocol::Joinable::kType) {
    on_joinable(worker, message.as<protocol::Joinable>().joinable);
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
    if (std::all_of(pool().workers().begin(), pool().workers().end(),
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
    // An in-process train function told to stop (tell_in_process_threads)
    // raised from report(): what the stop did, not news.
    if (worker.in_process() && stopping() && failed.kind == to_string(FailureKind::kInterrupted)) {
      return;
    }
    auto kind = worker_failure_kind(failed.kind, FailureKind::kException);
    if (kind != FailureKind::kException) {
      fail(worker, kind, failed.message);
      return;
    }
    // Where it was thrown, before the message, which stays whole ("raised in
    // f at x.cpp:12: boom"); as many frames as a crash's.
    if (failed.stack.size() > kMaxFrames) failed.stack.resize(kMaxFrames);
    for (auto& frame : failed.stack) frame = frame.substr(0, kMaxFrameText);
    const auto place = innermost_place(failed.stack, setup_.options.plugin.filename().string());
    fail(worker, kind, "raised" + (place.empty() ? "" : " " + place) + ": " + failed.message,
         std::move(failed.stack));
  } else {
    throw ProtocolError("unexpected message type " + type + " on a train thread's connection");
  }
}

void Controller::handle_store(WorkerSlot& worker, protocol::Incoming& message) {
  if (message.type() != protocol::StoreRequest::kType) {
    throw ProtocolError("unexpected message type " + message.type() +
                        " on a rendezvous store's connection");
  }
  for (auto& [rank, reply] :
       attempt_->store.handle(worker.rank, message.as<protocol::StoreRequest>())) {
    const WorkerSlot* to = pool().at_rank(rank);
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
    if (!records()) throw;
    abort_upload(worker.describe() + ": " + e.what());
  }
}

}  // namespace trainrun

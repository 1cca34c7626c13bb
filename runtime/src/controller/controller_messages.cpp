// The controller's message handlers: hello and rank assignment, plugin
// chunks, the store address, the report barrier and its results, done and
// failed.

#include <trainrun/error.h>

#include "common/constants.h"
#include "controller/controller_state.h"
#include "controller/rank_assignment.h"

namespace trainrun {

void Controller::State::on_router_readable() {
  auto frames = protocol::recv_frames(router, true);
  if (frames.size() < 2) return;
  std::string id = frames[0].to_string();
  frames.erase(frames.begin());
  Slot* slot = slot_by_routing_id(id);
  try {
    auto message = protocol::Incoming::parse(std::move(frames));
    if (slot == nullptr) {
      on_hello(id, message);
      return;
    }
    slot->last_heard = Clock::now();
    handle(*slot, message);
  } catch (const ProtocolError& e) {
    if (slot == nullptr) {
      protocol::send(router, protocol::Refused{e.what()}, {}, id);
    }
    log.warn("dropped a message from {}: {}", slot ? slot->describe() : "an unknown peer",
             e.what());
  }
}

void Controller::State::on_hello(const std::string& id, const protocol::Incoming& message) {
  if (message.type() != protocol::Hello::kType) {
    throw ProtocolError("expected HELLO from a new peer, got " + message.type());
  }
  auto hello = message.as<protocol::Hello>();
  if (hello.index < 0 || hello.index >= world_size() ||
      slots[static_cast<size_t>(hello.index)].routing_id ||
      slots[static_cast<size_t>(hello.index)].process.pid != hello.pid) {
    throw ProtocolError("HELLO from an unexpected worker (index " + std::to_string(hello.index) +
                        ", pid " + std::to_string(hello.pid) + ")");
  }
  auto& slot = slots[static_cast<size_t>(hello.index)];
  slot.routing_id = id;
  slot.host = hello.host;
  slot.last_heard = Clock::now();
  bool all = std::all_of(slots.begin(), slots.end(), [](const Slot& s) { return s.routing_id; });
  if (all) assign_ranks();
}

void Controller::State::assign_ranks() {
  std::vector<std::string> hosts;
  for (const auto& slot : slots) hosts.push_back(slot.host);
  auto placements = trainrun::assign_ranks(hosts);
  auto config = nlohmann::json::to_msgpack(setup.options.config);
  by_rank.assign(slots.size(), nullptr);
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& slot = slots[i];
    const Placement& place = placements[i];
    slot.rank = place.world_rank;
    by_rank[static_cast<size_t>(slot.rank)] = &slot;
    slot.output->set_prefix(prefix(slot));
    protocol::Assign assign;
    assign.world_rank = place.world_rank;
    assign.local_rank = place.local_rank;
    assign.node_rank = place.node_rank;
    assign.world_size = world_size();
    assign.local_world_size = place.local_world_size;
    assign.run_name = setup.options.run.name;
    assign.storage_path = setup.options.run.storage_path.string();
    assign.entry = setup.entry;
    assign.config.assign(config.begin(), config.end());
    assign.plugin_sha256 = setup.plugin_sha256;
    assign.plugin_size = setup.plugin_bytes.size();
    assign.store_host = kLocalHost;
    assign.store_prefix = "trainrun/attempt-0";
    assign.bind_host = kLocalHost;
    assign.num_threads = setup.cpus_per_worker;
    assign.device =
        setup.options.scaling.use_gpu ? "cuda:" + std::to_string(place.local_rank) : "cpu";
    assign.heartbeat_timeout_ms = setup.options.run.heartbeat_timeout.count();
    if (auto latest = checkpoints.latest()) {
      assign.checkpoint_dir = latest->dir.string();
    } else {
      assign.checkpoint_dir = setup.options.run.resume_from.string();
    }
    protocol::send(router, assign, {}, slot.routing_id);
  }
  assigned = true;
}

void Controller::State::handle(Slot& slot, protocol::Incoming& message) {
  const auto& type = message.type();
  if (type == protocol::Heartbeat::kType) return;
  if (type == protocol::FetchPlugin::kType) {
    auto fetch = message.as<protocol::FetchPlugin>();
    const auto& bytes = setup.plugin_bytes;
    if (fetch.offset > bytes.size() || fetch.length > kPluginChunkSize ||
        fetch.length > bytes.size() - fetch.offset) {
      throw ProtocolError("FETCH_PLUGIN out of range (offset " + std::to_string(fetch.offset) +
                          ", length " + std::to_string(fetch.length) + ")");
    }
    std::vector<zmq::message_t> blob;
    blob.emplace_back(bytes.data() + fetch.offset, fetch.length);
    protocol::send(router, protocol::PluginChunk{fetch.offset}, std::move(blob), slot.routing_id);
  } else if (type == protocol::StoreReady::kType && slot.rank == 0) {
    protocol::StoreAddress address{kLocalHost, message.as<protocol::StoreReady>().port};
    for (auto* s : by_rank) {
      if (s->rank != 0) protocol::send(router, address, {}, s->routing_id);
    }
  } else if (type == protocol::Report::kType) {
    on_report(slot, message.as<protocol::Report>());
  } else if (type == protocol::Done::kType) {
    slot.done = true;
    check_report_counts();
  } else if (type == protocol::Failed::kType) {
    auto failed = message.as<protocol::Failed>();
    auto text = failed.kind == "exception" ? "raised: " + failed.message : failed.message;
    fail(slot, failed.kind, text);
  } else {
    throw ProtocolError("unknown message type " + type);
  }
}

void Controller::State::on_report(Slot& slot, const protocol::Report& report) {
  // A failing run records and commits nothing more; its workers are about to stop.
  if (failures.any()) return;
  nlohmann::json metrics;
  if (slot.rank == 0) {
    try {
      metrics = nlohmann::json::from_msgpack(report.metrics);
    } catch (const nlohmann::json::exception& e) {
      throw ProtocolError(std::string("REPORT with malformed metrics: ") + e.what());
    }
  }
  if (auto error = barrier.arrive(slot.rank, report.iteration, std::move(metrics))) {
    fail(slot, "usage", *error);
    return;
  }
  if (!report.checkpoint_dir.empty()) {
    try {
      checkpoints.stage(slot.rank, report.checkpoint_dir);
    } catch (const UsageError& e) {
      fail(slot, "usage", e.what());
      return;
    } catch (const IoError& e) {
      fail(slot, "storage", e.what());
      return;
    }
  }
  if (!barrier.complete()) {
    check_report_counts();
    return;
  }
  int64_t iteration = barrier.iteration();
  auto rank0_metrics = barrier.release();
  std::string checkpoint;
  if (checkpoints.staging()) {
    try {
      checkpoint = checkpoints.commit(iteration_offset + iteration, rank0_metrics).name;
    } catch (const IoError& e) {
      // Earlier checkpoints are intact; the run cannot go on without this one.
      failures.add(
          RunError{"storage", std::string("checkpoint commit failed: ") + e.what(), -1, "", 0});
      log.error("checkpoint commit failed: {}", e.what());
      return;
    }
  }
  record(iteration_offset + iteration, std::move(rank0_metrics), checkpoint);
  for (auto* s : by_rank) {
    protocol::send(router, protocol::ReportAck{iteration}, {}, s->routing_id);
  }
}

void Controller::State::record(int64_t iteration, nlohmann::json metrics,
                               const std::string& checkpoint) {
  double elapsed = seconds_since(start);
  auto timestamp =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  nlohmann::json entry = {{"iteration", iteration},
                          {"timestamp", timestamp},
                          {"time_total_s", elapsed},
                          {"metrics", metrics}};
  if (!checkpoint.empty()) entry["checkpoint"] = checkpoint;
  storage.append_result(entry);
  log.info("report {} ({:.1f} s): {}{}", iteration, elapsed, format_metrics(metrics),
           checkpoint.empty() ? "" : " -> " + checkpoint);
}

// A rank that returns while others wait in report() would leave them waiting
// forever: every rank must report the same number of times.
void Controller::State::check_report_counts() {
  Slot* finished = nullptr;
  Slot* waiting = nullptr;
  for (auto* s : by_rank) {
    if (s->done) {
      finished = s;
    } else if (barrier.waiting(s->rank)) {
      waiting = s;
    } else {
      return;  // someone is still training
    }
  }
  if (finished != nullptr && waiting != nullptr) {
    fail(*finished, "usage",
         "returned from train_func after " + std::to_string(barrier.iteration() - 1) +
             " reports while rank " + std::to_string(waiting->rank) + " waits in report " +
             std::to_string(barrier.iteration()) +
             ": every rank must call train::report the same number of times");
  }
}

}  // namespace trainrun

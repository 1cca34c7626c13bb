// The controller's message handlers: hello and rank assignment, plugin
// chunks, the store address, the report barrier, checkpoint uploads and
// downloads, results, done and failed.

#include <trainrun/error.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/atomic_file.h"
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
      on_new_peer(id, message);
      return;
    }
    slot->last_heard = Clock::now();
    if (slot->train_id == id) {
      handle_train(*slot, message);
    } else {
      handle_main(*slot, message);
    }
  } catch (const ProtocolError& e) {
    if (slot == nullptr) {
      protocol::send(router, protocol::Refused{e.what()}, {}, id);
    }
    log.warn("dropped a message from {}: {}", slot ? slot->describe() : "an unknown peer",
             e.what());
  }
}

void Controller::State::on_new_peer(const std::string& id, const protocol::Incoming& message) {
  if (message.type() == protocol::Hello::kType) {
    on_hello(id, message.as<protocol::Hello>());
  } else if (message.type() == protocol::Attach::kType) {
    on_attach(id, message.as<protocol::Attach>());
  } else {
    throw ProtocolError("expected HELLO or ATTACH from a new peer, got " + message.type());
  }
}

void Controller::State::on_hello(const std::string& id, const protocol::Hello& hello) {
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

void Controller::State::on_attach(const std::string& id, const protocol::Attach& attach) {
  Slot* slot = assigned && attach.rank >= 0 && attach.rank < world_size()
                   ? by_rank[static_cast<size_t>(attach.rank)]
                   : nullptr;
  if (slot == nullptr || slot->train_id || slot->process.pid != attach.pid) {
    throw ProtocolError("ATTACH from an unexpected train thread (rank " +
                        std::to_string(attach.rank) + ", pid " + std::to_string(attach.pid) + ")");
  }
  slot->train_id = id;
  slot->last_heard = Clock::now();
  if (store_address && slot->rank != 0) to_train(*slot, *store_address);
}

void Controller::State::assign_ranks() {
  std::vector<std::string> hosts;
  for (const auto& slot : slots) hosts.push_back(slot.host);
  auto placements = trainrun::assign_ranks(hosts);
  auto config = nlohmann::json::to_msgpack(setup.options.config);
  by_rank.assign(slots.size(), nullptr);
  if (auto latest = checkpoints.latest()) {
    resume_dir = latest->dir;
  } else {
    resume_dir = setup.options.run.resume_from;
  }
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
    assign.checkpoint_dir = resume_dir.string();
    assign.fetch_checkpoint = streams_checkpoints(slot);
    protocol::send(router, assign, {}, slot.routing_id);
  }
  assigned = true;
}

void Controller::State::handle_main(Slot& slot, protocol::Incoming& message) {
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
  } else if (type == protocol::Failed::kType) {  // before its train thread could start
    on_failed(slot, message.as<protocol::Failed>());
  } else {
    throw ProtocolError("unexpected message type " + type + " on a worker's main connection");
  }
}

void Controller::State::handle_train(Slot& slot, protocol::Incoming& message) {
  const auto& type = message.type();
  if (type == protocol::StoreReady::kType && slot.rank == 0) {
    store_address = protocol::StoreAddress{kLocalHost, message.as<protocol::StoreReady>().port};
    for (auto* s : by_rank) {
      if (s->rank != 0 && s->train_id) to_train(*s, *store_address);
    }
  } else if (type == protocol::Report::kType) {
    on_report(slot, message.as<protocol::Report>());
  } else if (type == protocol::UploadChunk::kType) {
    on_upload_chunk(slot, message);
  } else if (type == protocol::Uploaded::kType) {
    on_uploaded(slot, message.as<protocol::Uploaded>());
  } else if (type == protocol::FetchCheckpoint::kType) {
    on_fetch_checkpoint(slot, message.as<protocol::FetchCheckpoint>());
  } else if (type == protocol::FetchCheckpointChunk::kType) {
    on_fetch_checkpoint_chunk(slot, message.as<protocol::FetchCheckpointChunk>());
  } else if (type == protocol::Done::kType) {
    slot.done = true;
    check_report_counts();
  } else if (type == protocol::Failed::kType) {
    on_failed(slot, message.as<protocol::Failed>());
  } else {
    throw ProtocolError("unexpected message type " + type + " on a train thread's connection");
  }
}

void Controller::State::on_failed(Slot& slot, const protocol::Failed& failed) {
  fail(slot, failed.kind,
       failed.kind == "exception" ? "raised: " + failed.message : failed.message);
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
  if (report.checkpoint) {
    bool stream = streams_checkpoints(slot);
    try {
      auto staging = checkpoints.begin_upload(slot.rank, report.files, stream);
      protocol::Upload upload{report.iteration, stream ? "" : staging.string(), kCheckpointCredit};
      to_train(slot, upload);
    } catch (const UsageError& e) {
      fail(slot, "usage", e.what());
      return;
    } catch (const Error& e) {
      abort_upload(e.what());
      return;
    }
  }
  release_report();
}

void Controller::State::on_upload_chunk(Slot& slot, protocol::Incoming& message) {
  if (failures.any()) return;
  auto chunk = message.as<protocol::UploadChunk>();
  if (message.blobs().size() != 1) throw ProtocolError("UPLOAD_CHUNK without its bytes");
  const auto& bytes = message.blobs()[0];
  try {
    checkpoints.write_chunk(slot.rank, chunk.file, chunk.offset, bytes.data(), bytes.size());
  } catch (const Error& e) {
    abort_upload(e.what());
    return;
  }
  to_train(slot, protocol::UploadCredit{1});
}

void Controller::State::on_uploaded(Slot& slot, const protocol::Uploaded& uploaded) {
  if (failures.any()) return;
  try {
    if (!uploaded.error.empty()) throw IoError(uploaded.error);
    checkpoints.finish_upload(slot.rank, uploaded.files);
  } catch (const Error& e) {
    abort_upload(e.what());
    return;
  }
  release_report();
}

void Controller::State::abort_upload(const std::string& message) {
  checkpoints.abort_staging();
  // Earlier checkpoints are intact; the run cannot go on without this one.
  fail_storage("checkpoint upload failed: " + message);
}

void Controller::State::fail_storage(const std::string& message) {
  failures.add(RunError{"storage", message, -1, "", 0});
  log.error("{}", message);
}

// Once every rank has reported and every checkpoint file is in, the report is
// committed, acknowledged and recorded.
void Controller::State::release_report() {
  if (!barrier.complete()) {
    check_report_counts();
    return;
  }
  if (checkpoints.uploading()) return;
  int64_t iteration = barrier.iteration();
  auto rank0_metrics = barrier.release();
  std::string checkpoint;
  if (checkpoints.staging()) {
    try {
      checkpoint = checkpoints.commit(iteration_offset + iteration, rank0_metrics).name;
    } catch (const IoError& e) {
      fail_storage(std::string("checkpoint commit failed: ") + e.what());
      return;
    }
  }
  // The ranks go on while the report is recorded: its checkpoint, if any, is
  // committed, and this loop records it before it reads another message.
  for (auto* s : by_rank) {
    to_train(*s, protocol::ReportAck{iteration});
  }
  try {
    record(iteration_offset + iteration, std::move(rank0_metrics), checkpoint);
  } catch (const IoError& e) {  // a full disk: what was recorded before stays
    fail_storage(std::string("cannot record a report: ") + e.what());
  }
}

// The worker waits for every answer here, so whatever goes wrong fails the run
// rather than leaving it waiting.
void Controller::State::on_fetch_checkpoint(Slot& slot, const protocol::FetchCheckpoint& fetch) {
  protocol::CheckpointListing listing;
  try {
    if (fetch.checkpoint_dir != resume_dir.string()) {
      throw ProtocolError("FETCH_CHECKPOINT of " + fetch.checkpoint_dir +
                          ", which it was not given");
    }
    if (!resume_dir.empty()) {
      listing.name = resume_dir.filename().string();
      listing.files = read_manifest_files(resume_dir);
    }
  } catch (const std::exception& e) {
    fail(slot, "storage", std::string("cannot send the checkpoint to resume from: ") + e.what());
    return;
  }
  resume_files = listing.files;
  to_train(slot, listing);
}

void Controller::State::on_fetch_checkpoint_chunk(Slot& slot,
                                                  const protocol::FetchCheckpointChunk& fetch) {
  if (fetch.file >= resume_files.size() || fetch.length > kCheckpointChunkSize ||
      fetch.offset > resume_files[fetch.file].size ||
      fetch.length > resume_files[fetch.file].size - fetch.offset) {
    fail(slot, "storage", "asked for a checkpoint chunk out of range");
    return;
  }
  auto path = resume_dir / resume_files[fetch.file].path;
  std::vector<zmq::message_t> blob;
  blob.emplace_back(fetch.length);
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ssize_t n = fd.get() < 0 ? -1
                           : ::pread(fd.get(), blob[0].data(), fetch.length,
                                     static_cast<off_t>(fetch.offset));
  int saved = errno;
  if (n != static_cast<ssize_t>(fetch.length)) {
    // The worker verifies what it fetched; a short read would only fail there later.
    fail(slot, "storage",
         "cannot read checkpoint file " + path.string() + ": " +
             (n < 0 ? std::strerror(saved) : "it is shorter than its manifest says"));
    return;
  }
  to_train(slot, protocol::CheckpointChunk{fetch.file, fetch.offset}, std::move(blob));
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

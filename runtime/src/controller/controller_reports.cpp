// Reports: the barrier every rank's train::report meets at, the records it
// leaves (result.jsonl and the host's on_report), rank 0's progress, a rank's
// DONE, and how a rank that stops reporting early is named.

#include <trainrun/error.h>

#include "common/metrics_format.h"
#include "controller/controller.h"

namespace trainrun {

void Controller::on_report(WorkerSlot& worker, const protocol::Report& report) {
  // A failing or stopping attempt records and commits nothing more; its
  // workers are about to stop.
  if (!records()) return;
  nlohmann::json metrics;
  // Rank 0's are recorded; in place, while rank 0 is being replaced, the
  // lowest rank's that reported, so every rank's are kept at hand.
  if (worker.rank == 0 || setup_.options.failure.in_place) {
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
  auto& attempt = *attempt_;
  if (report.checkpoint && attempt.async_checkpoint && attempt.async_checkpoint->released) {
    for (const auto& deferred : attempt.deferred_reports) {
      if (deferred.first == worker.rank) throw ProtocolError("REPORT while its report waits");
    }
    attempt.deferred_reports.emplace_back(worker.rank, report);
    return;
  }
  if (auto error = attempt.reports.arrive(worker.rank, report.iteration, std::move(metrics))) {
    fail(worker, FailureKind::kUsage, *error);
    return;
  }
  if (report.checkpoint && !begin_upload(worker, report)) return;
  release_report();
}

void Controller::on_arrive(WorkerSlot& worker, const protocol::Arrive& arrive) {
  if (!records()) return;
  if (worker.done) throw ProtocolError("ARRIVE after DONE");
  auto& reports = attempt_->reports;
  if (auto error = reports.arrive_early(worker.rank, arrive.iteration)) {
    fail(worker, FailureKind::kUsage, *error);
    return;
  }
  if (!reports.early_complete()) {
    check_stalled();
    return;
  }
  reports.release_early();
  for (int rank : attempt_->members) {
    to_train(*pool().at_rank(rank), protocol::ArriveAck{arrive.iteration});
  }
}

void Controller::on_done(WorkerSlot& worker) {
  if (worker.done) return;
  if (attempt_->reports.waiting(worker.rank)) throw ProtocolError("DONE while its report waits");
  worker.done = true;
  attempt_->reports.finished(worker.rank);
  // The replacement of rank 0, or of a rank that writes into the checkpoints,
  // which a group that returned can take no more: a run does not end without
  // a rank whose files its last checkpoints lack.
  auto& replacement = attempt_->replacement;
  if (replacement && replacement->loss && !pending_replacement(worker)) {
    drop_replacement(replacement->loop_left
                         ? "could not join: the train functions left their loop first"
                         : "could not join: the train functions returned first");
  }
  check_stalled();
}

void Controller::on_progress(const WorkerSlot& worker, const protocol::Progress& progress) {
  constexpr int64_t kMost = int64_t{1} << 50;  // beyond any real count; keeps the arithmetic safe
  auto in = [&](int64_t v) { return v >= 0 && v <= kMost; };
  if (!in(progress.epoch) || !in(progress.batch) || !in(progress.batches) || !in(progress.steps) ||
      !in(progress.samples)) {
    throw ProtocolError("PROGRESS with counts out of range");
  }
  // The group's first rank's: rank 0's, or while it is being replaced, the lowest one left.
  const auto& members = attempt_->members;
  if (members.empty() || worker.rank != members.front() || !setup_.on_progress || !healthy()) {
    return;
  }
  ProgressSample sample{setup_.attempt_offset + attempt_->number,
                        world_size(),
                        progress.epoch,
                        progress.batch,
                        progress.batches,
                        progress.steps,
                        progress.samples};
  // A sampler that yields more than the loader counted: the epoch is done.
  if (sample.batches > 0) sample.batch = std::min(sample.batch, sample.batches);
  // At most one every kProgressGap. An epoch's end passes too, so the display
  // shows it complete, once (the worker already spaces them; messages can
  // arrive bunched), and never more than kProgressEnds a second.
  const auto now = this->now();
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
  auto& attempt = *attempt_;
  if (!attempt.reports.complete()) {
    check_stalled();
    return;
  }
  // A synchronous checkpoint is committed before the report is released; an
  // asynchronous one (what is staged belongs to it) afterwards.
  if (!attempt.async_checkpoint && checkpoints_.uploading()) return;
  auto record = attempt.reports.release();
  const bool async = attempt.async_checkpoint && !attempt.async_checkpoint->released;
  if (async) {
    *attempt.async_checkpoint = {true, record.iteration, record.metrics, now(), absent_ranks()};
  } else if (!attempt.async_checkpoint) {
    try {
      record.checkpoint = commit_unless_lacking(record.iteration, record.metrics, absent_ranks());
    } catch (const IoError& e) {
      fail_storage(std::string("checkpoint commit failed: ") + e.what());
      return;
    }
  }
  record.timestamp = unix_time();  // includes a synchronous checkpoint's commit
  record.time_total_s = earlier_seconds_ + elapsed();
  record.attempt = setup_.attempt_offset + attempt.number;
  // A host that ends the run here (a tuner's scheduler) answers before the
  // ranks go on, so that none trains past the report it stops at.
  std::optional<std::string> stop;
  if (setup_.should_stop) stop = setup_.should_stop(record);
  if (stop && !interrupted_) {
    interrupted_ = RunError{FailureKind::kInterrupted, *stop, -1, "", 0};
  }
  // The ranks go on while the report is recorded: its checkpoint, if any, is
  // committed, and this loop records it before it reads another message.
  for (int rank : attempt.members) {
    if (stop) break;
    to_train(*pool().at_rank(rank), protocol::ReportAck{attempt.reports.iteration() - 1});
  }
  try {
    storage_.append_result(record);
    write_tensorboard(record);
    ++attempt.reported;
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

void Controller::write_tensorboard(const ReportRecord& record) {
  if (!setup_.options.run.tensorboard || tensorboard_failed_ || !record.metrics.is_object()) return;
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& [name, value] : record.metrics.items()) {
    if (value.is_number()) {
      scalars.emplace_back(name, value.get<double>());
    } else if (value.is_boolean()) {
      scalars.emplace_back(name, value.get<bool>() ? 1.0 : 0.0);
    }
  }
  if (scalars.empty()) return;
  try {
    // In the run directory itself: `tensorboard --logdir <storage_path>` names
    // each run by its name.
    if (!tensorboard_) tensorboard_.emplace(storage_.dir());
    tensorboard_->add_scalars(record.iteration, record.timestamp, scalars);
  } catch (const IoError& e) {  // result.jsonl has the reports; the charts are extra
    log_.warn("no more TensorBoard events for this run: {}", e.what());
    tensorboard_.reset();
    tensorboard_failed_ = true;
  }
}

void Controller::check_stalled() {
  if (auto stalled = attempt_->reports.stalled()) {
    fail(*pool().at_rank(stalled->first), FailureKind::kUsage, stalled->second);
  }
}

RunError Controller::after_early_return(RunError error) const {
  if (error.kind != FailureKind::kException || error.rank < 0 || !attempt_->assigned()) {
    return error;
  }
  // Only a collective's error that a closed connection explains (Gloo's TCP
  // pairs): a rank that returned may be right, and another's error unrelated.
  const bool peer_gone = error.message.find("closed by peer") != std::string::npos ||
                         error.message.find("reset by peer") != std::string::npos;
  if (!peer_gone) return error;
  const WorkerSlot* failed = attempt_->pool->at_rank(error.rank);
  if (failed == nullptr || failed->done) return error;
  const auto& workers = pool().workers();
  auto returned = std::find_if(workers.begin(), workers.end(),
                               [](const WorkerSlot& w) { return w.done && w.rank >= 0; });
  if (returned == workers.end()) return error;
  // A rank that returns closes its connections to its peers (as a process
  // that exits does), so one still training fails at its next collective:
  // the return is the cause to name, the collective's error the evidence.
  const int64_t reports = attempt_->reports.iteration() - 1;
  return RunError{FailureKind::kUsage,
                  "returned from train_func after " + std::to_string(reports) +
                      (reports == 1 ? " report" : " reports") + " while rank " +
                      std::to_string(error.rank) + ", after as many, was still training; rank " +
                      std::to_string(error.rank) + " then " + error.message +
                      ". Every rank must run the same collectives and call train::report the "
                      "same number of times",
                  returned->rank, returned->host, returned->process.pid};
}

}  // namespace trainrun

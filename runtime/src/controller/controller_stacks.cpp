// Stacks of every rank and the bound of a report's wait: where each thread of
// each worker stands, on request (SIGUSR1, `trainrun stacks`) and when a
// report has waited half the collective timeout for a rank that does not
// come; at the whole timeout the attempt fails naming that rank and where its
// train function was. A worker that does not answer within kStacksWait is
// named in the file, not waited on.

#include <trainrun/error.h>

#include <algorithm>
#include <fstream>

#include "common/atomic_file.h"
#include "common/crash_report.h"
#include "common/seconds.h"
#include "controller/controller.h"
#include "storage/run_directory.h"

namespace trainrun {
namespace {

// The ranks as a list a sentence can hold: "rank 1", "ranks 0, 2 and 3".
std::string ranks_text(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += i + 1 == ranks.size() ? " and " : ", ";
    text += std::to_string(ranks[i]);
  }
  return text;
}

const protocol::ThreadStack* train_thread(const std::vector<protocol::ThreadStack>& threads) {
  for (const auto& thread : threads) {
    if (thread.train) return &thread;
  }
  return nullptr;
}

}  // namespace

void Controller::collect_stacks(const std::string& reason) {
  auto& attempt = *attempt_;
  if (attempt.stacks) {
    log_.info("stacks are being collected already; not again for: {}", reason);
    return;
  }
  Attempt::StackCollection collection;
  collection.id = stacks_taken_ + 1;
  collection.reason = reason;
  collection.deadline = now() + kStacksWait;
  for (auto& worker : pool().workers()) {
    if (worker.exited || !worker.main_id) continue;
    to_main(worker, protocol::Stacks{collection.id});
    collection.asked.push_back(&worker);
  }
  if (collection.asked.empty()) {
    log_.info("no worker to take stacks from ({})", reason);
    return;
  }
  attempt.stacks = std::move(collection);
}

void Controller::on_stacks_reply(WorkerSlot& worker, protocol::StacksReply reply) {
  auto& stacks = attempt_->stacks;
  if (!stacks || reply.id != stacks->id) return;  // an answer too late for its collection
  stacks->answers[&worker] = std::move(reply.threads);
  finish_stacks(false);
}

void Controller::finish_stacks(bool now) {
  auto& attempt = *attempt_;
  if (!attempt.stacks) return;
  auto& collection = *attempt.stacks;
  if (!now && collection.answers.size() < collection.asked.size()) return;
  // By rank, those without one (not yet assigned) after.
  auto asked = collection.asked;
  std::stable_sort(asked.begin(), asked.end(), [](const WorkerSlot* a, const WorkerSlot* b) {
    return static_cast<unsigned>(a->rank) < static_cast<unsigned>(b->rank);
  });
  std::string text = "stacks of every worker (" + collection.reason + "), " +
                     run_directory::timestamp_now() + ", attempt " +
                     std::to_string(attempt.number) + "\n";
  attempt.train_places.clear();
  for (const WorkerSlot* worker : asked) {
    text += "\n" + worker->describe() + ":\n";
    auto answer = collection.answers.find(worker);
    if (answer == collection.answers.end()) {
      text += "  did not answer within " + seconds_text(kStacksWait) + "\n";
      continue;
    }
    for (const auto& thread : answer->second) {
      text += "  thread " + std::to_string(thread.tid) + " \"" + thread.name + "\"" +
              (thread.train ? " (train_func)" : "");
      if (!thread.answered) {
        text += ": not walked (ptrace not allowed here, or the walk ran out of time)\n";
        continue;
      }
      text += ":\n";
      for (size_t i = 0; i < thread.frames.size(); ++i) {
        text += "    #" + std::to_string(i) + " " + thread.frames[i] + "\n";
      }
    }
    const auto* train = train_thread(answer->second);
    if (train != nullptr && train->answered && !train->frames.empty() && worker->rank >= 0) {
      attempt.train_places[worker->rank] = innermost_place(train->frames);
    }
  }
  const auto file = storage_.logs_dir() / ("stacks-" + std::to_string(collection.id) + ".txt");
  try {
    write_file_atomic(file, text);
    ++stacks_taken_;
    attempt.stacks_file = file.string();
    log_.warn("stacks of every worker ({}): {}", collection.reason, file.string());
  } catch (const IoError& e) {  // the terminal has them then
    log_.warn("cannot write {}: {}; the stacks:\n{}", file.string(), e.what(), text);
  }
  attempt.stacks.reset();
}

void Controller::check_report_wait() {
  auto& attempt = *attempt_;
  const auto& reports = attempt.reports;
  if (!records() || !reports.partly_arrived()) {
    attempt.report_wait.reset();
    return;
  }
  const auto now = this->now();
  if (!attempt.report_wait || attempt.report_wait->iteration != reports.iteration()) {
    attempt.report_wait = Attempt::ReportWait{reports.iteration(), now, false};
    return;
  }
  auto& wait = *attempt.report_wait;
  const auto timeout = setup_.options.run.collective_timeout;
  std::vector<int> waiting, missing;
  for (int rank = 0; rank < world_size(); ++rank) {
    (reports.waiting(rank) ? waiting : missing).push_back(rank);
  }
  const auto report = "report " + std::to_string(wait.iteration);
  if (!wait.stacks_taken && now - wait.since >= timeout / 2) {
    wait.stacks_taken = true;  // once a report: the cause of a hang is on disk before it ends
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - wait.since);
    collect_stacks(ranks_text(waiting) + " waited " + seconds_text(waited) + " in " + report +
                   " for " + ranks_text(missing));
    return;
  }
  if (now - wait.since < timeout || attempt.stacks) return;  // the stacks first, if coming
  WorkerSlot* first = pool().at_rank(missing.front());
  std::string message = "did not reach " + report + " within the collective timeout (" +
                        seconds_text(timeout) + ") while " + ranks_text(waiting) + " waited there";
  if (missing.size() > 1) {
    message += " (nor did " +
               ranks_text(std::vector<int>(missing.begin() + 1, missing.end())) + ")";
  }
  if (auto place = attempt.train_places.find(missing.front()); place != attempt.train_places.end()) {
    message += "; its train function was " + place->second;
  } else if (!attempt.stacks_file.empty()) {
    message += "; it did not answer for its stacks";
  }
  if (!attempt.stacks_file.empty()) message += "; every thread's stack: " + attempt.stacks_file;
  fail(*first, FailureKind::kTimeout, message);
}

}  // namespace trainrun

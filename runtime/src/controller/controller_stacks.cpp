// Stacks of every rank and the bound of a report's wait: where each thread of
// each worker stands, on request (SIGUSR1, `trainrun stacks`) and when a
// report has waited half the collective timeout for a rank that does not
// come; at the whole timeout the attempt fails naming that rank and where its
// train function was. A worker that does not answer within kStacksWait is
// named in the file, not waited on.

#include <trainrun/error.h>

#include <algorithm>
#include <filesystem>
#include <regex>

#include "common/atomic_file.h"
#include "common/constants.h"
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

void Controller::collect_stacks(const std::string& reason, const std::vector<int>& ranks) {
  auto& attempt = *attempt_;
  if (attempt.stacks) {
    log_.info("stacks are being collected already; not again for: {}", reason);
    return;
  }
  if (stacks_taken_ == 0) {  // after those earlier runs of this name left
    static const std::regex kName(R"(stacks-([0-9]{1,9})\.txt)");
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(storage_.logs_dir(), ec)) {
      std::smatch match;
      const auto name = entry.path().filename().string();
      if (std::regex_match(name, match, kName)) {
        stacks_taken_ = std::max<int64_t>(stacks_taken_, std::stoll(match[1].str()));
      }
    }
  }
  Attempt::StackCollection collection;
  collection.id = stacks_taken_ + 1;
  collection.reason = reason;
  collection.deadline = now() + kStacksWait;
  for (auto& worker : pool().workers()) {
    if (worker.exited || !worker.main_id) continue;
    if (!ranks.empty() && std::find(ranks.begin(), ranks.end(), worker.rank) == ranks.end()) {
      continue;
    }
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
  if (std::find(stacks->asked.begin(), stacks->asked.end(), &worker) == stacks->asked.end()) return;
  // As much as a worker's walk gives: the file stays readable whatever one sends.
  constexpr size_t kMaxThreads = 1024;
  if (reply.threads.size() > kMaxThreads) reply.threads.resize(kMaxThreads);
  for (auto& thread : reply.threads) {
    thread.name = thread.name.substr(0, 64);
    if (thread.frames.size() > kMaxFrames) thread.frames.resize(kMaxFrames);
    for (auto& frame : thread.frames) frame = frame.substr(0, kMaxFrameText);
  }
  stacks->answers[&worker] = std::move(reply.threads);
  finish_stacks(false);
}

void Controller::finish_stacks(bool force) {
  auto& attempt = *attempt_;
  if (!attempt.stacks) return;
  auto& collection = *attempt.stacks;
  if (!force && collection.answers.size() < collection.asked.size()) return;
  // By rank, those without one (not yet assigned) after.
  auto asked = collection.asked;
  std::stable_sort(asked.begin(), asked.end(), [](const WorkerSlot* a, const WorkerSlot* b) {
    return static_cast<unsigned>(a->rank) < static_cast<unsigned>(b->rank);
  });
  std::string text = "stacks of the workers (" + collection.reason + "), " +
                     run_directory::timestamp_now() + ", attempt " +
                     std::to_string(setup_.attempt_offset + attempt.number) + "\n";
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
    stacks_taken_ = collection.id;
    attempt.stacks_file = file.string();
    log_.warn("stacks of the workers ({}): {}", collection.reason, file.string());
  } catch (const IoError& e) {  // the terminal has them then
    log_.warn("cannot write {}: {}; the stacks:\n{}", file.string(), e.what(), text);
  }
  attempt.stacks.reset();
}

void Controller::check_report_wait() {
  auto& attempt = *attempt_;
  const auto& reports = attempt.reports;
  // A report with a checkpoint that waits for the asynchronous upload before
  // it has reached the report: the upload is what takes the time.
  if (!records() || !reports.partly_arrived() || !attempt.deferred_reports.empty()) {
    attempt.report_wait.reset();
    return;
  }
  const auto now = this->now();
  if (!attempt.report_wait || attempt.report_wait->iteration != reports.iteration()) {
    attempt.report_wait = Attempt::ReportWait{reports.iteration(), now, false};
    return;
  }
  auto& wait = *attempt.report_wait;
  // Within what a clock can hold: the API takes any positive timeout.
  const auto timeout =
      std::min(setup_.options.run.collective_timeout,
               std::chrono::milliseconds(static_cast<int64_t>(kMaxTimeoutSeconds * 1000)));
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - wait.since);
  std::vector<int> waiting, missing;
  for (int rank : attempt.members) {
    const WorkerSlot* worker = pool().at_rank(rank);
    if (reports.waiting(rank)) {
      waiting.push_back(rank);
    } else if (worker != nullptr && !worker->done) {  // one that returned is check_stalled's
      missing.push_back(rank);
    }
  }
  if (waiting.empty() || missing.empty()) return;
  const auto report = "report " + std::to_string(wait.iteration);
  if (!wait.stacks_taken && waited >= timeout / 2) {
    // Once a report: the cause of a hang is on disk before it ends the run.
    // The ranks that do not come, and one that waits for them.
    wait.stacks_taken = true;
    auto asked = missing;
    asked.push_back(waiting.front());
    collect_stacks(ranks_text(waiting) + " waited " + seconds_text(waited) + " in " + report +
                       " for " + ranks_text(missing),
                   asked);
    return;
  }
  if (waited < timeout || attempt.stacks) return;  // the stacks first, if coming
  std::string message = "did not reach " + report + " within the collective timeout (" +
                        seconds_text(timeout) + ") while " + ranks_text(waiting) + " waited there";
  if (missing.size() > 1) {
    message +=
        " (nor did " + ranks_text(std::vector<int>(missing.begin() + 1, missing.end())) + ")";
  }
  if (auto place = attempt.train_places.find(missing.front());
      place != attempt.train_places.end()) {
    message += "; its train function was " + place->second;
  } else if (!attempt.stacks_file.empty()) {
    message += "; it did not answer for its stacks";
  }
  if (!attempt.stacks_file.empty()) message += "; the stacks: " + attempt.stacks_file;
  fail(*pool().at_rank(missing.front()), FailureKind::kTimeout, message);
}

}  // namespace trainrun

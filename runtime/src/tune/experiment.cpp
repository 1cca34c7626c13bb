#include "tune/experiment.h"

#include <trainrun/error.h>

#include <fstream>
#include <sstream>

#include "common/atomic_file.h"

namespace trainrun {

namespace tune {
namespace {

using json = nlohmann::json;

json to_json(const TrialRecord& t) {
  return {{"name", t.name},
          {"config", t.config},
          {"status", to_string(t.status)},
          {"note", t.note},
          {"iterations", t.iterations},
          {"best", t.best ? json{{"value", *t.best}, {"iteration", t.best_iteration}} : json()},
          {"started_at", t.started_at > 0 ? json(t.started_at) : json()},
          {"ended_at", t.ended_at > 0 ? json(t.ended_at) : json()},
          {"starts", t.starts},
          {"latest_checkpoint", t.latest_checkpoint},
          {"resume_from", t.resume_from},
          {"resume_after", t.resume_after},
          {"verdict", t.verdict}};
}

TrialRecord trial_from_json(const json& j) {
  TrialRecord t;
  t.name = j.at("name").get<std::string>();
  t.config = j.at("config");
  t.status = trial_status_from(j.at("status").get<std::string>());
  t.note = j.value("note", "");
  t.iterations = j.value("iterations", int64_t{0});
  if (const auto& best = j.at("best"); best.is_object()) {
    t.best = best.at("value").get<double>();
    t.best_iteration = best.at("iteration").get<int64_t>();
  }
  t.started_at = j.value("started_at", json()).is_number() ? j["started_at"].get<double>() : 0;
  t.ended_at = j.value("ended_at", json()).is_number() ? j["ended_at"].get<double>() : 0;
  t.starts = j.value("starts", 0);
  t.latest_checkpoint = j.value("latest_checkpoint", "");
  t.resume_from = j.value("resume_from", "");
  t.resume_after = j.value("resume_after", int64_t{0});
  t.verdict = j.value("verdict", json());
  if (!t.verdict.is_null() &&
      (!t.verdict.is_object() || !t.verdict.value("action", json()).is_string())) {
    throw IoError("a trial's verdict is malformed");
  }
  if (!t.config.is_object() || t.name.rfind("trial_", 0) != 0 ||
      t.name.find('/') != std::string::npos) {
    throw IoError("a trial's name or config is malformed");
  }
  return t;
}

}  // namespace

TrialStatus trial_status_from(const std::string& text) {
  for (auto status : {TrialStatus::kPending, TrialStatus::kRunning, TrialStatus::kFinished,
                      TrialStatus::kStopped, TrialStatus::kFailed}) {
    if (text == to_string(status)) return status;
  }
  throw IoError("unknown trial status '" + text.substr(0, 32) + "'");
}

std::optional<ExperimentRecord> read_experiment(const std::filesystem::path& dir) {
  const auto path = dir / kExperimentFile;
  std::ifstream in(path);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return std::nullopt;
    throw IoError("cannot read " + path.string());
  }
  std::stringstream text;
  text << in.rdbuf();
  try {
    const json j = json::parse(text.str());
    ExperimentRecord r;
    r.name = j.at("name").get<std::string>();
    r.search = j.at("search");
    r.started_at = j.at("started_at").get<double>();
    r.status = j.value("status", "running");
    for (const auto& t : j.at("trials")) r.trials.push_back(trial_from_json(t));
    r.scheduler_state = j.value("scheduler_state", json::object());
    return r;
  } catch (const json::exception& e) {
    throw IoError(path.string() + " is malformed: " + e.what());
  } catch (const IoError& e) {
    throw IoError(path.string() + " is malformed: " + e.what());
  }
}

void write_experiment(const std::filesystem::path& dir, const ExperimentRecord& r, bool sync) {
  json trials = json::array();
  for (const auto& t : r.trials) trials.push_back(to_json(t));
  const json j = {{"version", 1},
                  {"name", r.name},
                  {"search", r.search},
                  {"metric", r.search.value("metric", "")},
                  {"mode", r.search.value("mode", "max")},
                  {"started_at", r.started_at},
                  {"status", r.status},
                  {"trials", trials},
                  {"scheduler_state", r.scheduler_state}};
  write_file_atomic(dir / kExperimentFile,
                    j.dump(2, ' ', false, json::error_handler_t::replace) + "\n",
                    sync ? Durability::kSynced : Durability::kUnsynced);
}

}  // namespace tune
}  // namespace trainrun

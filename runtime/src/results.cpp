#include <trainrun/error.h>
#include <trainrun/trainer.h>

#include <fstream>
#include <sstream>

#include "storage/checkpoint_store.h"
#include "storage/run_storage.h"

namespace trainrun {
namespace {

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  auto value = nlohmann::json::parse(in, nullptr, false);
  if (value.is_discarded()) throw IoError(path.string() + " is not valid JSON");
  return value;
}

}  // namespace

Result load_result(const std::filesystem::path& run_dir) {
  auto info = read_json_file(run_dir / "run.json");
  if (!info.is_object()) {
    throw UsageError(run_dir.string() + " holds no trainrun run (no run.json)");
  }
  Result result;
  result.path = run_dir;
  std::ifstream lines(run_dir / "result.jsonl");
  std::string line;
  while (std::getline(lines, line)) {
    auto record = nlohmann::json::parse(line, nullptr, false);
    if (!record.is_discarded()) result.history.push_back(std::move(record));
  }
  if (!result.history.empty()) {
    result.metrics = result.history.back()["metrics"];
    result.iterations = result.history.back().value("iteration", int64_t{0});
  }
  auto state = read_json_file(run_dir / "checkpoint_state.json");
  if (state.is_object()) {
    if (state["latest"].is_string()) {
      result.checkpoint = run_dir / state["latest"].get<std::string>();
    }
    // Best first, by the score settings the run recorded.
    auto scoring = info.value("checkpoint", nlohmann::json::object());
    CheckpointConfig config;
    config.score_attribute = scoring.value("score_attribute", std::string());
    config.score_max = scoring.value("score_order", std::string("max")) == "max";
    std::vector<nlohmann::json> ranked(state["checkpoints"].begin(), state["checkpoints"].end());
    std::stable_sort(ranked.begin(), ranked.end(),
                     [&](const auto& a, const auto& b) { return ranks_before(a, b, config); });
    for (const auto& c : ranked) {
      auto name = c["name"].get<std::string>();
      result.best_checkpoints.push_back(
          {name, run_dir / name, c.value("iteration", int64_t{0}), c["metrics"]});
    }
  }
  auto error = read_json_file(run_dir / "error.json");
  if (error.is_object()) {
    result.error = RunError{error.value("kind", std::string()),
                            error.value("message", std::string()), error.value("rank", -1),
                            error.value("host", std::string()), error.value("pid", int64_t{0})};
  }
  return result;
}

std::string describe(const Result& result) {
  std::ostringstream out;
  out << "run:          " << result.path.string() << "\n"
      << "status:       "
      << (!result.error          ? "finished"
          : result.interrupted() ? "interrupted"
                                 : "failed")
      << "\n"
      << "iterations:   " << result.iterations << "\n"
      << "last metrics: " << format_metrics(result.metrics) << "\n"
      << "checkpoint:   " << (result.checkpoint.empty() ? "-" : result.checkpoint.string()) << "\n";
  if (!result.best_checkpoints.empty()) {
    out << "best checkpoints:\n";
    for (const auto& c : result.best_checkpoints) {
      out << "  " << c.name << "  iteration " << c.iteration << "  " << format_metrics(c.metrics)
          << "\n";
    }
  }
  if (result.error) out << "error:        " << result.error->summary() << "\n";
  return out.str();
}

}  // namespace trainrun

// TrainerOptions as JSON: how a tuner hands each trial's options to the
// trainrun process that runs it.

#include <trainrun/error.h>
#include <trainrun/options.h>

namespace trainrun {
namespace {

using json = nlohmann::json;

// Reads `key` into `value` when present; the wrong type is one line.
template <typename T>
void take(const json& j, const char* key, T& value) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    value = it->get<T>();
  } catch (const json::exception&) {
    throw UsageError(std::string("trainer options: '") + key + "' has the wrong type");
  }
}

void take_path(const json& j, const char* key, std::filesystem::path& value) {
  std::string text = value.string();
  take(j, key, text);
  value = text;
}

template <typename Duration>
void take_duration(const json& j, const char* key, Duration& value) {
  auto count = static_cast<int64_t>(value.count());
  take(j, key, count);
  value = Duration(count);
}

const json& section(const json& j, const char* key) {
  static const json kEmpty = json::object();
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return kEmpty;
  if (!it->is_object()) {
    throw UsageError(std::string("trainer options: '") + key + "' is not an object");
  }
  return *it;
}

}  // namespace

void to_json(json& j, const TrainerOptions& o) {
  j = json{
      {"plugin", o.plugin.string()},
      {"entry", o.entry},
      {"config", o.config},
      {"scaling",
       {{"num_workers", o.scaling.num_workers},
        {"min_workers", o.scaling.min_workers},
        {"cpus_per_worker", o.scaling.cpus_per_worker},
        {"use_gpu", o.scaling.use_gpu},
        {"local_workers", o.scaling.local_workers},
        {"in_process", o.scaling.in_process}}},
      {"run",
       {{"name", o.run.name},
        {"storage_path", o.run.storage_path.string()},
        {"resume_from", o.run.resume_from.string()},
        {"resume_from_first", o.run.resume_from_first},
        {"heartbeat_timeout_ms", o.run.heartbeat_timeout.count()},
        {"startup_timeout_ms", o.run.startup_timeout.count()},
        {"collective_timeout_ms", o.run.collective_timeout.count()},
        {"tensorboard", o.run.tensorboard}}},
      {"checkpoint",
       {{"num_to_keep", o.checkpoint.num_to_keep},
        {"score_attribute", o.checkpoint.score_attribute},
        {"score_max", o.checkpoint.score_max},
        {"always_stream", o.checkpoint.always_stream}}},
      {"network",
       {{"listen", o.network.listen},
        {"auth_key_file", o.network.auth_key_file.string()},
        {"insecure", o.network.insecure}}},
      {"failure",
       {{"max_failures", o.failure.max_failures},
        {"standby", o.failure.standby},
        {"in_place", o.failure.in_place}}},
      {"worker_executable", o.worker_executable.string()},
      {"cache_dir", o.cache_dir.string()},
      {"verbose", o.verbose},
      {"handle_signals", o.handle_signals},
      {"progress_interval_s", o.progress_interval.count()},
      {"status_line", o.status_line},
      {"profile_steps", {o.profile_steps.first, o.profile_steps.second}},
  };
}

void from_json(const json& j, TrainerOptions& o) {
  if (!j.is_object()) throw UsageError("trainer options: not a JSON object");
  o = TrainerOptions{};
  take_path(j, "plugin", o.plugin);
  take(j, "entry", o.entry);
  if (auto it = j.find("config"); it != j.end()) {
    if (!it->is_object()) throw UsageError("trainer options: 'config' is not an object");
    o.config = *it;
  }
  const auto& scaling = section(j, "scaling");
  take(scaling, "num_workers", o.scaling.num_workers);
  take(scaling, "min_workers", o.scaling.min_workers);
  take(scaling, "cpus_per_worker", o.scaling.cpus_per_worker);
  take(scaling, "use_gpu", o.scaling.use_gpu);
  take(scaling, "local_workers", o.scaling.local_workers);
  take(scaling, "in_process", o.scaling.in_process);
  const auto& run = section(j, "run");
  take(run, "name", o.run.name);
  take_path(run, "storage_path", o.run.storage_path);
  take_path(run, "resume_from", o.run.resume_from);
  take(run, "resume_from_first", o.run.resume_from_first);
  take_duration(run, "heartbeat_timeout_ms", o.run.heartbeat_timeout);
  take_duration(run, "startup_timeout_ms", o.run.startup_timeout);
  take_duration(run, "collective_timeout_ms", o.run.collective_timeout);
  take(run, "tensorboard", o.run.tensorboard);
  const auto& checkpoint = section(j, "checkpoint");
  take(checkpoint, "num_to_keep", o.checkpoint.num_to_keep);
  take(checkpoint, "score_attribute", o.checkpoint.score_attribute);
  take(checkpoint, "score_max", o.checkpoint.score_max);
  take(checkpoint, "always_stream", o.checkpoint.always_stream);
  const auto& network = section(j, "network");
  take(network, "listen", o.network.listen);
  take_path(network, "auth_key_file", o.network.auth_key_file);
  take(network, "insecure", o.network.insecure);
  const auto& failure = section(j, "failure");
  take(failure, "max_failures", o.failure.max_failures);
  take(failure, "standby", o.failure.standby);
  take(failure, "in_place", o.failure.in_place);
  take_path(j, "worker_executable", o.worker_executable);
  take_path(j, "cache_dir", o.cache_dir);
  take(j, "verbose", o.verbose);
  take(j, "handle_signals", o.handle_signals);
  take_duration(j, "progress_interval_s", o.progress_interval);
  take(j, "status_line", o.status_line);
  take(j, "profile_steps", o.profile_steps);
}

}  // namespace trainrun

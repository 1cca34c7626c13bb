#include "storage/run_directory.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string_view>
#include <thread>

#include "common/atomic_file.h"
#include "common/hash.h"

namespace trainrun::run_directory {
namespace {

using nlohmann::json;

// Text from plugins (metrics, messages, file names) need not be UTF-8: it is
// written with replacement characters rather than failing the write.
std::string dump(const json& value, int indent = 2) {
  return value.dump(indent, ' ', false, json::error_handler_t::replace);
}

// The file's JSON, or null when it does not exist. Throws IoError when it
// exists but cannot be read, or is malformed: a state that cannot be read is
// never taken for no state.
json read_json(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && !ec) return nullptr;
  std::string text;
  try {
    std::ifstream in(path);
    if (ec || !in) throw IoError("cannot open it");
    std::ostringstream bytes;
    bytes << in.rdbuf();
    if (!in) throw IoError("read error");
    text = bytes.str();
  } catch (const std::exception& e) {  // also a directory's read error from the stream
    throw IoError("cannot read " + path.string() + ": " + e.what());
  }
  auto value = json::parse(text, nullptr, false);
  if (value.is_discarded() || !value.is_object()) {
    throw IoError(path.string() + " is not a valid JSON object");
  }
  return value;
}

// Runs `parse`, turning a JSON type error into an IoError naming the file.
template <typename F>
auto parse_fields(const std::filesystem::path& path, F parse) {
  try {
    return parse();
  } catch (const json::exception& e) {
    throw IoError(path.string() + " is malformed: " + e.what());
  }
}

RunStatus parse_status(const std::string& name) {
  for (auto status : {RunStatus::kRunning, RunStatus::kFinished, RunStatus::kFailed,
                      RunStatus::kInterrupted, RunStatus::kCrashed}) {
    if (name == to_string(status)) return status;
  }
  throw json::other_error::create(501, "unknown status '" + name + "'", nullptr);
}

json error_json(const RunError& error) {
  json j = {{"kind", to_string(error.kind)}, {"message", error.message}};
  if (error.rank >= 0) j["rank"] = error.rank;
  if (!error.host.empty()) j["host"] = error.host;
  if (error.pid > 0) j["pid"] = error.pid;
  if (error.attempt > 0) j["attempt"] = error.attempt;
  if (!error.stack.empty()) j["stack"] = error.stack;
  return j;
}

RunError error_from_json(const json& j) {
  auto kind = parse_failure_kind(j.value("kind", ""));
  return RunError{kind.value_or(FailureKind::kException),
                  j.value("message", ""),
                  j.value("rank", -1),
                  j.value("host", ""),
                  j.value("pid", int64_t{0}),
                  j.value("attempt", 0),
                  j.value("stack", std::vector<std::string>{})};
}

json attempt_json(const AttemptInfo& a) {
  json j = {{"attempt", a.attempt}, {"world_size", a.world_size}, {"started_at", a.started_at}};
  if (!a.ended_at.empty()) j["ended_at"] = a.ended_at;
  if (!a.resumed_from.empty()) j["resumed_from"] = a.resumed_from;
  if (a.error) j["error"] = error_json(*a.error);
  if (a.regrouped) j["regrouped"] = true;
  for (const auto& r : a.recoveries) {
    json record = {{"rank", r.rank},      {"host", r.host},
                   {"pid", r.pid},        {"cause", r.cause},
                   {"at", r.at},          {"world_size", r.world_size},
                   {"step", r.step},      {"steps_lost", r.steps_lost},
                   {"seconds", r.seconds}};
    if (r.replacement_pid != 0) {
      record["replacement_pid"] = r.replacement_pid;
      record["caught_up_seconds"] = r.caught_up_seconds;
    }
    j["recoveries"].push_back(std::move(record));
  }
  return j;
}

AttemptInfo attempt_from_json(const json& j) {
  AttemptInfo a;
  a.attempt = j.value("attempt", 1);
  a.world_size = j.value("world_size", 0);
  a.started_at = j.value("started_at", "");
  a.ended_at = j.value("ended_at", "");
  a.resumed_from = j.value("resumed_from", "");
  if (j.contains("error") && j["error"].is_object()) a.error = error_from_json(j["error"]);
  a.regrouped = j.value("regrouped", false);
  if (j.contains("recoveries") && j["recoveries"].is_array()) {
    for (const auto& r : j["recoveries"]) {
      if (!r.is_object()) continue;
      a.recoveries.push_back({r.value("rank", -1), r.value("host", ""), r.value("pid", int64_t{0}),
                              r.value("cause", ""), r.value("at", ""), r.value("world_size", 0),
                              r.value("step", int64_t{0}), r.value("steps_lost", int64_t{-1}),
                              r.value("seconds", -1.0), r.value("replacement_pid", int64_t{0}),
                              r.value("caught_up_seconds", -1.0)});
    }
  }
  return a;
}

json checkpoint_json(const CheckpointInfo& c) {
  return {{"name", c.name}, {"iteration", c.iteration}, {"metrics", c.metrics}};
}

// A name from disk becomes a path that retention may delete: only names this
// module makes are taken.
CheckpointInfo checkpoint_from_json(const json& j, const std::filesystem::path& run_dir) {
  auto name = j.at("name").get<std::string>();
  if (!checkpoint_index(name)) {
    throw json::other_error::create(501, "'" + name + "' is not a checkpoint's name", nullptr);
  }
  return {name, run_dir / name, j.value("iteration", int64_t{0}),
          j.value("metrics", json::object())};
}

}  // namespace

std::string timestamp_now() {
  std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

std::string checkpoint_name(int64_t index) {
  char name[32];
  std::snprintf(name, sizeof(name), "checkpoint_%06lld", static_cast<long long>(index));
  return name;
}

std::optional<int64_t> checkpoint_index(const std::string& name) {
  constexpr std::string_view kPrefix = "checkpoint_";
  if (name.size() < kPrefix.size() + 6 || name.size() > kPrefix.size() + 18 ||
      name.compare(0, kPrefix.size(), kPrefix) != 0 ||
      !std::all_of(name.begin() + static_cast<long>(kPrefix.size()), name.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  auto index = std::stoll(name.substr(kPrefix.size()));
  if (checkpoint_name(index) != name) return std::nullopt;  // "checkpoint_0000001"
  return index;
}

std::optional<CheckpointInfo> CheckpointState::latest_checkpoint() const {
  for (const auto& c : checkpoints) {
    if (c.name == latest) return c;
  }
  return std::nullopt;
}

std::optional<RunInfo> read_run_info(const std::filesystem::path& run_dir) {
  auto path = run_dir / kRunInfoFile;
  auto j = read_json(path);
  if (j.is_null()) return std::nullopt;
  return parse_fields(path, [&] {
    RunInfo info;
    info.name = j.value("name", "");
    info.storage_path = j.value("storage_path", "");
    auto plugin = j.value("plugin", json::object());
    info.plugin = {plugin.value("path", ""), plugin.value("sha256", ""), plugin.value("entry", ""),
                   plugin.value("sdk_version", ""), plugin.value("torch_version", "")};
    auto scaling = j.value("scaling", json::object());
    info.scaling.num_workers = scaling.value("num_workers", 1);
    info.scaling.cpus_per_worker = scaling.value("cpus_per_worker", 0);
    info.scaling.use_gpu = scaling.value("use_gpu", false);
    info.scaling.in_process = scaling.value("in_process", false);
    info.config = j.value("config", json::object());
    auto checkpoint = j.value("checkpoint", json::object());
    info.checkpoint.num_to_keep = checkpoint.value("num_to_keep", 0);
    info.checkpoint.score_attribute = checkpoint.value("score_attribute", "");
    info.checkpoint.score_max = checkpoint.value("score_order", "max") == "max";
    auto versions = j.value("versions", json::object());
    info.trainrun_version = versions.value("trainrun", "");
    info.torch_version = versions.value("torch", "");
    info.controller_host = j.value("controller_host", "");
    info.started_at = j.value("started_at", "");
    info.ended_at = j.value("ended_at", "");
    info.status = parse_status(j.value("status", "running"));
    info.max_failures = j.value("max_failures", 0);
    for (const auto& a : j.value("attempts", json::array())) {
      info.attempts.push_back(attempt_from_json(a));
    }
    return std::optional<RunInfo>(std::move(info));
  });
}

void write_run_info(const std::filesystem::path& run_dir, const RunInfo& info) {
  json j = {{"name", info.name},
            {"storage_path", info.storage_path},
            {"plugin",
             {{"path", info.plugin.path},
              {"sha256", info.plugin.sha256},
              {"entry", info.plugin.entry},
              {"sdk_version", info.plugin.sdk_version},
              {"torch_version", info.plugin.torch_version}}},
            {"scaling",
             {{"num_workers", info.scaling.num_workers},
              {"cpus_per_worker", info.scaling.cpus_per_worker},
              {"use_gpu", info.scaling.use_gpu},
              {"in_process", info.scaling.in_process}}},
            {"config", info.config},
            {"checkpoint",
             {{"num_to_keep", info.checkpoint.num_to_keep},
              {"score_attribute", info.checkpoint.score_attribute},
              {"score_order", info.checkpoint.score_max ? "max" : "min"}}},
            {"versions", {{"trainrun", info.trainrun_version}, {"torch", info.torch_version}}},
            {"controller_host", info.controller_host},
            {"started_at", info.started_at},
            {"status", to_string(info.status)},
            {"max_failures", info.max_failures}};
  if (!info.ended_at.empty()) j["ended_at"] = info.ended_at;
  json attempts = json::array();
  for (const auto& a : info.attempts) attempts.push_back(attempt_json(a));
  j["attempts"] = attempts;
  write_file_atomic(run_dir / kRunInfoFile, dump(j) + "\n");
}

std::vector<ReportRecord> read_results(const std::filesystem::path& run_dir) {
  std::vector<ReportRecord> records;
  std::ifstream in(run_dir / kResultsFile);
  std::string line;
  while (std::getline(in, line)) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    if (!j.contains("metrics")) {  // a checkpoint line: to its report's record
      if (!j.contains("committed_at") || !j["checkpoint"].is_string() ||
          !j["iteration"].is_number_integer()) {
        continue;
      }
      auto iteration = j["iteration"].get<int64_t>();
      for (auto record = records.rbegin(); record != records.rend(); ++record) {
        if (record->iteration == iteration) {
          record->checkpoint = j["checkpoint"].get<std::string>();
          break;
        }
      }
      continue;
    }
    try {
      records.push_back({j.at("iteration").get<int64_t>(), j.value("timestamp", 0.0),
                         j.value("time_total_s", 0.0), j["metrics"], j.value("checkpoint", ""),
                         j.value("attempt", 1)});
    } catch (const json::exception&) {
      continue;  // as for a line cut short
    }
  }
  return records;
}

std::string result_line(const ReportRecord& record) {
  json j = {{"iteration", record.iteration},
            {"timestamp", record.timestamp},
            {"time_total_s", record.time_total_s},
            {"metrics", record.metrics},
            {"attempt", record.attempt}};
  if (!record.checkpoint.empty()) j["checkpoint"] = record.checkpoint;
  return dump(j, -1) + "\n";
}

std::string checkpoint_line(int64_t iteration, const std::string& checkpoint, double timestamp) {
  json j = {{"iteration", iteration}, {"checkpoint", checkpoint}, {"committed_at", timestamp}};
  return dump(j, -1) + "\n";
}

CheckpointState read_checkpoint_state(const std::filesystem::path& run_dir) {
  auto path = run_dir / kCheckpointStateFile;
  auto j = read_json(path);
  if (j.is_null()) return {};
  return parse_fields(path, [&] {
    CheckpointState state;
    for (const auto& c : j.at("checkpoints")) {
      state.checkpoints.push_back(checkpoint_from_json(c, run_dir));
    }
    if (j["latest"].is_string()) state.latest = j["latest"].get<std::string>();
    state.next_index = j.at("next_index").get<int64_t>();
    if (!state.latest.empty() && !state.latest_checkpoint()) {
      throw json::other_error::create(501, "latest names no listed checkpoint", nullptr);
    }
    if (state.next_index < 0) throw json::other_error::create(501, "negative next_index", nullptr);
    return state;
  });
}

void write_checkpoint_state(const std::filesystem::path& run_dir, const CheckpointState& state) {
  json checkpoints = json::array();
  for (const auto& c : state.checkpoints) checkpoints.push_back(checkpoint_json(c));
  json j = {{"checkpoints", checkpoints},
            {"latest", state.latest.empty() ? json(nullptr) : json(state.latest)},
            {"next_index", state.next_index}};
  write_file_atomic(run_dir / kCheckpointStateFile, dump(j) + "\n");
}

std::optional<RunError> read_error(const std::filesystem::path& run_dir) {
  auto path = run_dir / kErrorFile;
  auto j = read_json(path);
  if (j.is_null()) return std::nullopt;
  return parse_fields(path, [&] { return std::optional<RunError>(error_from_json(j)); });
}

void write_error(const std::filesystem::path& run_dir, const std::optional<RunError>& error,
                 const std::vector<AttemptInfo>& attempts) {
  auto path = run_dir / kErrorFile;
  if (!error) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    return;
  }
  auto j = error_json(*error);
  // The ranks lost before it while the others went on in place.
  for (const auto& attempt : attempts) {
    auto recoveries = attempt_json(attempt)["recoveries"];
    for (auto& recovery : recoveries) {
      recovery["attempt"] = attempt.attempt;
      j["recoveries"].push_back(std::move(recovery));
    }
  }
  write_file_atomic(path, dump(j) + "\n");
}

Manifest parse_manifest(const std::string& text, const std::string& checkpoint) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("files") || !j["files"].is_array()) {
    throw IoError("checkpoint " + checkpoint + " has no readable " + kManifestFile);
  }
  try {
    Manifest manifest;
    manifest.iteration = j.value("iteration", int64_t{0});
    manifest.metrics = j.value("metrics", json::object());
    manifest.ranks = j.value("ranks", std::vector<int>{});
    for (const auto& file : j["files"]) {
      manifest.files.push_back({file.at("path").get<std::string>(), file.at("size").get<uint64_t>(),
                                file.at("sha256").get<std::string>(), file.value("rank", 0)});
    }
    return manifest;
  } catch (const json::exception&) {
    throw IoError("checkpoint " + checkpoint + " has a malformed " + kManifestFile);
  }
}

Manifest read_manifest(const std::filesystem::path& checkpoint_dir) {
  std::string text;
  std::ifstream in(checkpoint_dir / kManifestFile, std::ios::binary);
  if (in) text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return parse_manifest(text, checkpoint_dir.string());
}

std::string manifest_text(const Manifest& manifest) {
  json files = json::array();
  for (const auto& f : manifest.files) {
    files.push_back({{"path", f.path}, {"size", f.size}, {"sha256", f.sha256}, {"rank", f.rank}});
  }
  json j = {{"iteration", manifest.iteration},
            {"metrics", manifest.metrics},
            {"ranks", manifest.ranks},
            {"files", files}};
  return dump(j) + "\n";
}

void write_manifest(const std::filesystem::path& checkpoint_dir, const Manifest& manifest) {
  write_file_atomic(checkpoint_dir / kManifestFile, manifest_text(manifest));
}

RunLock::RunLock(const std::filesystem::path& run_dir) {
  auto path = run_dir / kLockFile;
  fd_.reset(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd_) throw IoError("cannot open " + path.string() + ": " + std::strerror(errno));
  // A reader's look (is_held: a shared lock for an instant) is not a holder.
  bool locked = false;
  for (int i = 0; i < 20 && !locked; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    locked = ::flock(fd_.get(), LOCK_EX | LOCK_NB) == 0;
  }
  if (!locked) {
    // The holder writes its name just after it locks: a refusal in between
    // waits for it, a little.
    char holder[256] = {0};
    ssize_t n = 0;
    for (int i = 0; i < 200 && n <= 0; ++i) {
      if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      n = ::pread(fd_.get(), holder, sizeof(holder) - 1, 0);
    }
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "unknown";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    fd_.reset();
    throw UsageError("run directory " + run_dir.string() + " is in use by another run (" + who +
                     "): wait for it to end, or choose another --name");
  }
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  // Best effort: if this fails, the lock is held all the same and only the
  // holder's name is missing from a refusal.
  auto holder = "pid " + std::to_string(::getpid()) + " on host " + host + "\n";
  if (::ftruncate(fd_.get(), 0) == 0) write_all(fd_.get(), holder);
}

RunLock::~RunLock() {
  // The next holder's refusals name no one stale; a failure only leaves the
  // old name in the file.
  if (::ftruncate(fd_.get(), 0) != 0) return;
}

bool is_held(const std::filesystem::path& run_dir) {
  Fd fd(::open((run_dir / kLockFile).c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return false;
  if (::flock(fd.get(), LOCK_SH | LOCK_NB) == 0) return false;  // closing drops it again
  return errno == EWOULDBLOCK;
}

void verify_checkpoint(const std::filesystem::path& checkpoint_dir) {
  for (const auto& file : read_manifest(checkpoint_dir).files) {
    auto path = checkpoint_dir / file.path;
    std::error_code ec;
    auto size = std::filesystem::file_size(path, ec);
    if (ec || size != file.size || sha256_file(path) != file.sha256) {
      throw IoError("checkpoint file " + path.string() +
                    " is missing or corrupt (its size or sha256 differs from the manifest)");
    }
  }
}

bool ranks_before(const CheckpointInfo& a, const CheckpointInfo& b,
                  const CheckpointConfig& config) {
  const auto& attribute = config.score_attribute;
  if (attribute.empty()) return a.iteration > b.iteration;
  auto score = [&](const CheckpointInfo& c) {
    return c.metrics.is_object() ? c.metrics.value(attribute, json()) : json();
  };
  // A missing score, or NaN (which orders against nothing), ranks last.
  auto usable = [](const json& s) { return s.is_number() && !std::isnan(s.get<double>()); };
  auto sa = score(a), sb = score(b);
  if (!usable(sa) || !usable(sb)) return usable(sa) && !usable(sb);
  return config.score_max ? sa.get<double>() > sb.get<double>()
                          : sa.get<double>() < sb.get<double>();
}

}  // namespace trainrun::run_directory

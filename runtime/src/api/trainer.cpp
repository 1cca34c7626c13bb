#include <train/version.h>
#include <trainrun/error.h>
#include <trainrun/trainer.h>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "api/console.h"
#include "api/progress.h"
#include "api/report_page.h"
#include "common/constants.h"
#include "common/fd.h"
#include "common/hash.h"
#include "common/in_process.h"
#include "common/metrics_format.h"
#include "common/network.h"
#include "common/paths.h"
#include "common/run_key.h"
#include "common/seconds.h"
#include "common/torch_line.h"
#include "controller/checkpoint_store.h"
#include "controller/controller.h"
#include "controller/run_storage.h"
#include "plugin/plugin_file.h"
#include "storage/run_directory.h"
#include "storage/run_objects.h"
#include "storage/s3_client.h"
#include "storage/s3_config.h"

namespace trainrun {
namespace {

std::string utc_now(const char* format) {
  std::time_t now = std::time(nullptr);
  char buffer[64];
  std::strftime(buffer, sizeof(buffer), format, std::gmtime(&now));
  return buffer;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw PluginError("cannot read plugin " + path.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// Calls `f` with each line of `text`, without its newline (or "\r\n").
template <typename F>
void for_each_line(std::string_view text, const F& f) {
  while (!text.empty()) {
    auto end = text.find('\n');
    auto line = text.substr(0, end);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    f(line);
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
}

// Hands each formatted line, without its newline, to a host program's function.
class LineSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit LineSink(std::function<void(std::string_view)> out) : out_(std::move(out)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    // A message of several lines (a multi-line exception) is several lines.
    for_each_line(std::string_view(formatted.data(), formatted.size()), [&](std::string_view line) {
      try {
        out_(line);
      } catch (...) {  // the host's bug: the run goes on without this line
      }
    });
  }
  void flush_() override {}

 private:
  std::function<void(std::string_view)> out_;
};

// The controller's messages: the terminal (or the host's function) and
// logs/controller.log.
std::shared_ptr<spdlog::logger> make_logger(const RunStorage& storage, bool verbose,
                                            const Callbacks& callbacks, Console* console) {
  std::vector<spdlog::sink_ptr> sinks;
  const auto level = verbose ? spdlog::level::info : spdlog::level::err;
  if (callbacks.on_output) {
    auto lines = std::make_shared<LineSink>(callbacks.on_output);
    lines->set_pattern("[trainrun] %v");
    lines->set_level(level);
    sinks.push_back(lines);
  }
  if (callbacks.log_sink) sinks.push_back(callbacks.log_sink);  // its level and pattern
  if (console != nullptr) {
    auto terminal = console->sink();
    terminal->set_pattern("[trainrun] %v");
    terminal->set_level(level);
    sinks.push_back(terminal);
  }
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(
      (storage.logs_dir() / "controller.log").string());
  file->set_pattern("%Y-%m-%d %H:%M:%S.%e %l %v");
  sinks.push_back(file);
  auto logger = std::make_shared<spdlog::logger>("trainrun", sinks.begin(), sinks.end());
  logger->set_level(spdlog::level::info);
  logger->flush_on(spdlog::level::info);
  return logger;
}

// Calls a host's callback; what it throws is logged, and the run goes on.
template <typename F, typename... Args>
void call_host(spdlog::logger& log, const char* name, const F& callback, const Args&... args) {
  if (!callback) return;
  try {
    callback(args...);
  } catch (const std::exception& e) {
    log.warn("the {} callback raised: {}", name, e.what());
  } catch (...) {
    log.warn("the {} callback raised a non-standard exception", name);
  }
}

bool is_loopback_host(const std::string& host) {
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "::1";
}

void check_network(TrainerOptions& options) {
  auto& scaling = options.scaling;
  const auto& network = options.network;
  if (scaling.local_workers < 0)
    scaling.local_workers = network.listen.empty() ? scaling.num_workers : 0;
  if (scaling.local_workers > scaling.num_workers) {
    throw UsageError("--local-workers " + std::to_string(scaling.local_workers) +
                     " is more than --num-workers " + std::to_string(scaling.num_workers));
  }
  if (network.listen.empty()) {
    if (scaling.local_workers < scaling.num_workers) {
      throw UsageError(
          "only " + std::to_string(scaling.local_workers) + " of " +
          std::to_string(scaling.num_workers) +
          " workers are local: the others need --listen tcp://ADDRESS:PORT to connect to");
    }
    return;
  }
  auto endpoint = parse_tcp_endpoint(network.listen);
  if (!endpoint) {
    throw UsageError("--listen takes tcp://ADDRESS:PORT, got '" + network.listen + "'");
  }
  if (network.auth_key_file.empty() && !network.insecure && !is_loopback_host(endpoint->host)) {
    throw UsageError("listening on " + network.listen +
                     " without --auth-key lets anyone who reaches it join the run: give it a run "
                     "key (trainrun keygen FILE), or --insecure on a network you trust");
  }
  if (!network.auth_key_file.empty()) (void)read_run_key(network.auth_key_file);  // fails early
}

// What a run in this process cannot take: each refused in one line, in the
// command's words (the API's options are named alike).
void check_in_process(TrainerOptions& options) {
  const auto& scaling = options.scaling;
  const std::string local = "--local runs the train function in this process as the one rank";
  if (scaling.num_workers != 1) {
    throw UsageError(local + ": it takes no --num-workers " + std::to_string(scaling.num_workers));
  }
  if (!options.network.listen.empty()) {
    throw UsageError(local + ": it takes no --listen (no worker connects to it)");
  }
  if (scaling.local_workers != -1 && scaling.local_workers != 1) {
    throw UsageError(local + ": it takes no --local-workers " +
                     std::to_string(scaling.local_workers));
  }
  if (options.failure.max_failures != 0) {
    throw UsageError(local +
                     ": it takes no --max-failures (a failure ends it; run it again to "
                     "resume from its latest checkpoint)");
  }
  options.failure.standby = false;
}

// A port another process holds is the user's to change: refused before the
// run directory exists. ZeroMQ's listeners set SO_REUSEADDR, so the
// controller binds it again at once.
void check_port_free(const std::string& listen) {
  auto endpoint = parse_tcp_endpoint(listen);
  if (!endpoint || endpoint->port == "0" || endpoint->port == "*") return;
  zmq::context_t context;
  zmq::socket_t probe(context, zmq::socket_type::router);
  probe.set(zmq::sockopt::linger, 0);
  try {
    probe.bind(listen);
  } catch (const zmq::error_t& e) {
    throw UsageError("cannot listen on " + listen + ": " + e.what());
  }
}

// Keeps the run directory's report.html current without letting a long
// history make the run pay for it: a page that took t to write waits 10 t
// (and at least kPageInterval) before the next. A page that cannot be
// written costs a warning, once, and never the run.
class ReportPageWriter {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kPageInterval = std::chrono::seconds(2);

  ReportPageWriter(std::filesystem::path run_dir, spdlog::logger& log)
      : run_dir_(std::move(run_dir)), log_(log) {}

  void maybe_write() {
    if (Clock::now() >= next_) write(/*live=*/true);
  }
  void write(bool live) {
    auto start = Clock::now();
    try {
      write_report_page(run_dir_, run_dir_ / "report.html", live);
    } catch (const std::exception& e) {
      if (!warned_) log_.warn("cannot write report.html: {}", e.what());
      warned_ = true;
    }
    auto took = Clock::now() - start;
    next_ = Clock::now() + std::max<Clock::duration>(kPageInterval, 10 * took);
  }

 private:
  std::filesystem::path run_dir_;
  spdlog::logger& log_;
  Clock::time_point next_{};
  bool warned_ = false;
};

// The storage path as a filesystem path. A URI ("s3://bucket/prefix", as Ray
// Train users write it) would otherwise become a relative directory named
// "s3:", and the checkpoints would stay on the controller's disk: refused.
// "file://" names a path (file:///abs, file://localhost/abs).
std::filesystem::path local_storage_path(const std::filesystem::path& given) {
  static const std::regex kUri("([A-Za-z][A-Za-z0-9+.-]*)://(.*)");
  const std::string text = given.string();
  std::smatch match;
  if (!std::regex_match(text, match, kUri)) return given;
  if (s3::is_s3_url(text)) {
    s3::parse_url(text);  // throws UsageError naming what is wrong
    return given;
  }
  std::string scheme = match[1].str();
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::string rest = match[2].str();
  if (scheme == "file") {
    if (rest.rfind("localhost/", 0) == 0) rest.erase(0, std::string("localhost").size());
    if (!rest.empty() && rest[0] == '/') return rest;
    throw UsageError("storage path " + text.substr(0, 256) +
                     ": a file:// URI must name an absolute path on this host (file:///path)");
  }
  if (scheme == "s3") {
    throw UsageError("storage path " + text.substr(0, 256) + ": write the scheme as s3://");
  }
  throw UsageError("storage path " + text.substr(0, 256) + ": " + scheme +
                   ":// storage is not supported; give s3://BUCKET/PREFIX or a filesystem path "
                   "(local, or a shared filesystem every node mounts)");
}

}  // namespace

// The Trainer's eventfd lives as long as it does, so that stop() is one
// write(): safe from any thread, and from a signal handler.
struct Trainer::State {
  State() : stop_fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (!stop_fd) throw IoError(std::string("cannot create an eventfd: ") + std::strerror(errno));
  }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  std::atomic<bool> running{false};
  const Fd stop_fd;
};

Trainer::~Trainer() = default;

void Trainer::stop() {
  uint64_t one = 1;
  [[maybe_unused]] auto written = ::write(state_->stop_fd.get(), &one, sizeof(one));
}

Trainer::Trainer(TrainerOptions options, Callbacks callbacks)
    : options_(std::move(options)),
      callbacks_(std::move(callbacks)),
      state_(std::make_shared<State>()) {
  if (options_.plugin.empty()) throw UsageError("no plugin given");
  if (options_.scaling.num_workers < 1) {
    throw UsageError("num_workers must be at least 1, got " +
                     std::to_string(options_.scaling.num_workers));
  }
  auto& scaling = options_.scaling;
  if (scaling.min_workers == 0) scaling.min_workers = scaling.num_workers;
  if (scaling.min_workers < 1 || scaling.min_workers > scaling.num_workers) {
    throw UsageError("the fewest workers (" + std::to_string(scaling.min_workers) +
                     ") must be between 1 and num_workers (" + std::to_string(scaling.num_workers) +
                     ")");
  }
  if (options_.scaling.cpus_per_worker < 0) {
    throw UsageError("cpus_per_worker must be at least 1 (or 0 for the default), got " +
                     std::to_string(options_.scaling.cpus_per_worker));
  }
  if (!options_.config.is_object()) throw UsageError("the config must be a JSON object");
  if (options_.scaling.use_gpu && !TRAINRUN_WITH_CUDA) {
    throw UsageError(
        "--use-gpu needs a LibTorch built with CUDA; this trainrun was built with a "
        "CPU-only LibTorch " TRAINRUN_TORCH_VERSION);
  }
  if (options_.checkpoint.num_to_keep < 0) {
    throw UsageError("num_to_keep must be at least 0, got " +
                     std::to_string(options_.checkpoint.num_to_keep));
  }
  if (options_.run.heartbeat_timeout < kMinHeartbeatTimeout) {
    throw UsageError("the heartbeat timeout must be at least " +
                     seconds_text(kMinHeartbeatTimeout) + ", got " +
                     seconds_text(options_.run.heartbeat_timeout));
  }
  if (options_.failure.max_failures < -1) {
    throw UsageError("max_failures must be -1 (no limit) or more, got " +
                     std::to_string(options_.failure.max_failures));
  }
  if (options_.failure.in_place && options_.failure.max_failures == 0) {
    throw UsageError(
        "recovery in place needs failures to survive: pass --max-failures N (or -1) with it");
  }
  if (options_.failure.in_place && options_.scaling.use_gpu) {
    throw UsageError(
        "recovery in place works on the CPU (Gloo) only: a GPU run restarts its group "
        "(--recovery restart)");
  }
  if (const auto [first, last] = options_.profile_steps;
      (first != 0 || last != 0) && (first < 1 || last < first)) {
    throw UsageError("profile steps must be FIRST:LAST with 1 <= FIRST <= LAST, got " +
                     std::to_string(first) + ":" + std::to_string(last));
  }
  if (options_.run.startup_timeout.count() <= 0 || options_.run.collective_timeout.count() <= 0) {
    throw UsageError("timeouts must be positive");
  }
  if (options_.progress_interval < std::chrono::seconds(0) ||
      options_.progress_interval > std::chrono::hours(24)) {
    throw UsageError("the progress interval must be 0 to 86400 seconds, got " +
                     std::to_string(options_.progress_interval.count()));
  }
  if (scaling.in_process) check_in_process(options_);
  check_network(options_);
  auto& run = options_.run;
  if (s3::is_s3_url(run.resume_from.string())) {
    // A checkpoint in object storage: its manifest, read with this process's
    // credentials, says it is committed.
    auto location = s3::parse_url(run.resume_from.string());
    std::optional<uint64_t> manifest;
    try {
      manifest = s3::Client(s3::resolve_config(), location.bucket)
                     .head(location.key(run_directory::kManifestFile));
    } catch (const IoError& e) {
      throw UsageError("--resume-from " + location.url() + ": " + e.what());
    }
    if (!manifest) {
      throw UsageError("--resume-from " + location.url() +
                       " is not a committed checkpoint (no manifest.json)");
    }
    run.resume_from = location.url();
  } else if (!run.resume_from.empty()) {
    if (!std::filesystem::exists(run.resume_from / "manifest.json")) {
      throw UsageError("--resume-from " + run.resume_from.string() +
                       " is not a committed checkpoint (no manifest.json)");
    }
    run.resume_from = std::filesystem::absolute(run.resume_from);
  }
  if (run.name.empty()) run.name = "trainrun-" + utc_now("%Y-%m-%d_%H-%M-%S");
  if (run.name.find('/') != std::string::npos || run.name == "." || run.name == "..") {
    throw UsageError("run name '" + run.name + "' must not contain '/'");
  }
  run.storage_path = local_storage_path(run.storage_path);
  if (run.storage_path.empty()) {
    const char* home = std::getenv("HOME");
    run.storage_path = std::filesystem::path(home != nullptr ? home : ".") / "trainrun_results";
  }
  if (!s3::is_s3_url(run.storage_path.string())) {
    run.storage_path = std::filesystem::absolute(run.storage_path);
  }
  if (options_.cache_dir.empty()) options_.cache_dir = default_cache_dir();
  if (options_.worker_executable.empty()) {
    options_.worker_executable = find_worker_executable();
  }
  // Found now: without it the run cannot start.
  if (options_.scaling.in_process) (void)find_in_process_module(options_.worker_executable);
}

Result Trainer::fit() {
  if (state_->running.exchange(true)) {
    throw UsageError("fit() is already running on this Trainer");
  }
  struct Done {
    State& state;
    ~Done() { state.running = false; }
  } done{*state_};
  // A stop() from before this fit() does not end it.
  uint64_t stale = 0;
  [[maybe_unused]] auto got = ::read(state_->stop_fd.get(), &stale, sizeof(stale));
  // Inspect the plugin before anything starts: a bad one costs no worker.
  auto plugin = inspect_plugin_file(options_.plugin);
  auto entry = resolve_entry(plugin, options_.entry);
  ControllerSetup setup;
  setup.options = options_;
  setup.plugin_bytes = std::make_shared<const std::string>(read_file(options_.plugin));
  Sha256 hash;
  hash.update(setup.plugin_bytes->data(), setup.plugin_bytes->size());
  setup.plugin_sha256 = hash.hex_digest();
  setup.entry = entry;
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  setup.cpus_per_worker = options_.scaling.cpus_per_worker > 0
                              ? options_.scaling.cpus_per_worker
                              : std::max(1, cores / std::max(1, options_.scaling.local_workers));
  if (!options_.network.auth_key_file.empty()) {
    setup.keys = RunKeys::derive(read_run_key(options_.network.auth_key_file));
  }

  if (!options_.network.listen.empty()) check_port_free(options_.network.listen);
  // A run in object storage: its bucket and credentials are checked before
  // anything starts, and the controller works on a local copy of its files.
  std::unique_ptr<RunObjects> objects;
  auto local_root = options_.run.storage_path;
  if (s3::is_s3_url(options_.run.storage_path.string())) {
    // Every call of the controller's ends well within the heartbeat timeout:
    // its loop, which sends the heartbeats, waits for it.
    s3::ClientOptions calls;
    calls.call_timeout = std::max(
        std::chrono::milliseconds(2000),
        std::chrono::duration_cast<std::chrono::milliseconds>(options_.run.heartbeat_timeout / 4));
    calls.connect_timeout = std::min(calls.connect_timeout, calls.call_timeout);
    calls.stall_timeout = std::min(calls.stall_timeout, calls.call_timeout);
    objects =
        std::make_unique<RunObjects>(options_.run.storage_path.string(), options_.run.name, calls);
    objects->check_access();
    auto location = s3::parse_url(options_.run.storage_path.string());
    local_root = options_.cache_dir / "runs" / location.bucket / location.prefix;
  }
  RunStorage storage(local_root, options_.run.name, objects.get());  // holds the run's lock
  // What earlier runs of this name recorded: this one's iterations continue them.
  const int64_t earlier_reports = storage.last_result() ? storage.last_result()->iteration : 0;
  CheckpointStore checkpoints(storage.dir(), options_.checkpoint,
                              objects.get());  // throws if its state names a missing checkpoint
  // Without the host's own output, the run's lines go to the terminal.
  std::unique_ptr<Console> console;
  if (!callbacks_.on_output && !callbacks_.log_sink) {
    console = std::make_unique<Console>(
        // The train function's own output, in this process, goes straight to
        // the terminal: a live status line would be drawn over it.
        options_.status_line && !options_.scaling.in_process && options_.verbose &&
            options_.progress_interval.count() > 0 && Console::stdout_is_terminal(),
        Console::stdout_is_terminal() && std::getenv("NO_COLOR") == nullptr);
  }
  // Outlives the controller.
  auto logger = make_logger(storage, options_.verbose, callbacks_, console.get());
  setup.log = logger;
  auto& log = *logger;
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  // Earlier runs of this name: run.json keeps their attempts, and this run's
  // are numbered after them.
  std::vector<AttemptInfo> earlier_attempts;
  try {
    if (auto earlier = run_directory::read_run_info(storage.dir())) {
      earlier_attempts = earlier->attempts;
    }
  } catch (const std::exception& e) {  // unreadable: this run's record starts again
    log.warn("the earlier run.json of {} is unreadable ({}); its attempts are not kept",
             options_.run.name, e.what());
  }
  // The highest number any record holds: result.jsonl outlives a lost run.json.
  setup.attempt_offset = earlier_attempts.empty() ? 0 : earlier_attempts.back().attempt;
  if (const auto* last = storage.last_result()) {
    setup.attempt_offset = std::max(setup.attempt_offset, last->attempt);
  }
  auto all_attempts = [&](const std::vector<AttemptInfo>& these) {
    auto all = earlier_attempts;
    all.insert(all.end(), these.begin(), these.end());
    // The first and the latest, as within a run.
    constexpr size_t kKept = 100;
    if (all.size() > kKept) all.erase(all.begin() + 1, all.end() - (kKept - 1));
    return all;
  };
  run_directory::RunInfo info;
  info.name = options_.run.name;
  info.storage_path = options_.run.storage_path.string();
  info.plugin = {std::filesystem::absolute(options_.plugin).string(), setup.plugin_sha256, entry,
                 plugin.sdk_version, plugin.torch_version};
  info.scaling = options_.scaling;
  info.scaling.cpus_per_worker = setup.cpus_per_worker;
  info.config = options_.config;
  info.checkpoint = options_.checkpoint;
  info.trainrun_version = TRAIN_SDK_VERSION;
  info.torch_version = TRAINRUN_TORCH_VERSION;
  info.controller_host = host;
  info.started_at = run_directory::timestamp_now();
  info.max_failures = options_.failure.max_failures;
  info.attempts = earlier_attempts;  // kept if this run ends before its first attempt
  storage.write_run_info(info);
  storage.write_error(std::nullopt);
  log.info("run '{}': {} x {} ({}), results in {}", options_.run.name, options_.scaling.num_workers,
           entry, options_.plugin.filename().string(),
           objects ? objects->url() : storage.dir().string());

  const bool from_given = !options_.run.resume_from.empty() && options_.run.resume_from_first;
  if (auto latest = checkpoints.latest(); latest && !from_given) {
    log.info("resuming from {} (iteration {})", latest->name, latest->iteration);
  } else if (!options_.run.resume_from.empty()) {
    log.info("starting from {}", options_.run.resume_from.string());
  }
  // From here on the run has a record: whatever goes wrong ends it with a
  // final status and error.json.
  RunOutcome run;
  ProgressTracker progress(ProgressTracker::planned_epochs(options_.config),
                           ProgressTracker::Clock::now());
  // run.json lists every attempt as it starts and ends.
  // (Also when an attempt's world size is decided: one start callback each.)
  int started = 0;
  setup.on_attempts = [&](const std::vector<AttemptInfo>& attempts) {
    info.attempts = all_attempts(attempts);
    storage.write_run_info(info);
    const auto& latest = attempts.back();
    if (latest.ended_at.empty()) {
      if (latest.attempt == started) return;
      started = latest.attempt;
      call_host(log, "on_attempt_start", callbacks_.on_attempt_start, latest);
    } else {
      call_host(log, "on_attempt_end", callbacks_.on_attempt_end, latest);
    }
  };
  // report.html in the run directory: at the start, after reports (at most
  // every few seconds, and never more than a tenth of the time), at the end.
  ReportPageWriter page(storage.dir(), log);
  page.write(/*live=*/true);
  setup.on_report = [&](const ReportRecord& record) {
    page.maybe_write();
    progress.set_metrics(record.metrics);
    call_host(log, "on_report", callbacks_.on_report, record);
  };
  if (callbacks_.should_stop) {
    setup.should_stop = [&](const ReportRecord& record) -> std::optional<std::string> {
      try {
        return callbacks_.should_stop(record);
      } catch (const std::exception& e) {
        log.warn("should_stop raised ({}); the run goes on", e.what());
      }
      return std::nullopt;
    };
  }
  setup.on_checkpoint = [&](const CheckpointInfo& checkpoint) {
    page.maybe_write();
    call_host(log, "on_checkpoint", callbacks_.on_checkpoint, checkpoint);
  };
  // Progress: to the host, and on the terminal's status line, or a plain line
  // every progress interval.
  auto next_progress_line = ProgressTracker::Clock::now() + options_.progress_interval;
  setup.on_progress = [&](const ProgressSample& sample) {
    auto now = ProgressTracker::Clock::now();
    auto p = progress.update(sample, now);
    call_host(log, "on_progress", callbacks_.on_progress, p);
    if (!options_.verbose || options_.progress_interval.count() <= 0) return;
    if (console && console->live()) {
      console->status(status_line(p, Console::status_width()));
    } else if (now >= next_progress_line) {
      next_progress_line = now + options_.progress_interval;
      log.info("{}", progress_line(p));
    }
  };
  // Worker output goes where the controller's lines go.
  if (console) {
    setup.output = [&console = *console](int stream, std::string_view line) {
      console.line(stream, line);
    };
  } else {
    setup.output = [on_output = callbacks_.on_output, sink = callbacks_.log_sink, &log](
                       int, std::string_view text) {
      for_each_line(text, [&](std::string_view line) {
        call_host(log, "on_output", on_output, line);
        if (sink && sink->should_log(spdlog::level::info)) {
          std::function<void()> to_sink = [&] {
            sink->log(spdlog::details::log_msg("trainrun", spdlog::level::info, line));
          };
          call_host(log, "log_sink", to_sink);
        }
      });
    };
  }
  setup.stop_fd = state_->stop_fd.get();
  try {
    Controller controller(std::move(setup), storage, checkpoints);
    run = controller.run();
  } catch (const UsageError& e) {
    run.error = RunError{FailureKind::kUsage, e.what(), -1, "", 0};
  } catch (const std::exception& e) {
    run.error =
        RunError{FailureKind::kInternal, std::string("internal error: ") + e.what(), -1, "", 0};
  }

  if (console) console->clear();  // the closing lines go below the run's output
  info.ended_at = run_directory::timestamp_now();
  info.attempts = all_attempts(run.attempts);
  info.status = !run.error                                     ? RunStatus::kFinished
                : run.error->kind == FailureKind::kInterrupted ? RunStatus::kInterrupted
                                                               : RunStatus::kFailed;
  const std::string results_at = objects ? objects->url() : storage.dir().string();
  try {
    storage.write_run_info(info, /*push=*/false);
    if (run.error) storage.write_error(run.error, info.attempts);
    page.write(/*live=*/false);
    // A run in object storage: the logs and the page too, once, and run.json
    // last, so that a stored status of finished comes with everything else.
    std::vector<std::string> also = {"report.html"};
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(storage.logs_dir(), ec)) {
      also.push_back(std::string(run_directory::kLogsDir) + "/" + entry.path().filename().string());
    }
    for (const auto& entry : std::filesystem::directory_iterator(storage.dir(), ec)) {
      const auto name = entry.path().filename().string();
      if (name.rfind("events.out.tfevents.", 0) == 0) also.push_back(name);
    }
    also.push_back(run_directory::kRunInfoFile);
    storage.flush(also);
  } catch (const IoError& e) {  // the store went away: its earlier state stays
    log.error("cannot save the run's final state to {}: {} (a copy is in {})", results_at, e.what(),
              storage.dir().string());
    if (!run.error) run.error = RunError{FailureKind::kStorage, e.what(), -1, "", 0};
    info.status = RunStatus::kFailed;
  }
  // What the run left, read back as `trainrun results` would.
  Result result = load_result(storage.dir());
  if (objects) {
    result.path = objects->url();
    if (!result.checkpoint.empty()) {
      result.checkpoint = objects->url(result.checkpoint.filename().string());
    }
    for (auto& c : result.best_checkpoints) c.path = objects->url(c.name);
  }
  result.status = info.status;
  result.error = run.error;
  result.wall_seconds = run.wall_seconds;
  if (result.error) {
    // This run's attempts: earlier runs of the name had theirs.
    const int made = result.error->attempt - setup.attempt_offset;
    auto attempts = made > 1 ? " after " + std::to_string(made) + " attempts" : std::string();
    log.error("run {}{}: {}", result.interrupted() ? "interrupted" : "failed", attempts,
              result.error->summary());
  } else {
    const int64_t reports = result.iterations - earlier_reports;
    if (earlier_reports == 0) {
      log.info("run finished: {} {} in {:.1f} s", reports, reports == 1 ? "report" : "reports",
               result.wall_seconds);
    } else {  // the report lines counted on from the earlier runs; this says both
      log.info("run finished: {} {} in {:.1f} s, {} with the earlier runs of this name ({:.1f} s)",
               reports, reports == 1 ? "report" : "reports", result.wall_seconds, result.iterations,
               result.history.empty() ? 0.0 : result.history.back().time_total_s);
    }
  }
  if (!result.metrics.is_null()) log.info("last metrics: {}", format_metrics(result.metrics));
  for (const auto& c : result.best_checkpoints) {
    log.info("checkpoint {} (iteration {}): {}", c.name, c.iteration, format_metrics(c.metrics));
  }
  log.info("results: {}", results_at);
  call_host(log, "on_end", callbacks_.on_end, result);
  return result;
}

}  // namespace trainrun

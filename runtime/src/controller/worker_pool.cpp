#include "controller/worker_pool.h"

#include <trainrun/error.h>

#include <dlfcn.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "common/in_process.h"
#include "common/seconds.h"
#include "common/secret.h"
#include "common/worker_name.h"

namespace trainrun {

// The worker's thread and what its entry reads and writes. The thread holds
// it too: a slot that goes first (the controller ended) leaves it running.
struct InProcessThread {
  std::string connect, secret, cache_dir, helper, plugin;  // what args points into
  trainrun_in_process_v1 args{};
  std::thread thread;
  Fd done_fd;  // an eventfd, written as the entry returns
  Fd stop_fd;  // an eventfd the pool writes to end it: its SIGTERM
  std::atomic<bool> done{false};
  int code = 1;
  ~InProcessThread() {
    if (thread.joinable()) thread.detach();
  }
  void stop() {
    uint64_t one = 1;
    [[maybe_unused]] auto written = ::write(stop_fd.get(), &one, sizeof(one));
  }
};

std::string WorkerSlot::describe() const {
  return describe_worker(display_rank(), host, process.pid);
}

std::string process_key(const std::string& host, int64_t pid) {
  return host + "/" + std::to_string(pid);
}

namespace {

// What a worker's output prefix says: "[rank 1 (host, pid 42)]".
std::string output_prefix(const WorkerSlot& worker) { return "[" + worker.describe() + "]"; }

// worker-<rank>.log; before the ranks are known, worker-<index>.starting.log.
std::filesystem::path log_path(const std::filesystem::path& logs_dir, const std::string& name) {
  return logs_dir.empty() ? logs_dir : logs_dir / ("worker-" + name + ".log");
}

std::string starting(int index) { return std::to_string(index) + ".starting"; }

// An epoll event's data: the worker's launch index and the stream (0 stdout,
// 1 stderr), or kExitKey for its pidfd.
constexpr int kExitKey = 2;
uint64_t stream_key(int index, int stream) { return static_cast<uint64_t>(index) * 3 + stream; }

// A descriptor that becomes readable when the process exits (Linux 5.3), or none.
Fd open_pidfd(pid_t pid) { return Fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0))); }

// The module's entry, loaded once and never unloaded (LibTorch comes with it).
trainrun_in_process_fn_v1 in_process_entry(const std::filesystem::path& module) {
  static std::mutex mutex;
  static std::map<std::filesystem::path, trainrun_in_process_fn_v1> loaded;
  std::lock_guard lock(mutex);
  if (auto found = loaded.find(module); found != loaded.end()) return found->second;
  void* handle = ::dlopen(module.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* detail = ::dlerror();
    throw IoError("cannot load " + module.string() + ": " + (detail != nullptr ? detail : "?"));
  }
  auto entry = reinterpret_cast<trainrun_in_process_fn_v1>(::dlsym(handle, kInProcessEntry));
  if (entry == nullptr) {
    throw IoError(module.string() + " has no " + kInProcessEntry + ": it is from another build");
  }
  return loaded[module] = entry;
}

}  // namespace

WorkerPool::WorkerPool() : epoll_fd_(::epoll_create1(EPOLL_CLOEXEC)) {
  if (!epoll_fd_) throw IoError(std::string("cannot create an epoll set: ") + strerror(errno));
}

// A worker thread still running is told to end; it holds what it uses.
WorkerPool::~WorkerPool() {
  for (auto& worker : workers_) {
    if (worker.in_process() && !worker.exited) worker.thread->stop();
  }
}

void WorkerPool::spawn(int count, const LaunchOptions& launch) {
  logs_dir_ = launch.logs_dir;
  echo_ = launch.echo;
  // Slots hold pointers into workers_ (by_rank_, by_connection_): no reallocation.
  TRAINRUN_CHECK(workers_.size() + static_cast<size_t>(count) <= capacity_ + spare_,
                 "room reserved");
  if (launch.in_process) {
    TRAINRUN_CHECK(count == 1 && workers_.empty(), "one in-process worker");
    spawn_in_process(launch);
    return;
  }
  auto threads = std::to_string(launch.threads);
  for (int n = 0; n < count; ++n) {
    const int i = size();  // its launch index: after those already here
    auto scratch = launch.scratch_dir / ("worker-" + std::to_string(i));
    std::error_code ec;
    std::filesystem::create_directory(scratch, ec);
    if (ec) throw IoError("cannot create " + scratch.string() + ": " + ec.message());
    auto process = spawn_local_worker(
        launch.executable,
        {"--connect", launch.endpoint, "--index", std::to_string(i), "--cache-dir",
         launch.cache_dir.string(), "--startup-timeout", seconds_arg(launch.startup_timeout)},
        {"OMP_NUM_THREADS=" + threads, "MKL_NUM_THREADS=" + threads, "TMPDIR=" + scratch.string(),
         std::string(kSecretVariable) + "=" + launch.secret});
    // The output owns the pipes from here; epoll watches them by number.
    const int pipes[] = {process.stdout_fd.get(), process.stderr_fd.get()};
    auto& worker = workers_.emplace_back();
    worker.index = i;
    worker.process.pid = process.pid;
    worker.scratch = scratch;
    worker.last_heard = Clock::now();
    ++running_;
    worker.output = std::make_unique<WorkerOutput>(
        std::move(process.stdout_fd), std::move(process.stderr_fd), output_prefix(worker),
        log_path(logs_dir_, starting(i)), echo_);
    // Where pidfds are missing (before Linux 5.3) exits are found by polling.
    worker.pidfd = open_pidfd(process.pid);
    for (int stream = 0; stream <= kExitKey; ++stream) {
      epoll_event event{};
      event.events = EPOLLIN;
      event.data.u64 = stream_key(i, stream);
      int fd = stream == kExitKey ? worker.pidfd.get() : pipes[stream];
      if (fd < 0) continue;
      if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
        throw IoError(std::string("cannot watch a worker's output: ") + strerror(errno));
      }
    }
  }
}

void WorkerPool::spawn_in_process(const LaunchOptions& launch) {
  auto entry = in_process_entry(launch.in_process_module);
  auto state = std::make_shared<InProcessThread>();
  state->connect = launch.endpoint;
  state->secret = launch.secret;
  state->cache_dir = launch.cache_dir.string();
  state->helper = launch.executable.string();
  state->plugin = std::filesystem::absolute(launch.plugin).string();
  state->args.struct_size = sizeof(state->args);
  state->args.connect = state->connect.c_str();
  state->args.secret = state->secret.c_str();
  state->args.cache_dir = state->cache_dir.c_str();
  state->args.startup_timeout_ms = launch.startup_timeout.count();
  state->args.helper_executable = state->helper.c_str();
  state->args.plugin = state->plugin.c_str();
  state->done_fd = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  state->stop_fd = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!state->done_fd || !state->stop_fd) {
    throw IoError(std::string("cannot create an eventfd: ") + strerror(errno));
  }
  state->args.stop_fd = state->stop_fd.get();
  // What torchrun exports, for code written for it: set here, on the
  // controller's thread, before any thread of the worker's reads it.
  for (const char* name : {"RANK", "LOCAL_RANK", "GROUP_RANK"}) ::setenv(name, "0", 1);
  for (const char* name : {"WORLD_SIZE", "LOCAL_WORLD_SIZE"}) ::setenv(name, "1", 1);
  auto& worker = workers_.emplace_back();
  worker.index = 0;
  worker.process.pid = ::getpid();
  worker.last_heard = Clock::now();
  worker.thread = state;
  // No pipes and no log: what the train function prints goes where this
  // process's output goes.
  worker.output = std::make_unique<WorkerOutput>(Fd(), Fd(), output_prefix(worker),
                                                 std::filesystem::path(), LineEcho());
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = stream_key(0, kExitKey);
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, state->done_fd.get(), &event) != 0) {
    throw IoError(std::string("cannot watch the in-process worker: ") + strerror(errno));
  }
  state->thread = std::thread([state, entry] {
    state->code = entry(&state->args);
    state->done = true;
    uint64_t one = 1;
    [[maybe_unused]] auto written = ::write(state->done_fd.get(), &one, sizeof(one));
  });
  ++running_;
}

void WorkerPool::reserve(int capacity, int spare) {
  capacity_ = static_cast<size_t>(capacity);
  spare_ = static_cast<size_t>(spare);
  workers_.reserve(capacity_ + spare_);
}

void WorkerPool::clear(int capacity) {
  TRAINRUN_CHECK(running_ == 0, "clear() with local workers running");
  by_rank_.clear();
  by_connection_.clear();
  remote_by_process_.clear();
  workers_.clear();  // closes their output: a closed descriptor leaves the epoll set
  reserve(capacity);
}

WorkerSlot& WorkerPool::spawn_replacement(const LaunchOptions& launch, int rank) {
  spawn(1, launch);
  auto& worker = workers_.back();
  worker.rank = rank;
  by_rank_.at(static_cast<size_t>(rank)) = &worker;
  worker.output->set_prefix(output_prefix(worker));
  try {
    worker.output->move_log(
        log_path(logs_dir_, std::to_string(rank) + "-" + std::to_string(worker.index)));
  } catch (const std::exception&) {  // it keeps the log it started with
  }
  return worker;
}

void WorkerPool::rename(WorkerSlot& worker) {
  if (worker.output) worker.output->set_prefix(output_prefix(worker));
}

WorkerSlot* WorkerPool::add_remote(const std::string& host, pid_t pid) {
  if (workers_.size() >= capacity_) return nullptr;
  auto& worker = workers_.emplace_back();
  worker.index = size() - 1;
  worker.remote = true;
  worker.host = host;
  worker.process.pid = pid;
  worker.last_heard = Clock::now();
  worker.output = std::make_unique<WorkerOutput>(
      Fd(), Fd(), output_prefix(worker), log_path(logs_dir_, starting(worker.index)), echo_);
  remote_by_process_[process_key(host, pid)] = &worker;
  return &worker;
}

WorkerSlot* WorkerPool::remote_worker(const std::string& host, int64_t pid) {
  auto found = remote_by_process_.find(process_key(host, pid));
  return found == remote_by_process_.end() ? nullptr : found->second;
}

WorkerSlot* WorkerPool::at_index(int index) {
  return index >= 0 && index < size() ? &workers_[static_cast<size_t>(index)] : nullptr;
}

WorkerSlot* WorkerPool::at_rank(int rank) {
  return rank >= 0 && rank < static_cast<int>(by_rank_.size()) ? by_rank_[static_cast<size_t>(rank)]
                                                               : nullptr;
}

WorkerSlot* WorkerPool::by_connection(const std::string& routing_id) {
  auto found = by_connection_.find(routing_id);
  return found == by_connection_.end() ? nullptr : found->second;
}

void WorkerPool::set_main_id(WorkerSlot& worker, const std::string& routing_id) {
  worker.main_id = routing_id;
  by_connection_[routing_id] = &worker;
}

void WorkerPool::set_train_id(WorkerSlot& worker, const std::string& routing_id) {
  worker.train_id = routing_id;
  by_connection_[routing_id] = &worker;
}

void WorkerPool::set_store_id(WorkerSlot& worker, const std::string& routing_id) {
  worker.store_id = routing_id;
  by_connection_[routing_id] = &worker;
}

void WorkerPool::set_upload_id(WorkerSlot& worker, const std::string& routing_id) {
  worker.upload_id = routing_id;
  by_connection_[routing_id] = &worker;
}

void WorkerPool::assign(const std::vector<int>& ranks) {
  TRAINRUN_CHECK(ranks.size() == workers_.size(), "a rank for every worker");
  by_rank_.assign(workers_.size(), nullptr);
  for (auto& worker : workers_) {
    worker.rank = ranks[static_cast<size_t>(worker.index)];
    by_rank_[static_cast<size_t>(worker.rank)] = &worker;
    if (worker.output) {
      worker.output->set_prefix(output_prefix(worker));
      worker.output->move_log(log_path(logs_dir_, std::to_string(worker.rank)));
    }
  }
}

void WorkerPool::forward_output() {
  epoll_event events[64];
  int n;
  do {
    n = ::epoll_wait(epoll_fd_.get(), events, 64, 0);
    for (int i = 0; i < n; ++i) {
      auto key = events[i].data.u64;
      auto& worker = workers_[key / 3];
      if (key % 3 == kExitKey) {  // it exited: reap() closes the pidfd
        exits_ = true;
        const int fd = worker.in_process() ? worker.thread->done_fd.get() : worker.pidfd.get();
        ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
        continue;
      }
      // A closed descriptor leaves the epoll set by itself.
      worker.output->read(static_cast<int>(key % 3));
    }
  } while (n == 64);
}

std::vector<std::pair<WorkerSlot*, std::optional<int>>> WorkerPool::reap() {
  std::vector<std::pair<WorkerSlot*, std::optional<int>>> exits;
  if (running_ == 0) return exits;
  for (auto& worker : workers_) {
    if (worker.exited || worker.remote) continue;
    if (worker.in_process()) {
      if (!worker.thread->done) continue;
      worker.thread->thread.join();
      worker.exited = true;
      --running_;
      exits.emplace_back(&worker, (worker.thread->code & 0xff) << 8);  // as if it had exited
      continue;
    }
    int status = 0;
    pid_t got = ::waitpid(worker.process.pid, &status, WNOHANG);
    // ECHILD: a host program's waitpid(-1) took it; it is gone all the same.
    bool lost = got < 0 && errno == ECHILD;
    if (got != worker.process.pid && !lost) continue;
    worker.exited = true;
    --running_;
    if (worker.pidfd) {
      ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, worker.pidfd.get(), nullptr);
      worker.pidfd.reset();
    }
    worker.output->drain();
    std::error_code ec;
    std::filesystem::remove_all(worker.scratch, ec);  // however it ended
    exits.emplace_back(&worker, lost ? std::nullopt : std::optional<int>(status));
  }
  return exits;
}

bool WorkerPool::all_exited() const { return running_ == 0; }

bool WorkerPool::train_left_running() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const WorkerSlot& worker) {
    return worker.in_process() && worker.thread->done && worker.thread->args.train_left_running;
  });
}

void WorkerPool::signal_all(int signal) {
  for (auto& worker : workers_) {
    if (worker.exited || worker.remote) continue;
    if (worker.in_process()) {  // this process: the thread is told instead
      worker.thread->stop();
      continue;
    }
    ::kill(-worker.process.pid, signal);
    // A stopped process (SIGSTOP) takes SIGTERM only once it continues.
    if (signal == SIGTERM) ::kill(-worker.process.pid, SIGCONT);
  }
}

void WorkerPool::end_groups() {
  for (auto& worker : workers_) {
    if (!worker.remote && !worker.in_process()) ::kill(-worker.process.pid, SIGKILL);
  }
}

void WorkerPool::drain_output() {
  for (auto& worker : workers_) {
    if (worker.output) worker.output->drain();
  }
}

}  // namespace trainrun

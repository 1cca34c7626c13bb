// Train functions that exercise the runtime: each rank's context, failures on
// one rank while the others wait in a collective, mismatched report counts.

#include <train/train.h>

#include <torch/torch.h>

#include <spawn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

extern char** environ;

namespace {

// Blocks the calling rank in a collective that can only finish if every rank
// joins: the way a real peer waits when another rank fails.
void wait_in_collective() {
  std::vector<torch::Tensor> t{torch::ones({1})};
  train::process_group()->allreduce(t)->wait();
}

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "unset";
}

}  // namespace

// Prints and reports what each rank sees, and proves the process group works.
void context(const train::Config& config) {
  auto ctx = train::get_context();
  std::vector<torch::Tensor> rank{torch::tensor({static_cast<double>(ctx.world_rank())})};
  train::process_group()->allreduce(rank)->wait();
  std::cout << "context world_rank=" << ctx.world_rank() << " local_rank=" << ctx.local_rank()
            << " node_rank=" << ctx.node_rank() << " world_size=" << ctx.world_size()
            << " local_world_size=" << ctx.local_world_size() << " device=" << ctx.device()
            << " run_name=" << ctx.run_name() << " env_rank=" << env("RANK")
            << " env_world_size=" << env("WORLD_SIZE") << " threads=" << torch::get_num_threads()
            << std::endl;
  const int reports = config.get<int>("reports", 3);
  for (int i = 0; i < reports; ++i) {
    train::report({{"i", i},
                   {"world_rank", ctx.world_rank()},
                   {"world_size", ctx.world_size()},
                   {"rank_sum", rank[0].item<double>()},
                   {"label", config.get("label", "none")},
                   {"even", i % 2 == 0}});
  }
}

// Reports `steps` times, `sleep_ms` apart, and returns: the smallest real run.
void steps(const train::Config& config) {
  const int n = config.get<int>("steps", 1);
  const int sleep_ms = config.get<int>("sleep_ms", 0);
  for (int i = 0; i < n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    train::report({{"step", i}, {"loss", 1.0 / (i + 1)}});
  }
}

// Rank `fail_rank` throws after one report; the others wait in a collective.
// With long_utf8=true its message is 20,000 bytes of two-byte characters.
void throws(const train::Config& config) {
  auto ctx = train::get_context();
  train::report({{"phase", "started"}});
  if (ctx.world_rank() == config.get<int>("fail_rank", 1)) {
    if (config.get<bool>("long_utf8", false)) {
      std::string text;
      for (int i = 0; i < 10000; ++i) text += "\xc3\xa9";  // e with an acute accent
      throw std::runtime_error(text);
    }
    throw std::runtime_error("boom on rank " + std::to_string(ctx.world_rank()));
  }
  wait_in_collective();
}

// A write through a null pointer, in a function of its own: the crash's stack
// names it.
__attribute__((noinline)) void write_through_null(volatile int* where) { *where = 42; }

// Recursion without end: the stack overflows into its guard page, and the
// crash handler runs on its own stack.
__attribute__((noinline)) int overflow_stack(int depth) {
  volatile char frame[512];
  frame[depth % sizeof(frame)] = static_cast<char>(depth);
  if (depth < 0) return 0;  // never: keeps the compiler from seeing an endless loop
  return overflow_stack(depth + 1) + frame[0];
}

// Rank `fail_rank` dies by a signal (`how` = abort, segv, null: a write
// through a null pointer, call_null: a call through one, two_threads: two
// threads writing through a null pointer at once, or overflow: a stack
// overflow); the others wait. With at_start=true it
// dies before the first report.
void crash(const train::Config& config) {
  auto ctx = train::get_context();
  if (!config.get<bool>("at_start", false)) train::report({{"phase", "started"}});
  if (ctx.world_rank() == config.get<int>("fail_rank", 1)) {
    std::cerr << "rank " << ctx.world_rank() << " is about to crash" << std::endl;
    const auto how = config.get("how", "abort");
    if (how == std::string("segv")) std::raise(SIGSEGV);
    if (how == std::string("null")) write_through_null(nullptr);
    if (how == std::string("overflow")) std::cerr << overflow_stack(1) << std::endl;
    if (how == std::string("two_threads")) {  // both at once: one report, one death
      std::atomic<int> ready{0};
      auto crash_when_both = [&ready] {
        ++ready;
        while (ready.load() < 2) {
        }
        write_through_null(nullptr);
      };
      std::thread one(crash_when_both), two(crash_when_both);
      one.join();
      two.join();
    }
    if (how == std::string("call_null")) {
      void (*volatile nowhere)() = nullptr;
      nowhere();
    }
    std::abort();
  }
  wait_in_collective();
}

// Rank 1 reports once less than rank 0.
void mismatch(const train::Config&) {
  auto ctx = train::get_context();
  train::report({{"n", 1}});
  if (ctx.world_rank() == 0) train::report({{"n", 2}});
}

// Runs until it is stopped; with child=true it first starts `sleep 300` and
// prints "child <pid>".
void sleeps(const train::Config& config) {
  if (config.get<bool>("child", false)) {
    pid_t child = -1;
    char sleep[] = "sleep", seconds[] = "300";
    char* args[] = {sleep, seconds, nullptr};
    ::posix_spawnp(&child, "sleep", nullptr, nullptr, args, environ);
    std::cout << "child " << child << std::endl;
  }
  std::cout << "sleeping" << std::endl;
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// Rank `fail_rank` never joins the allreduce the others wait in: a hang in a
// collective, which the process group's timeout ends.
void hangs(const train::Config& config) {
  auto ctx = train::get_context();
  if (ctx.world_rank() == config.get<int>("fail_rank", 1)) {
    std::cout << "skipping the allreduce" << std::endl;
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::vector<torch::Tensor> tensors{torch::ones({4})};
  train::process_group()->allreduce(tensors)->wait();
}

TRAIN_FUNC(hangs);

// One report of `count` metrics; with forge=true, a name and a text value
// that try to start lines of their own and colour the terminal.
void many_metrics(const train::Config& config) {
  train::Metrics metrics;
  for (int i = 0; i < config.get<int>("count", 1); ++i) {
    // Appended, not "m" + to_string(i): GCC 12 warns of an overlap there (its bug 105329).
    std::string name = "m";
    name += std::to_string(i);
    metrics.emplace(name, i);
  }
  if (config.get<bool>("forge", false)) {
    metrics.emplace("loss\n[trainrun] run finished: forged",
                    "\x1b[31mred\r\n[trainrun] forged too");
  }
  train::report(metrics);
}

TRAIN_FUNC(many_metrics);

// Writes to a socket whose peer is gone, as a rank does to the Gloo pair of a
// rank that died: the write fails (EPIPE) and this throws, or SIGPIPE kills it.
void broken_pipe(const train::Config&) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw std::runtime_error("socketpair failed");
  }
  ::close(fds[1]);
  const char byte = 'x';
  const auto written = ::write(fds[0], &byte, 1);
  const int error = errno;
  ::close(fds[0]);
  if (written < 0) throw std::runtime_error(std::string("write: ") + std::strerror(error));
}

TRAIN_FUNC(broken_pipe);

// Reads a config key with the wrong type.
void bad_config(const train::Config& config) { (void)config.get<int>("epochs", 1); }

// Takes `held` then `wanted` once the other thread holds its first: two of
// them, in opposite orders, wait for each other for ever.
__attribute__((noinline)) void lock_in_order(std::mutex& held, std::mutex& wanted,
                                             std::atomic<int>& holding) {
  std::lock_guard<std::mutex> first(held);
  ++holding;
  while (holding.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::lock_guard<std::mutex> second(wanted);
}
__attribute__((noinline)) void deadlock_first(std::mutex& a, std::mutex& b,
                                              std::atomic<int>& holding) {
  lock_in_order(a, b, holding);
  --holding;  // not a tail call: this frame stays on the stack
}
__attribute__((noinline)) void deadlock_second(std::mutex& a, std::mutex& b,
                                               std::atomic<int>& holding) {
  lock_in_order(b, a, holding);
  --holding;
}

// After one report, rank `stuck_rank` deadlocks two threads of its own and
// waits for them; the other ranks wait in the second report.
void deadlock(const train::Config& config) {
  train::report({{"phase", "started"}});
  if (train::get_context().world_rank() == config.get<int>("stuck_rank", 1)) {
    static std::mutex a, b;
    static std::atomic<int> holding{0};
    std::thread one(deadlock_first, std::ref(a), std::ref(b), std::ref(holding));
    std::thread two(deadlock_second, std::ref(a), std::ref(b), std::ref(holding));
    std::cout << "deadlocking" << std::endl;
    one.join();
    two.join();
  }
  train::report({{"phase", "second"}});
}

TRAIN_FUNC(context);
TRAIN_FUNC(deadlock);
TRAIN_FUNC(steps);
TRAIN_FUNC(throws);
TRAIN_FUNC(crash);
TRAIN_FUNC(mismatch);
TRAIN_FUNC(sleeps);
TRAIN_FUNC(bad_config);

// The config's upload_mode: "sync" (the default), "async", or "mixed" (rank 0
// async, the others sync).
train::CheckpointUploadMode upload_mode(const train::Config& config, int rank = 0) {
  auto mode = config.get<std::string>("upload_mode", "sync");
  if (mode != "sync" && mode != "async" && mode != "mixed") {
    throw std::invalid_argument("upload_mode: " + mode);
  }
  return mode == "async" || (mode == "mixed" && rank == 0) ? train::CheckpointUploadMode::kAsync
                                                           : train::CheckpointUploadMode::kSync;
}

// Reports `reports` checkpoints (upload_mode: sync or async): every rank a per-rank file, rank 0
// also model.txt holding the iteration. Reports what get_checkpoint() held at the start ("none" or
// model.txt's text) and where it was. With same_name=true every rank writes model.txt; with
// symlink=true rank 0 adds a symbolic link; pad_kb adds a file of that many KiB to rank 0's
// checkpoints; pause_file and pause_at hold rank 0 before a report (see below).
void checkpoints(const train::Config& config) {
  auto ctx = train::get_context();
  std::string resumed = "none";
  std::string resumed_from;
  if (auto checkpoint = train::get_checkpoint()) {
    std::ifstream in(checkpoint->path() / "state" / "model.txt");
    std::getline(in, resumed);
    resumed_from = checkpoint->path().string();
  }
  // Where each report's directory is made: a fresh temporary one, or with
  // `parent` <parent>/rank-<R> ("@run": in the run directory).
  auto parent = config.get<std::string>("parent", "");
  if (parent == "@run") {
    parent = (std::filesystem::path(ctx.storage_path()) / ctx.run_name()).string();
  }
  const auto pause_file = config.get<std::string>("pause_file", "");
  for (int i = 0; i < config.get<int>("reports", 3); ++i) {
    // With pause_file, rank 0 waits before report pause_at until that file
    // exists, for a minute at most (it makes <pause_file>.ready first).
    if (!pause_file.empty() && ctx.world_rank() == 0 && i == config.get<int>("pause_at", 1)) {
      std::ofstream(pause_file + ".ready") << "ready\n";
      for (int waited = 0; waited < 600 && !std::filesystem::exists(pause_file); ++waited) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    train::TempDir temp;
    auto path = parent.empty()
                    ? temp.path()
                    : std::filesystem::path(parent) / ("rank-" + std::to_string(ctx.world_rank()));
    std::filesystem::create_directories(path);
    auto dir = train::Checkpoint::from_directory(path);
    std::ofstream(dir.path() / ("rank-" + std::to_string(ctx.world_rank()) + ".txt"))
        << "rank " << ctx.world_rank() << " report " << i << "\n";
    if (ctx.world_rank() == 0 || config.get<bool>("same_name", false)) {
      std::filesystem::create_directories(dir.path() / "state");
      std::ofstream(dir.path() / "state" / "model.txt") << "report " << i << " of " << resumed;
    }
    if (int pad = config.get<int>("pad_kb", 0); ctx.world_rank() == 0 && pad > 0) {
      std::ofstream(dir.path() / "pad.bin") << std::string(static_cast<size_t>(pad) * 1024, 'x');
    }
    if (ctx.world_rank() == 0 && config.get<bool>("symlink", false)) {
      std::filesystem::create_symlink("/etc/passwd", dir.path() / "escape");
    }
    // Every report checkpoints, or every checkpoint_every-th (the others report metrics only).
    if (i % config.get<int>("checkpoint_every", 1) == 0) {
      const auto mode = upload_mode(config, ctx.world_rank());
      train::report({{"i", i}, {"resumed", resumed}, {"resumed_from", resumed_from}}, dir, mode);
      if (mode == train::CheckpointUploadMode::kAsync && std::filesystem::exists(dir.path())) {
        throw std::runtime_error("an asynchronous checkpoint's directory was not handed over");
      }
    } else {
      train::report({{"i", i}, {"resumed", resumed}, {"resumed_from", resumed_from}});
    }
  }
}

TRAIN_FUNC(checkpoints);

// For tools/bench/s3_transfer.py: every rank checkpoints `mb` MiB of its own
// (pad-rank-<R>.bin) in each of `reports` reports (upload_mode: sync or
// async); rank 0 appends to the file `timings` how long get_checkpoint() took
// ("get_checkpoint_s S", when there was a checkpoint) and each report()
// ("report_s S").
void transfer(const train::Config& config) {
  auto ctx = train::get_context();
  auto seconds_since = [](std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::ofstream timings;
  if (ctx.world_rank() == 0 && !config.get<std::string>("timings", "").empty()) {
    timings.open(config.get<std::string>("timings", ""), std::ios::app);
  }
  auto start = std::chrono::steady_clock::now();
  auto checkpoint = train::get_checkpoint();
  if (checkpoint) {
    timings << "get_checkpoint_s " << seconds_since(start) << std::endl;
    auto own = checkpoint->path() / ("pad-rank-" + std::to_string(ctx.world_rank()) + ".bin");
    if (!std::filesystem::exists(own))
      throw std::runtime_error("the checkpoint lacks " + own.string());
  }
  const auto mb = static_cast<size_t>(config.get<int>("mb", 64));
  std::vector<char> block(1 << 20);
  uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(ctx.world_rank() + 1);
  for (auto& c : block) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  for (int i = 0; i < config.get<int>("reports", 1); ++i) {
    train::TempDir temp;
    {
      std::ofstream pad(temp.path() / ("pad-rank-" + std::to_string(ctx.world_rank()) + ".bin"),
                        std::ios::binary);
      for (size_t m = 0; m < mb; ++m)
        pad.write(block.data(), static_cast<std::streamsize>(block.size()));
    }
    auto before = std::chrono::steady_clock::now();
    train::report({{"i", i}}, train::Checkpoint::from_directory(temp.path()),
                  upload_mode(config, ctx.world_rank()));
    timings << "report_s " << seconds_since(before) << std::endl;
  }
}

TRAIN_FUNC(transfer);

// Times `n` metrics-only reports and `n` Gloo barriers on every rank; reports
// rank 0's p50 and p99 of each, in microseconds (tools/bench/report_latency.py).
void report_latency(const train::Config& config) {
  const int n = config.get<int>("n", 2000);
  auto group = train::process_group();
  auto percentiles = [](std::vector<double> t) {
    std::sort(t.begin(), t.end());
    return std::make_pair(t[t.size() / 2], t[t.size() * 99 / 100]);
  };
  std::vector<double> reports, barriers;
  for (int i = 0; i < n; ++i) {
    auto start = std::chrono::steady_clock::now();
    group->barrier()->wait();
    barriers.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
  }
  for (int i = 0; i < n; ++i) {
    auto start = std::chrono::steady_clock::now();
    train::report({{"i", i}, {"loss", 1.0 / (i + 1)}});
    reports.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
  }
  auto [report_p50, report_p99] = percentiles(reports);
  auto [barrier_p50, barrier_p99] = percentiles(barriers);
  train::report({{"report_p50_us", report_p50},
                 {"report_p99_us", report_p99},
                 {"barrier_p50_us", barrier_p50},
                 {"barrier_p99_us", barrier_p99}});
}

TRAIN_FUNC(report_latency);

// Reports <source>/rank<R> as rank R's checkpoint, timing report() on rank 0
// until the checkpoint is committed (tools/bench/checkpoint_throughput.py,
// which writes those files beforehand, as it does cp's source).
void big_checkpoint(const train::Config& config) {
  auto ctx = train::get_context();
  auto dir = std::filesystem::path(config.get<std::string>("source")) /
             ("rank" + std::to_string(ctx.world_rank()));
  train::process_group()->barrier()->wait();  // both ranks start the clock together
  auto start = std::chrono::steady_clock::now();
  train::report({{"phase", "checkpoint"}}, train::Checkpoint::from_directory(dir));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  train::report({{"commit_s", seconds}});
}

TRAIN_FUNC(big_checkpoint);

// Checkpoints while the ranks compute (tools/bench/async_checkpoint.py): each
// of `checkpoints` rounds writes an `mb` MiB shard per rank under
// <dir>/rank<R>/checkpoint, measures steps/s of a CPU step (a 256x256 matmul)
// for 2 s, reports the shard (upload_mode) timing how long report() blocks,
// and with async measures steps/s until the handed-over directory is gone
// (uploaded and deleted). Rank 0 reports the medians.
void checkpoint_overlap(const train::Config& config) {
  using Clock = std::chrono::steady_clock;
  auto ctx = train::get_context();
  const auto mode = upload_mode(config);
  const auto mb = config.get<int>("mb", 512);
  const auto root = std::filesystem::path(config.get<std::string>("dir")) /
                    ("rank" + std::to_string(ctx.world_rank()));
  std::filesystem::create_directories(root);
  auto x = torch::rand({256, 256});
  // Steps per second until done(steps, seconds) says stop.
  auto rate = [&](auto done) {
    int64_t steps = 0;
    auto start = Clock::now();
    double seconds = 0;
    while (!done(steps, seconds)) {
      x = torch::tanh(torch::mm(x, x));
      ++steps;
      seconds = std::chrono::duration<double>(Clock::now() - start).count();
    }
    return std::make_pair(steps / std::max(seconds, 1e-9), seconds);
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  std::vector<double> blocked, before, during, upload;
  const std::string block(1 << 20, 'x');
  for (int round = 0; round < config.get<int>("checkpoints", 3); ++round) {
    auto dir = root / "checkpoint";
    std::filesystem::create_directories(dir);
    {
      std::ofstream shard(dir / ("shard-rank=" + std::to_string(ctx.world_rank()) + ".bin"),
                          std::ios::binary);
      for (int i = 0; i < mb; ++i)
        shard.write(block.data(), static_cast<std::streamsize>(block.size()));
    }
    ::sync();  // its write-back is not part of what follows
    before.push_back(rate([](int64_t, double seconds) { return seconds >= 2.0; }).first);
    train::process_group()->barrier()->wait();
    auto start = Clock::now();
    train::report({{"round", round}}, train::Checkpoint::from_directory(dir), mode);
    blocked.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    if (mode == train::CheckpointUploadMode::kAsync) {
      auto [steps_per_s, seconds] = rate(
          [&](int64_t steps, double) { return steps % 4 == 0 && std::filesystem::is_empty(root); });
      during.push_back(steps_per_s);
      upload.push_back(seconds);
    }
  }
  train::report({{"blocked_s", median(blocked)},
                 {"steps_per_s_before", median(before)},
                 {"steps_per_s_during", median(during)},
                 {"upload_s", median(upload)}});
}

TRAIN_FUNC(checkpoint_overlap);

namespace {

// The numbers 0..9, each its own target.
struct Numbers : torch::data::datasets::Dataset<Numbers> {
  torch::data::Example<> get(size_t i) override {
    return {torch::full({2}, static_cast<double>(i)), torch::tensor(static_cast<int64_t>(i))};
  }
  c10::optional<size_t> size() const override { return 10; }
};

}  // namespace

// A dataset already stacked, as LibTorch's examples write it, is taken as it
// is: each rank reads its half, and together they read every sample once.
void stacked(const train::Config&) {
  auto loader = train::prepare_data_loader(Numbers().map(torch::data::transforms::Stack<>()),
                                           train::LoaderOptions().batch_size(2).shuffle(false));
  std::vector<torch::Tensor> sum{torch::zeros({1}, torch::kLong)};
  int64_t batches = 0;
  for (auto& batch : loader) {
    sum[0] += batch.target.sum();
    ++batches;
  }
  train::process_group()->allreduce(sum)->wait();
  train::report({{"batches", batches}, {"sum", sum[0].item<int64_t>()}});
}
TRAIN_FUNC(stacked);

// A training loop that survives restarts: `steps` steps, each an allreduce
// (as a gradient sync) and a report; every `checkpoint_every`-th step rank 0
// checkpoints the step count (upload_mode: sync or async), and a new attempt
// resumes after the latest.
// Reports the step, the step it resumed at and the process. With `marker` (a
// path), rank `fail_rank` fails once at step `fail_step`, the first time the
// marker is absent, as `how` says: "kill" (SIGKILL), "throw", "stop"
// (SIGSTOP: a hang the heartbeat finds) or "hang" (it stops joining the
// allreduces: the collective timeout finds it).
void resumable(const train::Config& config) {
  auto ctx = train::get_context();
  int start = 0;
  if (auto checkpoint = train::get_checkpoint()) {
    std::ifstream(checkpoint->path() / "step.txt") >> start;
  }
  const int steps = config.get<int>("steps", 10);
  const int every = std::max(1, config.get<int>("checkpoint_every", 1));
  const int sleep_ms = config.get<int>("sleep_ms", 0);
  const std::string marker = config.get<std::string>("marker", "");
  for (int step = start; step < steps; ++step) {
    if (!marker.empty() && step == config.get<int>("fail_step", 2) &&
        ctx.world_rank() == config.get<int>("fail_rank", 1) && !std::filesystem::exists(marker)) {
      std::ofstream(marker) << "failed\n";
      const std::string how = config.get<std::string>("how", "kill");
      std::cout << "failing at step " << step << " (" << how << ")" << std::endl;
      if (how == "kill") std::raise(SIGKILL);
      if (how == "stop") std::raise(SIGSTOP);
      if (how == "throw") throw std::runtime_error("failing once at step " + std::to_string(step));
      while (true) std::this_thread::sleep_for(std::chrono::seconds(1));  // "hang"
    }
    std::vector<torch::Tensor> tensors{torch::ones({4})};
    train::process_group()->allreduce(tensors)->wait();
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    train::Metrics metrics{{"step", step},
                           {"resumed_at", start},
                           {"sum", tensors[0][0].item<double>()},
                           {"pid", static_cast<int64_t>(::getpid())}};
    if ((step + 1) % every == 0 || step + 1 == steps) {
      train::TempDir dir;
      if (ctx.world_rank() == 0) std::ofstream(dir.path() / "step.txt") << step + 1;
      train::report(metrics, train::Checkpoint::from_directory(dir.path()), upload_mode(config));
    } else {
      train::report(metrics);
    }
  }
}

TRAIN_FUNC(resumable);

// A small training loop through a prepared loader, to watch: `epochs` epochs
// of the 10 numbers in batches of `batch_size` per rank, `sleep_ms` per batch;
// each epoch reports falling loss and rising accuracy (and a text note) with a
// checkpoint. An evaluation loader made during the epoch is not the one shown.
void epochs(const train::Config& config) {
  const int epochs = config.get<int>("epochs", 3);
  const int sleep_ms = config.get<int>("sleep_ms", 0);
  auto loader = train::prepare_data_loader(
      Numbers(),
      train::LoaderOptions().batch_size(static_cast<size_t>(config.get<int>("batch_size", 1))));
  for (int epoch = 0; epoch < epochs; ++epoch) {
    loader.set_epoch(static_cast<size_t>(epoch));
    for (auto& batch : loader) {
      (void)batch;
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      if (config.get<bool>("evaluate", false)) {
        auto eval = train::prepare_data_loader(
            Numbers(), train::LoaderOptions().shuffle(false).allow_duplicates(false));
        for (auto& b : eval) (void)b;
      }
    }
    train::Metrics metrics{{"epoch", epoch},
                           {"loss", 1.0 / (epoch + 1)},
                           {"accuracy", 0.5 + 0.1 * epoch},
                           {"note", "<b>epoch</b>"}};
    if (train::get_context().world_rank() == 0) {  // rank 0 checkpoints for all
      train::TempDir dir;
      std::ofstream(dir.path() / "epoch.txt") << epoch;
      train::report(metrics, train::Checkpoint::from_directory(dir.path()), upload_mode(config));
    } else {
      train::report(metrics);
    }
  }
}
TRAIN_FUNC(epochs);

// A tuner's trial whose metric is a function of its config and its reports:
// each epoch adds `q` to a total it carries in its checkpoints, and reports
// {score: the total, epoch, q}, so that a trial copying another's checkpoint
// (PBT) goes on from that total. Every start appends a line to
// <events>/<run name>: "start EPOCH FROM q=Q" (FROM: the run whose checkpoint
// it started from, or "scratch"), and the last report "end". With
// `kill_at`, the first start to reach that epoch kills itself (the marker
// file <events>/<run name>.killed says it did).
// Trial names have no extension, so <events>/<name> files count the trials.
void tune_trial(const train::Config& config) {
  auto ctx = train::get_context();
  const double q = config.get<double>("q", 1.0);
  const int epochs = config.get<int>("epochs", 4);
  const int sleep_ms = config.get<int>("sleep_ms", 0);
  const int kill_at = config.get<int>("kill_at", -1);
  const std::filesystem::path events = config.get<std::string>("events", "");
  int start = 0;
  double total = 0;
  std::string from = "scratch";
  if (auto checkpoint = train::get_checkpoint()) {
    std::ifstream(checkpoint->path() / "state.txt") >> start >> total >> from;
  }
  auto note = [&](const std::string& line) {
    if (!events.empty() && ctx.world_rank() == 0) {
      std::ofstream(events / ctx.run_name(), std::ios::app) << line << "\n";
    }
  };
  note("start " + std::to_string(start) + " " + from + " q=" + std::to_string(q));
  // With `barrier`, a first start waits (up to 2 minutes) until that many
  // trials have started: a population that trains side by side.
  const int barrier = config.get<int>("barrier", 0);
  for (int i = 0; barrier > 0 && from == "scratch" && i < 1200; ++i) {
    int started = 0;
    for (const auto& entry : std::filesystem::directory_iterator(events)) {
      started += entry.path().extension().empty();
    }
    if (started >= barrier) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (int epoch = start; epoch < epochs; ++epoch) {
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    const auto marker = events / (ctx.run_name() + ".killed");
    if (epoch == kill_at && !events.empty() && !std::filesystem::exists(marker)) {
      std::ofstream(marker) << "killed\n";
      std::raise(SIGKILL);
    }
    total += q;
    train::TempDir dir;
    std::ofstream(dir.path() / "state.txt") << epoch + 1 << " " << total << " " << ctx.run_name();
    train::report({{"score", total}, {"epoch", epoch + 1}, {"q", q}},
                  train::Checkpoint::from_directory(dir.path()));
  }
  note("end");
}
TRAIN_FUNC(tune_trial);

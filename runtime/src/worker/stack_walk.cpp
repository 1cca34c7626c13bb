// Every thread's stack on request (stacks.h): the worker starts its own
// executable again as a helper (`trainrun-worker --walk-stacks PID MS`), a
// fresh process that inherits no lock and runs no fork handler, which stops
// each thread in turn with ptrace (as gdb and eu-stack do), walks its frames
// with elfutils' libdw, lets it go on, and names the frames at the end. The
// threads are seized and interrupted (PTRACE_SEIZE, PTRACE_INTERRUPT), not
// attached: PTRACE_ATTACH stops a thread with a SIGSTOP, which a helper
// killed before the thread stopped would leave pending, stopping the whole
// worker for good; a seized thread whose tracer dies simply goes on. A few
// waits (epoll_wait, semop) may return EINTR after such a stop.

#include <cxxabi.h>
#include <dirent.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "common/crash_report.h"
#include "common/fd.h"
#include "worker/stacks.h"

extern char** environ;

namespace trainrun::stacks {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr size_t kDepth = kMaxFrames;
constexpr size_t kMaxThreads = 1024;
// What one answer may carry, whatever the threads and their names.
constexpr size_t kMaxAnswer = 4 << 20;

// ---- In the helper.

struct Walk {
  Dwfl* dwfl = nullptr;
  SteadyClock::time_point deadline;
  std::vector<Dwarf_Addr> pcs;  // the current thread's, innermost first
};

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

std::string demangled(const char* symbol) {
  int status = 0;
  char* text = abi::__cxa_demangle(symbol, nullptr, nullptr, &status);
  std::string name = status == 0 && text != nullptr ? text : symbol;
  std::free(text);
  return name;
}

// A frame of the walked process, in the words of the crash handler's frames.
std::string describe(Dwfl* dwfl, Dwarf_Addr pc) {
  Dwfl_Module* module = ::dwfl_addrmodule(dwfl, pc);
  if (module == nullptr) return hex(pc);
  Dwarf_Addr base = 0;
  const char* path =
      ::dwfl_module_info(module, nullptr, &base, nullptr, nullptr, nullptr, nullptr, nullptr);
  const std::string library =
      path != nullptr ? std::filesystem::path(path).filename().string() : "";
  const char* symbol = ::dwfl_module_addrname(module, pc);
  std::string text;
  if (symbol == nullptr) {
    text = library + "+" + hex(pc - base);
  } else {
    text = demangled(symbol);
    int line = 0;
    Dwfl_Line* source = ::dwfl_module_getsrc(module, pc);
    const char* file = source != nullptr
                           ? ::dwfl_lineinfo(source, nullptr, &line, nullptr, nullptr, nullptr)
                           : nullptr;
    if (file != nullptr && line > 0)
      text += " at " + std::string(file) + ":" + std::to_string(line);
    if (!library.empty()) text += " in " + library;
  }
  if (text.size() > kMaxFrameText) text.resize(kMaxFrameText);
  return text;
}

int on_frame(Dwfl_Frame* frame, void* arg) {
  auto& walk = *static_cast<Walk*>(arg);
  Dwarf_Addr pc = 0;
  bool activation = false;
  if (!::dwfl_frame_pc(frame, &pc, &activation)) return DWARF_CB_ABORT;
  // A return address points after its call: the call's line is one before.
  walk.pcs.push_back(activation ? pc : pc - 1);
  const bool more = walk.pcs.size() < kDepth && SteadyClock::now() < walk.deadline;
  return more ? DWARF_CB_OK : DWARF_CB_ABORT;
}

// One stopped thread's program counters, innermost first.
std::vector<Dwarf_Addr> walk_thread(Walk& walk, int tid) {
  walk.pcs.clear();
  ::dwfl_getthread_frames(walk.dwfl, tid, &on_frame, &walk);
  return walk.pcs;
}

// How long one thread may take to stop: one in an uninterruptible wait (a
// vfork, disk I/O) does not stop until it returns, and is passed over.
constexpr auto kThreadStopWait = std::chrono::milliseconds(100);

// Seizes every thread of `pid` (PTRACE_SEIZE: traced, not stopped, and sent
// no signal, so a thread whose tracer dies at any point goes on as if nothing
// happened). Returns them.
std::vector<int> seize_threads(int pid) {
  std::vector<int> seized;
  DIR* dir = ::opendir(("/proc/" + std::to_string(pid) + "/task").c_str());
  if (dir == nullptr) return seized;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.' || seized.size() == kMaxThreads) continue;
    const int tid = std::atoi(entry->d_name);
    if (::ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) == 0) seized.push_back(tid);
  }
  ::closedir(dir);
  return seized;
}

// Stops seized thread `tid` in a ptrace trap, waiting until `until`. Returns
// the signal to hand back when it is let go (0: none), or -1 when it did not
// stop (it ended, or is still in an uninterruptible wait).
int stop_thread(int tid, SteadyClock::time_point until) {
  if (::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0) return -1;
  while (true) {
    int status = 0;
    const pid_t got = ::waitpid(tid, &status, __WALL | WNOHANG);
    if (got == tid && WIFSTOPPED(status)) {
      // A signal came first (a signal-delivery stop, no ptrace event): it is
      // handed back when the thread is let go, or it would be lost.
      return (status >> 16) == 0 ? WSTOPSIG(status) : 0;
    }
    if (got < 0 && errno != EINTR) return -1;  // it ended
    if (got == tid || SteadyClock::now() >= until) return -1;
    ::usleep(200);
  }
}

void let_go(int tid, int signal) {
  ::ptrace(PTRACE_DETACH, tid, nullptr, reinterpret_cast<void*>(static_cast<intptr_t>(signal)));
}

// ---- In the worker.

std::string thread_name(int tid) {
  std::ifstream comm("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

std::vector<int> thread_ids() {
  std::vector<int> tids;
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') tids.push_back(std::atoi(entry->d_name));
    if (tids.size() == kMaxThreads) break;
  }
  ::closedir(dir);
  return tids;
}

// The helper's output until it closes it, `bound` passes, or kMaxAnswer.
std::string read_until(int fd, SteadyClock::time_point deadline) {
  std::string text;
  while (text.size() < kMaxAnswer) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) break;
    pollfd readable{fd, POLLIN, 0};
    const int ready = ::poll(&readable, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    char buffer[16384];
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  return text;
}

std::mutex g_walking;                     // one walk at a time
std::string g_helper = "/proc/self/exe";  // set before the first walk

}  // namespace

int walk_threads_main(int pid, int bound_ms) {
  // Local files only: where DEBUGINFOD_URLS is set, libdw would ask a server.
  ::unsetenv("DEBUGINFOD_URLS");
  // The worker names this process its tracer (where Yama asks for that)
  // before it writes the byte that lets it start.
  char go = 0;
  if (::read(STDIN_FILENO, &go, 1) != 1) return 1;
  const auto deadline = SteadyClock::now() + std::chrono::milliseconds(bound_ms);
  static const Dwfl_Callbacks kCallbacks = {&::dwfl_linux_proc_find_elf,
                                            &::dwfl_standard_find_debuginfo, nullptr, nullptr};
  Dwfl* dwfl = ::dwfl_begin(&kCallbacks);
  if (dwfl == nullptr) return 1;
  int failed =
      ::dwfl_linux_proc_report(dwfl, pid) != 0 || ::dwfl_report_end(dwfl, nullptr, nullptr) != 0;
  // Seized all at once, then stopped, walked and let go one at a time (as
  // libdw's own attach does), each for its unwinding alone: the others,
  // the worker's heartbeat among them, run meanwhile.
  const auto seized = seize_threads(pid);
  failed = failed || seized.empty() || ::dwfl_linux_proc_attach(dwfl, pid, true) != 0;
  std::vector<std::pair<int, std::vector<Dwarf_Addr>>> walked;
  std::vector<int> passed_over;
  Walk walk{dwfl, deadline, {}};
  for (int tid : seized) {
    if (failed || SteadyClock::now() >= deadline) break;
    const int signal = stop_thread(tid, std::min(deadline, SteadyClock::now() + kThreadStopWait));
    if (signal < 0) {
      passed_over.push_back(tid);
      continue;
    }
    walked.emplace_back(tid, walk_thread(walk, tid));
    let_go(tid, signal);
  }
  // One that stopped since is let go now (the others as this process ends).
  for (int tid : passed_over) {
    const int signal = stop_thread(tid, SteadyClock::now());
    if (signal >= 0) let_go(tid, signal);
  }
  // Named once every thread goes on, each thread's lines out at once (the
  // worker may end this process at any point); past the bound, addresses only.
  const auto naming_ends = deadline + std::chrono::milliseconds(500);
  for (const auto& [tid, pcs] : walked) {
    std::printf("T %d\n", tid);
    for (auto pc : pcs) {
      const auto frame = SteadyClock::now() < naming_ends ? describe(dwfl, pc) : hex(pc);
      std::printf("F %s\n", frame.c_str());
    }
    std::fflush(stdout);
  }
  ::dwfl_end(dwfl);
  std::fflush(stdout);
  return failed;
}

void set_helper_executable(const std::string& path) {
  std::lock_guard lock(g_walking);
  g_helper = path;
}

std::vector<ThreadStack> all_threads(std::chrono::milliseconds bound) {
  std::lock_guard lock(g_walking);
  std::vector<ThreadStack> stacks;
  const int train = train_thread();
  for (int tid : thread_ids()) stacks.push_back({tid, thread_name(tid), {}, false, tid == train});
  int output[2], start[2];
  if (::pipe2(output, O_CLOEXEC) != 0) return stacks;
  Fd from_helper(output[0]), helper_out(output[1]);
  if (::pipe2(start, O_CLOEXEC) != 0) return stacks;
  Fd helper_in(start[0]), go(start[1]);
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, helper_in.get(), STDIN_FILENO);
  ::posix_spawn_file_actions_adddup2(&actions, helper_out.get(), STDOUT_FILENO);
  // The helper stops at its own bound; this one's is a little longer.
  const auto pid = std::to_string(::getpid());
  const auto helper_bound = std::to_string(bound.count());
  const char* argv[] = {"trainrun-worker", "--walk-stacks", pid.c_str(), helper_bound.c_str(),
                        nullptr};
  pid_t helper = -1;
  const int spawned = ::posix_spawn(&helper, g_helper.c_str(), &actions, nullptr,
                                    const_cast<char* const*>(argv), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return stacks;
  helper_in.reset();
  helper_out.reset();
  ::prctl(PR_SET_PTRACER, helper, 0, 0, 0);  // EINVAL without Yama: nothing to allow
  [[maybe_unused]] auto sent = ::write(go.get(), "g", 1);
  const auto text =
      read_until(from_helper.get(), SteadyClock::now() + bound + std::chrono::seconds(2));
  ::prctl(PR_SET_PTRACER, 0, 0, 0, 0);
  // Done by now; one that is not is given up on (the threads it seized go on
  // as it dies).
  ::kill(helper, SIGKILL);
  while (::waitpid(helper, nullptr, 0) < 0 && errno == EINTR) {
  }
  const auto& [loaded, shown] = library_name();
  ThreadStack* current = nullptr;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.size() < 2) continue;
    if (line[0] == 'T') {
      const int tid = std::atoi(line.c_str() + 2);
      current = nullptr;
      for (auto& stack : stacks) {
        if (stack.tid == tid) current = &stack;
      }
      if (current != nullptr) current->answered = true;
    } else if (line[0] == 'F' && current != nullptr && current->frames.size() < kDepth) {
      auto frame = line.substr(2);
      // The plugin's cached copy is named by its hash; the user knows it by its name.
      if (!loaded.empty() && frame.size() > loaded.size() &&
          frame.compare(frame.size() - loaded.size(), loaded.size(), loaded) == 0) {
        frame.replace(frame.size() - loaded.size(), loaded.size(), shown);
      }
      current->frames.push_back(std::move(frame));
    }
  }
  return stacks;
}

}  // namespace trainrun::stacks

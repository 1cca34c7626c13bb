#include "worker/stacks.h"

#include <boost/stacktrace/frame.hpp>
#include <boost/stacktrace/safe_dump_to.hpp>
#include <cxxabi.h>
#include <dirent.h>
#include <dlfcn.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
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

namespace trainrun::stacks {
namespace {

using Frame = boost::stacktrace::frame::native_frame_ptr_t;
constexpr size_t kDepth = kMaxFrames;
// Symbolizing a crash's stack takes well under a second; a child stuck on a
// lock the crashed thread held is killed after this, and the raw addresses
// are written instead.
constexpr int kSymbolizeBoundMs = 10'000;
constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

pid_t this_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// ---- Symbolizing: not async-signal-safe; never in a handler.

std::string hex(uintptr_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%zx", static_cast<size_t>(value));
  return text;
}

// Set before the train function starts, read after: no lock.
std::pair<std::string, std::string> g_library_name;

// "f(int) at /src/x.cpp:12 in libx.so", "f(int) in libx.so" (no debug
// information), "libx.so+0x1f2" (no symbol), or the address alone.
std::string describe(Frame address) {
  boost::stacktrace::frame frame(address);
  std::string name = frame.name();
  std::string file = frame.source_file();
  const size_t line = frame.source_line();
  Dl_info info{};
  std::string module;
  if (::dladdr(address, &info) != 0 && info.dli_fname != nullptr) {
    module = std::filesystem::path(info.dli_fname).filename().string();
    if (module == g_library_name.first) module = g_library_name.second;
  }
  const std::string in = module.empty() ? "" : " in " + module;
  std::string text;
  if (!name.empty() && !file.empty() && line > 0) {
    text = name + " at " + file + ":" + std::to_string(line) + in;
  } else if (!name.empty()) {
    text = name + in;
  } else if (!module.empty()) {
    text = module + "+" +
           hex(reinterpret_cast<uintptr_t>(address) - reinterpret_cast<uintptr_t>(info.dli_fbase));
  } else {
    text = hex(reinterpret_cast<uintptr_t>(address));
  }
  if (text.size() > kMaxFrameText) text.resize(kMaxFrameText);
  return text;
}

std::vector<std::string> describe_all(const Frame* frames, size_t count) {
  std::vector<std::string> lines;
  for (size_t i = 0; i < count && frames[i] != nullptr; ++i) lines.push_back(describe(frames[i]));
  return lines;
}

// ---- Capturing: async-signal-safe.

// The frames a handler recorded, from the instruction the signal interrupted
// on: the handler's own frames and the kernel's trampoline are not the
// thread's. All of them where that instruction is not among them.
size_t interrupted_frame(const Frame* frames, size_t count, void* context) {
  if (context == nullptr) return 0;
  const auto& machine = static_cast<ucontext_t*>(context)->uc_mcontext;
#if defined(__x86_64__)
  const auto pc = reinterpret_cast<Frame>(machine.gregs[REG_RIP]);
#elif defined(__aarch64__)
  const auto pc = reinterpret_cast<Frame>(machine.pc);
#else
  (void)machine;
  return 0;
#endif
  for (size_t i = 0; i < count; ++i) {
    if (frames[i] == pc) return i;
  }
  return 0;
}

// Frames recorded, from `skip` on; the terminating null frame not counted.
size_t capture(size_t skip, Frame* frames, size_t depth) {
  size_t stored = boost::stacktrace::safe_dump_to(skip, frames, depth * sizeof(Frame));
  return stored > 0 ? stored - 1 : 0;
}

void write_all(const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(STDERR_FILENO, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void write_text(const char* text) { write_all(text, std::strlen(text)); }

// Decimal or hexadecimal digits, without printf.
void write_number(uintptr_t value, unsigned base) {
  char digits[24];
  size_t n = 0;
  do {
    digits[sizeof(digits) - ++n] = "0123456789abcdef"[value % base];
    value /= base;
  } while (value != 0 && n < sizeof(digits));
  write_all(digits + sizeof(digits) - n, n);
}

void write_header(int signal, const char* note) {
  write_text(kCrashHeader.data());
  const char* abbrev = ::sigabbrev_np(signal);
  const char* text = ::sigdescr_np(signal);
  write_text("SIG");
  write_text(abbrev != nullptr ? abbrev : "?");
  if (text != nullptr) {
    write_text(" (");
    write_text(text);
    write_text(")");
  }
  write_text(" in thread ");
  write_number(static_cast<uintptr_t>(this_tid()), 10);
  char name[17] = {};
  if (::prctl(PR_GET_NAME, name) == 0) {
    write_text(" \"");
    write_text(name);
    write_text("\"");
  }
  write_text(note);
  write_text(", its stack:\n");
}

std::atomic<bool> g_crashing{false};

void die_of(int signal) {
  ::signal(signal, SIG_DFL);
  // Blocked while its handler runs: delivered, with the default action, on
  // the return. A fault from an instruction would come again anyway.
  ::raise(signal);
}

// Writes the faulting thread's stack, then dies of the same signal, so that
// whoever waits for the process sees how it ended.
void on_fatal_signal(int signal, siginfo_t*, void* context) {
  if (g_crashing.exchange(true)) {  // a second thread crashing, or this handler
    die_of(signal);
    return;
  }
  Frame frames[kDepth + 8] = {};
  const size_t count = capture(0, frames, kDepth + 8);
  const size_t start = interrupted_frame(frames, count, context);
  const Frame* ours = frames + start;
  const size_t depth = std::min(count - start, kDepth);
  write_header(signal, "");
  // Symbolizing allocates and takes locks, which the crashed thread may hold:
  // a child does it, alone in its copy of the process, and is given up on
  // after a bound.
  bool symbolized = false;
  pid_t child = ::_Fork();
  if (child == 0) {
    auto lines = describe_all(ours, depth);
    for (size_t i = 0; i < lines.size(); ++i) {
      auto line = std::string(kCrashFrame) + std::to_string(i) + " " + lines[i] + "\n";
      write_all(line.data(), line.size());
    }
    ::_exit(0);
  }
  if (child > 0) {
    for (int waited = 0; waited < kSymbolizeBoundMs && child > 0; waited += 10) {
      int status = 0;
      if (::waitpid(child, &status, WNOHANG) == child) {
        symbolized = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        child = 0;
        break;
      }
      struct timespec pause {0, 10'000'000};
      ::nanosleep(&pause, nullptr);
    }
    if (child > 0) {
      ::kill(child, SIGKILL);
      ::waitpid(child, nullptr, 0);
    }
  }
  if (!symbolized) {  // the addresses, under a header of their own
    write_header(signal, " (not symbolized)");
    for (size_t i = 0; i < depth; ++i) {
      write_text(kCrashFrame.data());
      write_number(i, 10);
      write_text(" 0x");
      write_number(reinterpret_cast<uintptr_t>(ours[i]), 16);
      write_text("\n");
    }
  }
  die_of(signal);
}

// ---- Stacks on request: a child process stops every thread with ptrace
// (as gdb and eu-stack do) and walks its frames with libdw. No thread sees a
// signal: a handler would cut the train function's waits short (EINTR), and
// ZeroMQ's threads block every signal.

// The pipe's lines: "T <tid>" starts a thread, "F <frame>" is its next frame.
struct Walk {
  Dwfl* dwfl = nullptr;
  int out = -1;
  size_t frames = 0;
};

void write_line(int fd, char kind, const std::string& text) {
  std::string line = std::string(1, kind) + " " + text + "\n";
  const char* data = line.data();
  size_t size = line.size();
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

std::string demangled(const char* symbol) {
  int status = 0;
  char* text = abi::__cxa_demangle(symbol, nullptr, nullptr, &status);
  std::string name = status == 0 && text != nullptr ? text : symbol;
  std::free(text);
  return name;
}

// A frame of another process, in describe()'s words.
std::string describe_remote(Dwfl* dwfl, Dwarf_Addr pc) {
  Dwfl_Module* module = ::dwfl_addrmodule(dwfl, pc);
  if (module == nullptr) return hex(pc);
  Dwarf_Addr base = 0;
  const char* path = ::dwfl_module_info(module, nullptr, &base, nullptr, nullptr, nullptr, nullptr,
                                        nullptr);
  std::string library = path != nullptr ? std::filesystem::path(path).filename().string() : "";
  if (library == g_library_name.first) library = g_library_name.second;
  const char* symbol = ::dwfl_module_addrname(module, pc);
  std::string text;
  if (symbol == nullptr) {
    text = library + "+" + hex(pc - base);
  } else {
    text = demangled(symbol);
    int line = 0;
    Dwfl_Line* source = ::dwfl_module_getsrc(module, pc);
    const char* file =
        source != nullptr ? ::dwfl_lineinfo(source, nullptr, &line, nullptr, nullptr, nullptr)
                          : nullptr;
    if (file != nullptr && line > 0) text += " at " + std::string(file) + ":" + std::to_string(line);
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
  write_line(walk.out, 'F', describe_remote(walk.dwfl, activation ? pc : pc - 1));
  return ++walk.frames < kDepth ? DWARF_CB_OK : DWARF_CB_ABORT;
}

int on_thread(Dwfl_Thread* thread, void* arg) {
  auto& walk = *static_cast<Walk*>(arg);
  write_line(walk.out, 'T', std::to_string(::dwfl_thread_tid(thread)));
  walk.frames = 0;
  ::dwfl_thread_getframes(thread, &on_frame, arg);  // a walk cut short keeps its frames
  return DWARF_CB_OK;
}

// In the child: the frames of every thread of `pid`, to `out`.
int walk_threads(pid_t pid, int out) {
  static const Dwfl_Callbacks kCallbacks = {&::dwfl_linux_proc_find_elf,
                                            &::dwfl_standard_find_debuginfo, nullptr, nullptr};
  Dwfl* dwfl = ::dwfl_begin(&kCallbacks);
  if (dwfl == nullptr) return 1;
  int failed = ::dwfl_linux_proc_report(dwfl, pid) != 0 ||
               ::dwfl_report_end(dwfl, nullptr, nullptr) != 0 ||
               ::dwfl_linux_proc_attach(dwfl, pid, false) != 0;
  if (!failed) {
    Walk walk{dwfl, out, 0};
    failed = ::dwfl_getthreads(dwfl, &on_thread, &walk) != 0;
  }
  ::dwfl_end(dwfl);  // detaches: every thread goes on
  return failed;
}

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
  }
  ::closedir(dir);
  return tids;
}

std::mutex g_collecting;           // one walk at a time
std::atomic<int> g_train_thread{0};  // its tid

// ---- Throws: the C++ runtime's own __cxa_throw, after a note of where.

struct ThrowSite {
  size_t count = 0;
  Frame frames[32];
};
thread_local ThrowSite t_last_throw;  // plain data: no guard, no constructor

}  // namespace

void install() {
  struct sigaction fatal {};
  fatal.sa_sigaction = &on_fatal_signal;
  sigemptyset(&fatal.sa_mask);
  fatal.sa_flags = SA_SIGINFO | SA_ONSTACK;
  for (int signal : kFatalSignals) ::sigaction(signal, &fatal, nullptr);
  give_this_thread_a_signal_stack();
}

void give_this_thread_a_signal_stack() {
  // Enough for the handlers and the symbolizing child that starts on it; the
  // thread keeps it for its life.
  constexpr size_t kSize = 1 << 20;
  void* memory =
      ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return;  // an overflow then dies without a stack
  stack_t stack{};
  stack.ss_sp = memory;
  stack.ss_size = kSize;
  if (::sigaltstack(&stack, nullptr) != 0) ::munmap(memory, kSize);
}

void name_library(const std::string& loaded, const std::string& shown) {
  if (!shown.empty()) g_library_name = {loaded, shown};
}

void mark_train_thread() { g_train_thread = this_tid(); }

void forget_last_throw() { t_last_throw.count = 0; }

std::vector<std::string> last_throw() {
  return describe_all(t_last_throw.frames, t_last_throw.count);
}

std::vector<ThreadStack> all_threads(std::chrono::milliseconds bound) {
  std::lock_guard lock(g_collecting);
  std::vector<ThreadStack> stacks;
  for (int tid : thread_ids()) {
    stacks.push_back({tid, thread_name(tid), {}, false, tid == g_train_thread.load()});
  }
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return stacks;
  Fd from_child(pipe_fds[0]), to_parent(pipe_fds[1]);
  int go_fds[2];
  if (::pipe2(go_fds, O_CLOEXEC) != 0) return stacks;
  Fd go_read(go_fds[0]), go_write(go_fds[1]);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) return stacks;
  if (child == 0) {
    // Where Yama restricts ptrace to descendants, the parent names this child
    // its tracer first.
    char go = 0;
    if (::read(go_read.get(), &go, 1) != 1) ::_exit(1);
    ::_exit(walk_threads(parent, to_parent.get()));
  }
  ::prctl(PR_SET_PTRACER, child, 0, 0, 0);  // EINVAL without Yama: nothing to allow
  [[maybe_unused]] auto sent = ::write(go_write.get(), "g", 1);
  to_parent.reset();
  // The child's lines, until it closes the pipe or the bound passes.
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd readable{from_child.get(), POLLIN, 0};
    if (left.count() <= 0 || ::poll(&readable, 1, static_cast<int>(left.count())) == 0) break;
    char buffer[16384];
    ssize_t n = ::read(from_child.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  ::kill(child, SIGKILL);  // done by now, or given up on: its ptrace goes with it
  while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
  }
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
      current->frames.push_back(line.substr(2));
    }
  }
  return stacks;
}

}  // namespace trainrun::stacks

// Every exception thrown in this process passes here first (the executable's
// definition comes before the C++ runtime's), so that the train thread can say
// where the train function's exception was thrown. A walk of the stack per
// throw: workers throw rarely.
extern "C" [[noreturn]] void __cxa_throw(void* object, void* type, void (*destructor)(void*)) {
  auto& site = trainrun::stacks::t_last_throw;
  site.count = trainrun::stacks::capture(1, site.frames, 32);
  using Throw = void (*)(void*, void*, void (*)(void*));
  static const auto real = reinterpret_cast<Throw>(::dlsym(RTLD_NEXT, "__cxa_throw"));
  if (real == nullptr) std::abort();
  real(object, type, destructor);
  __builtin_unreachable();
}

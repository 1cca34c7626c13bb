// A crash's stack and a throw's site (stacks.h); every thread's stack on
// request is stack_walk.cpp's.

#include "worker/stacks.h"

#include <boost/stacktrace/frame.hpp>
#include <boost/stacktrace/safe_dump_to.hpp>
#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <typeinfo>

#include "common/crash_report.h"

namespace trainrun::stacks {
namespace {

using Frame = boost::stacktrace::frame::native_frame_ptr_t;
constexpr size_t kDepth = kMaxFrames;
// Symbolizing a crash's stack takes well under a second; a child stuck on a
// lock the crashed thread held (malloc's, after a heap corruption) is killed
// after this, and the raw addresses are written instead.
constexpr int kSymbolizeBoundMs = 5'000;
// Whatever the handler meets, the process dies after this: SIGALRM's default.
constexpr unsigned kHandlerBoundS = kSymbolizeBoundMs / 1000 + 3;
constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

pid_t this_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// Set before the train function starts, read after: no lock.
std::pair<std::string, std::string> g_library_name;
std::atomic<int> g_train_thread{0};  // its tid

// ---- Symbolizing: not async-signal-safe; never in a handler.

std::string hex(uintptr_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%zx", static_cast<size_t>(value));
  return text;
}

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
  for (size_t i = 0; i < count; ++i) lines.push_back(describe(frames[i]));
  return lines;
}

// ---- Capturing: async-signal-safe.

// Frames recorded, the terminating null frame not counted.
size_t capture(Frame* frames, size_t depth) {
  size_t stored = boost::stacktrace::safe_dump_to(0, frames, depth * sizeof(Frame));
  return stored > 0 ? stored - 1 : 0;
}

// The index of `address` among the frames, or `count`.
size_t find(const Frame* frames, size_t count, Frame address) {
  for (size_t i = 0; i < count; ++i) {
    if (frames[i] == address) return i;
  }
  return count;
}

// The word at `address`, or null where nothing can be read there: after a
// stack overflow the stack pointer is in the guard page, and a plain read
// would fault again inside the handler. process_vm_readv fails with EFAULT
// instead, and is async-signal-safe (a system call).
[[maybe_unused]] Frame read_word(const void* address) {
  Frame word = nullptr;
  iovec local{&word, sizeof(word)};
  iovec remote{const_cast<void*>(address), sizeof(word)};
  if (address == nullptr || ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) !=
                                static_cast<ssize_t>(sizeof(word))) {
    return nullptr;
  }
  return word;
}

// The stack a signal interrupted, from its instruction on: a handler's own
// frames and the kernel's trampoline are not the thread's. When the unwinder
// could not get past that instruction (a call through a null pointer, where
// there is nothing to unwind from), the instruction and the return address
// the call left on the stack.
size_t interrupted_stack(Frame* frames, size_t count, void* context) {
  if (context == nullptr) return count;
  const auto& machine = static_cast<ucontext_t*>(context)->uc_mcontext;
#if defined(__x86_64__)
  const auto pc = reinterpret_cast<Frame>(machine.gregs[REG_RIP]);
  const Frame caller = read_word(reinterpret_cast<const void*>(machine.gregs[REG_RSP]));
#elif defined(__aarch64__)
  const auto pc = reinterpret_cast<Frame>(machine.pc);
  const auto caller = reinterpret_cast<Frame>(machine.regs[30]);
#else
  (void)machine;
  return count;
#endif
  const size_t at = find(frames, count, pc);
  if (at < count) {
    std::memmove(frames, frames + at, (count - at) * sizeof(Frame));
    return count - at;
  }
  frames[0] = pc;
  frames[1] = caller;
  return 2;
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

// kCrashHeader's line: "trainrun: fatal signal SIGSEGV (Segmentation fault)
// in thread 12 "name" of process 10, its stack:".
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
  write_text(" of process ");
  write_number(static_cast<uintptr_t>(::getpid()), 10);
  write_text(note);
  write_text(", its stack:\n");
}

std::atomic<int> g_crashing{0};  // the tid of the thread whose crash is reported

void die_of(int signal) {
  ::signal(signal, SIG_DFL);
  // Blocked while its handler runs: delivered, with the default action, on
  // the return. A fault from an instruction would come again anyway.
  ::raise(signal);
}

// Symbolizes in a child, alone in its copy of the process: symbolizing
// allocates and takes locks, which the crashed thread may hold. True when the
// child wrote every frame.
bool symbolize_in_child(const Frame* frames, size_t count) {
  pid_t child = ::_Fork();
  if (child == 0) {
    try {
      auto lines = describe_all(frames, count);
      for (size_t i = 0; i < lines.size(); ++i) {
        auto line = std::string(kCrashFrame) + std::to_string(i) + " " + lines[i] + "\n";
        write_all(line.data(), line.size());
      }
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  if (child < 0) return false;
  for (int waited = 0; waited < kSymbolizeBoundMs; waited += 10) {
    int status = 0;
    const pid_t done = ::waitpid(child, &status, WNOHANG);
    if (done == child) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    // Reaped by someone else (SIGCHLD ignored): it finished, how is not known.
    if (done < 0 && errno == ECHILD) return true;
    struct timespec pause {
      0, 10'000'000
    };
    ::nanosleep(&pause, nullptr);
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  return false;
}

// Writes the faulting thread's stack, then dies of the same signal, so that
// whoever waits for the process sees how it ended.
void on_fatal_signal(int signal, siginfo_t*, void* context) noexcept {
  const int tid = this_tid();
  int reporting = 0;
  if (!g_crashing.compare_exchange_strong(reporting, tid)) {
    // This thread again (the handler faulted): die now. Another thread: the
    // first one's report is under way, and the process ends with it.
    if (reporting == tid) die_of(signal);
    while (true) ::pause();
  }
  ::alarm(kHandlerBoundS);
  write_header(signal, "");
  Frame frames[kDepth + 8] = {};
  const size_t count = interrupted_stack(frames, capture(frames, kDepth + 8), context);
  const size_t depth = std::min(count, kDepth);
  if (!symbolize_in_child(frames, depth)) {  // the addresses, under a header of their own
    write_header(signal, " (not symbolized)");
    for (size_t i = 0; i < depth; ++i) {
      write_text(kCrashFrame.data());
      write_number(i, 10);
      write_text(" 0x");
      write_number(reinterpret_cast<uintptr_t>(frames[i]), 16);
      write_text("\n");
    }
  }
  die_of(signal);
}

// ---- Throws: the C++ runtime's own __cxa_throw, after a note of where.

struct ThrowSite {
  size_t count = 0;
  Frame frames[32] = {};
  char what[256] = {};  // the start of what(), for a std::exception
};
thread_local ThrowSite t_last_throw;  // (an executable's TLS: no allocation)
thread_local bool t_records_throws = false;

void record_throw(void* object, const std::type_info* type, Frame thrower) {
  auto& site = t_last_throw;
  Frame frames[64] = {};
  const size_t count = capture(frames, 64);
  // From the thrower on, whatever this function and the unwinder add.
  const size_t at = find(frames, count, thrower);
  site.count = at < count ? std::min<size_t>(count - at, 32) : 0;
  std::memcpy(site.frames, frames + at, site.count * sizeof(Frame));
  site.what[0] = '\0';
  // typeid(std::exception) catches it: what() says which exception it is.
  void* adjusted = object;
  if (typeid(std::exception).__do_catch(type, &adjusted, 1)) {
    std::strncpy(site.what, static_cast<const std::exception*>(adjusted)->what(),
                 sizeof(site.what) - 1);
  }
}

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
  // Enough for the handler and the symbolizing child that starts on it, above
  // a guard page; the thread keeps it for its life.
  constexpr size_t kSize = 1 << 20;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto* memory = static_cast<char*>(
      ::mmap(nullptr, kSize + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (memory == MAP_FAILED) return;  // an overflow then dies without a stack
  ::mprotect(memory, page, PROT_NONE);
  stack_t stack{};
  stack.ss_sp = memory + page;
  stack.ss_size = kSize;
  if (::sigaltstack(&stack, nullptr) != 0) ::munmap(memory, kSize + page);
}

void name_library(const std::string& loaded, const std::string& shown) {
  if (!shown.empty()) g_library_name = {loaded, shown};
}

const std::pair<std::string, std::string>& library_name() { return g_library_name; }

void mark_train_thread() {
  g_train_thread = this_tid();
  t_records_throws = true;
}

int train_thread() { return g_train_thread.load(); }

void forget_last_throw() { t_last_throw.count = 0; }

std::vector<std::string> last_throw(const std::string& message) {
  const auto& site = t_last_throw;
  // Only the exception the message came from: another one thrown since (and
  // caught) would name the wrong place.
  const size_t known = std::strlen(site.what);
  const size_t common = std::min(known, message.size());
  if (site.count == 0 || known == 0 || message.compare(0, common, site.what, common) != 0)
    return {};
  // A shorter message: LibTorch's what() has its backtrace after a newline,
  // which the plugin leaves out; anything else is another exception.
  if (common < known && site.what[common] != '\n') return {};
  return describe_all(site.frames, site.count);
}

}  // namespace trainrun::stacks

// Every exception thrown in this process passes here first (the executable's
// definition comes before the C++ runtime's); one thrown on the train thread,
// not while another unwinds, is noted with where it was thrown. A walk of the
// stack per such throw: train functions throw rarely.
extern "C" [[noreturn]] void __cxa_throw(void* object, void* type, void (*destructor)(void*)) {
  if (trainrun::stacks::t_records_throws && std::uncaught_exceptions() == 0) {
    trainrun::stacks::t_records_throws = false;  // a throw in here is not noted
    trainrun::stacks::record_throw(object, static_cast<const std::type_info*>(type),
                                   __builtin_return_address(0));
    trainrun::stacks::t_records_throws = true;
  }
  using Throw = void (*)(void*, void*, void (*)(void*));
  static const auto real = reinterpret_cast<Throw>(::dlsym(RTLD_NEXT, "__cxa_throw"));
  if (real == nullptr) std::abort();
  real(object, type, destructor);
  __builtin_unreachable();
}

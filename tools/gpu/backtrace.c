// Preloaded by tools/gpu/run.sh's debug stage: on SIGSEGV, SIGBUS, SIGFPE,
// SIGILL or SIGABRT a process prints where it was to stderr (the controller
// keeps a worker's stderr in logs/worker-<rank>.log and echoes it), then dies
// of the same signal. The GPU machine has no gdb, and NVIDIA's libraries carry
// no unwind tables, so besides glibc's backtrace() it prints the faulting
// instruction and every word near the stack pointer that points into an
// executable mapping, each as "file(+offset)" for tools/gpu/symbolize.py.
#define _GNU_SOURCE
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

struct mapping {
  uintptr_t start, end, offset;
  char path[256];
};
static struct mapping maps[512];
static int map_count;

static void read_maps(void) {
  FILE* f = fopen("/proc/self/maps", "r");
  if (f == NULL) return;
  char line[512];
  map_count = 0;
  while (map_count < 512 && fgets(line, sizeof line, f) != NULL) {
    struct mapping* m = &maps[map_count];
    char perms[8] = {0};
    m->path[0] = '\0';
    if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %255s", &m->start, &m->end, perms, &m->offset,
               m->path) >= 4 &&
        perms[2] == 'x' && m->path[0] == '/') {
      ++map_count;
    }
  }
  fclose(f);
}

// The file offset of an address, which addr2line takes for a PIE or a library
// whose first segment maps at offset 0 (true of what is linked here).
static int print_address(const char* what, uintptr_t address) {
  for (int i = 0; i < map_count; ++i) {
    if (address >= maps[i].start && address < maps[i].end) {
      dprintf(2, "%s %s(+0x%lx)[0x%lx]\n", what, maps[i].path,
              (unsigned long)(address - maps[i].start + maps[i].offset), (unsigned long)address);
      return 1;
    }
  }
  return 0;
}

static void on_signal(int sig, siginfo_t* info, void* context) {
  ucontext_t* uc = (ucontext_t*)context;
  uintptr_t pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
  uintptr_t* sp = (uintptr_t*)uc->uc_mcontext.gregs[REG_RSP];
  dprintf(2, "\n*** backtrace.c: signal %d at address %p, thread %ld\n", sig, info->si_addr,
          (long)gettid());
  read_maps();  // not async-signal-safe, but the process is dying anyway
  if (!print_address("pc", pc)) dprintf(2, "pc 0x%lx in no executable mapping\n", (unsigned long)pc);
  void* frames[64];
  int count = backtrace(frames, 64);
  backtrace_symbols_fd(frames, count, 2);
  dprintf(2, "*** stack words that point into code:\n");
  int found = 0;
  for (int i = 0; i < 512 && found < 40; ++i) found += print_address("ret?", sp[i]);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc_s now, not inside the handler
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_signal;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  const int signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  for (unsigned i = 0; i < sizeof signals / sizeof signals[0]; ++i) {
    sigaction(signals[i], &action, NULL);
  }
}

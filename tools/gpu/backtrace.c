// Preloaded by tools/gpu/run.sh's debug stage: on SIGSEGV, SIGBUS, SIGFPE,
// SIGILL or SIGABRT a process prints where it was to stderr (the controller
// keeps a worker's stderr in logs/worker-<rank>.log and echoes it), then dies
// of the same signal. For machines without gdb, and for libraries without
// unwind tables (NVIDIA's): besides glibc's backtrace() it prints the faulting
// instruction and every word between the stack pointer and the end of its
// mapping (at most 512) that points into an executable mapping, each as
// "file(+offset)" for tools/gpu/symbolize.py. The offset is the file offset,
// which addr2line takes for binaries whose code's file offsets equal its
// addresses (GNU ld's layout). /proc/self/maps is read with open/read into a
// static buffer: nothing in the handler allocates.
#define _GNU_SOURCE
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

struct mapping {
  uintptr_t start, end, offset;
  int executable;
  const char* path;  // into maps_text, or ""
};
static char maps_text[1 << 20];
static struct mapping maps[4096];
static int map_count;

static void read_maps(void) {
  int fd = open("/proc/self/maps", O_RDONLY);
  if (fd < 0) return;
  size_t size = 0;
  ssize_t n;
  while (size < sizeof maps_text - 1 &&
         (n = read(fd, maps_text + size, sizeof maps_text - 1 - size)) > 0) {
    size += (size_t)n;
  }
  close(fd);
  maps_text[size] = '\0';
  map_count = 0;
  for (char* line = maps_text; *line != '\0' && map_count < 4096;) {
    char* end = strchr(line, '\n');
    if (end != NULL) *end = '\0';
    struct mapping* m = &maps[map_count];
    char* cursor = line;
    m->start = strtoul(cursor, &cursor, 16);
    m->end = strtoul(cursor + 1, &cursor, 16);
    m->executable = cursor[3] == 'x';               // " r-xp"
    m->offset = strtoul(cursor + 6, &cursor, 16);  // after the permissions
    strtoul(cursor, &cursor, 16);                  // device major
    strtoul(cursor + 1, &cursor, 16);              // device minor
    strtoul(cursor, &cursor, 10);                  // inode
    while (*cursor == ' ') ++cursor;
    m->path = cursor;
    ++map_count;
    if (end == NULL) break;
    line = end + 1;
  }
}

static const struct mapping* find(uintptr_t address) {
  for (int i = 0; i < map_count; ++i) {
    if (address >= maps[i].start && address < maps[i].end) return &maps[i];
  }
  return NULL;
}

static int print_address(const char* what, uintptr_t address) {
  const struct mapping* m = find(address);
  if (m == NULL || !m->executable || m->path[0] != '/') return 0;
  dprintf(2, "%s %s(+0x%lx)[0x%lx]\n", what, m->path,
          (unsigned long)(address - m->start + m->offset), (unsigned long)address);
  return 1;
}

static void on_signal(int sig, siginfo_t* info, void* context) {
  ucontext_t* uc = (ucontext_t*)context;
  uintptr_t pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
  uintptr_t* sp = (uintptr_t*)uc->uc_mcontext.gregs[REG_RSP];
  dprintf(2, "\n*** backtrace.c: signal %d at address %p, thread %ld\n", sig, info->si_addr,
          (long)gettid());
  read_maps();
  if (!print_address("pc", pc)) dprintf(2, "pc 0x%lx in no executable mapping\n", (unsigned long)pc);
  void* frames[64];
  int count = backtrace(frames, 64);
  backtrace_symbols_fd(frames, count, 2);
  dprintf(2, "*** stack words that point into code:\n");
  const struct mapping* stack = find((uintptr_t)sp);
  size_t words = stack == NULL ? 0 : (stack->end - (uintptr_t)sp) / sizeof *sp;
  if (words > 512) words = 512;
  int found = 0;
  for (size_t i = 0; i < words && found < 40; ++i) found += print_address("ret?", sp[i]);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc_s now, not inside the handler
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_signal;
  action.sa_flags = SA_SIGINFO;
  const int signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  for (unsigned i = 0; i < sizeof signals / sizeof signals[0]; ++i) {
    sigaction(signals[i], &action, NULL);
  }
}

#include "common/signals.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <tuple>

namespace trainrun {
namespace {

// The live SignalPipe's write end, as the handler can read it: a plain int.
int g_write_fd = -1;
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGUSR1};
constexpr size_t kCount = sizeof(kSignals) / sizeof(kSignals[0]);

void on_signal(int signal) {
  int saved = errno;
  auto byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] auto n = ::write(g_write_fd, &byte, 1);
  errno = saved;
}

}  // namespace

SignalPipe::SignalPipe() {
  if (g_write_fd >= 0) {
    throw UsageError(
        "another trainrun run is live in this process: runs in one process go one after another");
  }
  std::tie(read_fd_, write_fd_) = make_pipe(O_NONBLOCK, "signal pipe");
  g_write_fd = write_fd_.get();
  struct sigaction action {};
  action.sa_handler = &on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (size_t i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &action, &previous_[i]);
  // A closed stdout (`trainrun ... | head`) must not end the run: writes to it
  // fail with EPIPE instead, and output still reaches the logs.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, &previous_pipe_);
  // The launcher may have blocked them (a mask survives exec): a worker's exit
  // that never arrives would be blamed on its peers.
  sigset_t ours;
  sigemptyset(&ours);
  for (int sig : kSignals) sigaddset(&ours, sig);
  ::pthread_sigmask(SIG_UNBLOCK, &ours, &previous_mask_);
}

SignalPipe::~SignalPipe() {
  ::pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
  ::sigaction(SIGPIPE, &previous_pipe_, nullptr);
  for (size_t i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &previous_[i], nullptr);
  // A late handler then writes to -1, not to whatever next takes this number.
  g_write_fd = -1;
  read_fd_.reset();
  write_fd_.reset();
}

std::vector<int> SignalPipe::drain() {
  std::vector<int> signals;
  unsigned char buffer[64];
  ssize_t n;
  while ((n = ::read(read_fd_.get(), buffer, sizeof(buffer))) > 0) {
    signals.insert(signals.end(), buffer, buffer + n);
  }
  return signals;
}

std::string signal_description(int signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  std::string name =
      abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
  const char* text = ::sigdescr_np(signal);
  return text != nullptr ? name + " (" + text + ")" : name;
}

std::string exit_description(std::optional<int> code, int signal) {
  return code ? "exited with code " + std::to_string(*code)
              : "was killed by " + signal_description(signal);
}

}  // namespace trainrun

#include "controller/local_worker.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

extern char** environ;

namespace trainrun {
namespace {

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

LocalWorker spawn_local_worker(const std::filesystem::path& executable,
                               const std::vector<std::string>& args,
                               const std::vector<std::string>& env) {
  // Everything the child needs is prepared before fork: between fork and exec
  // only async-signal-safe calls are allowed in a multi-threaded process.
  std::vector<std::string> argv_strings{executable.string()};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    auto key = entry.substr(0, entry.find('=') + 1);
    bool overridden = false;
    for (const auto& add : env) overridden |= add.rfind(key, 0) == 0;
    if (!overridden) env_strings.push_back(entry);
  }
  env_strings.insert(env_strings.end(), env.begin(), env.end());
  auto argv = c_strings(argv_strings);
  auto envp = c_strings(env_strings);

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw IoError(std::string("cannot create worker pipes: ") + std::strerror(errno));
  }
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw IoError(std::string("cannot fork a worker: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the controller died before prctl
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) ::signal(sig, SIG_DFL);
    ::execve(argv[0], argv.data(), envp.data());
    const char message[] = "trainrun: cannot execute the worker executable\n";
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, message, sizeof(message) - 1);
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  return LocalWorker{pid, out[0], err[0]};
}

}  // namespace trainrun

#include "common/local_worker.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "common/parent.h"

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
  // argv and the environment, with `env` and the controller's pid replacing
  // what this process inherited under the same names.
  std::vector<std::string> argv_strings{executable.string()};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    auto key = entry.substr(0, entry.find('=') + 1);
    bool overridden = key == std::string(kParentPidVariable) + "=";
    for (const auto& add : env) overridden |= add.rfind(key, 0) == 0;
    if (!overridden) env_strings.push_back(entry);
  }
  env_strings.insert(env_strings.end(), env.begin(), env.end());
  // The worker asks for SIGKILL when this process dies (die_with_parent()).
  env_strings.push_back(std::string(kParentPidVariable) + "=" + std::to_string(::getpid()));
  auto argv = c_strings(argv_strings);
  auto envp = c_strings(env_strings);

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    throw IoError(std::string("cannot create worker pipes: ") + std::strerror(errno));
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    int error = errno;
    ::close(out[0]);
    ::close(out[1]);
    throw IoError(std::string("cannot create worker pipes: ") + std::strerror(error));
  }
  // posix_spawn, not fork: the child shares the controller's memory until it
  // execs (clone with CLONE_VFORK), so spawning costs no copy of the page
  // tables, which grow with the controller (or the host program embedding it):
  // fork made spawning a thousand workers quadratic.
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  ::posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  ::posix_spawnattr_init(&attributes);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) sigaddset(&defaults, sig);
  ::posix_spawnattr_setsigmask(&attributes, &none);
  ::posix_spawnattr_setsigdefault(&attributes, &defaults);
  ::posix_spawnattr_setpgroup(&attributes, 0);  // its own process group
  ::posix_spawnattr_setflags(
      &attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  int error = ::posix_spawn(&pid, argv[0], &actions, &attributes, argv.data(), envp.data());
  ::posix_spawnattr_destroy(&attributes);
  ::posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    throw IoError("cannot execute the worker executable " + executable.string() + ": " +
                  std::strerror(error));
  }
  ::close(out[1]);
  ::close(err[1]);
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  return LocalWorker{pid, out[0], err[0]};
}

}  // namespace trainrun

#include "common/local_worker.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <utility>

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

  auto [out_read, out_write] = make_pipe(0, "worker pipes");
  auto [err_read, err_write] = make_pipe(0, "worker pipes");
  // posix_spawn, not fork: the child shares the controller's memory until it
  // execs (clone with CLONE_VFORK), so spawning costs no copy of the page
  // tables, which grow with the controller (or the host program embedding it):
  // fork made spawning a thousand workers quadratic.
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, out_write.get(), STDOUT_FILENO);
  ::posix_spawn_file_actions_adddup2(&actions, err_write.get(), STDERR_FILENO);
  ::posix_spawnattr_init(&attributes);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGUSR1}) sigaddset(&defaults, sig);
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
    throw IoError("cannot execute the worker executable " + executable.string() + ": " +
                  std::strerror(error));
  }
  // Only the worker (and what it starts) holds the write ends now: its exit is their EOF.
  out_write.reset();
  err_write.reset();
  ::fcntl(out_read.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(err_read.get(), F_SETFL, O_NONBLOCK);
  return LocalWorker{pid, std::move(out_read), std::move(err_read)};
}

}  // namespace trainrun

#include "tune/trial_process.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/parent.h"

extern char** environ;

namespace trainrun::tune {
namespace {

// Frees the file actions and attributes whichever way spawn_trial leaves.
struct SpawnSetup {
  posix_spawn_file_actions_t actions{};
  posix_spawnattr_t attributes{};
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attributes);
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
  }
};

}  // namespace

TrialProcess spawn_trial(const std::filesystem::path& trainrun, const std::filesystem::path& log,
                         const std::vector<std::string>& env) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    throw IoError(std::string("cannot make a trial's channel: ") + std::strerror(errno));
  }
  Fd ours(pair[0]);
  Fd theirs(pair[1]);
  Fd output(::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!output) throw IoError("cannot open " + log.string() + ": " + std::strerror(errno));

  SpawnSetup setup;
  // dup2 clears close-on-exec on the copy: the trial gets these three.
  posix_spawn_file_actions_adddup2(&setup.actions, theirs.get(), kTrialChannelFd);
  posix_spawn_file_actions_adddup2(&setup.actions, output.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&setup.actions, output.get(), STDERR_FILENO);
  posix_spawn_file_actions_addopen(&setup.actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_setflags(&setup.attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&setup.attributes, 0);

  // The trial's own values replace inherited ones (getenv takes the first).
  auto replaced = [&env](const std::string& entry) {
    const auto key = entry.substr(0, entry.find('=') + 1);
    if (key == std::string(kParentPidVariable) + "=") return true;
    return std::any_of(env.begin(), env.end(),
                       [&key](const std::string& e) { return e.rfind(key, 0) == 0; });
  };
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    if (!replaced(entry)) environment.push_back(std::move(entry));
  }
  environment.push_back(std::string(kParentPidVariable) + "=" + std::to_string(::getpid()));
  for (const auto& entry : env) environment.push_back(entry);
  std::vector<char*> envp;
  for (auto& entry : environment) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::string program = trainrun.string();
  std::string command = "trial";
  std::vector<char*> argv{program.data(), command.data(), nullptr};

  pid_t pid = -1;
  const int error = ::posix_spawn(&pid, program.c_str(), &setup.actions, &setup.attributes,
                                  argv.data(), envp.data());
  if (error != 0) {
    throw IoError("cannot start " + program + ": " + std::strerror(error));
  }
  return TrialProcess{pid, LineChannel(std::move(ours))};
}

std::optional<int> try_reap(pid_t pid) {
  int status = 0;
  pid_t got;
  do {
    got = ::waitpid(pid, &status, WNOHANG);
  } while (got < 0 && errno == EINTR);
  if (got == 0) return std::nullopt;
  if (got < 0) return 127;  // not our child any more: nothing to wait for
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return std::nullopt;
}

}  // namespace trainrun::tune

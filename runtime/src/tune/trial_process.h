#pragma once

// A trial's process: `trainrun trial`, the channel's other end as its
// descriptor 3, its output appended to a log file, in a process group of its
// own (a terminal's Ctrl-C reaches the tuner, which stops trials in order),
// and dying with the tuner (common/parent.h).

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tune/trial_channel.h"

namespace trainrun::tune {

struct TrialProcess {
  pid_t pid = -1;
  LineChannel channel;
};

/// Starts `trainrun trial` with `env` added to this process's environment.
/// Throws IoError.
TrialProcess spawn_trial(const std::filesystem::path& trainrun, const std::filesystem::path& log,
                         const std::vector<std::string>& env);

/// Its exit code once it has exited (128 + the signal that ended it);
/// nothing while it runs.
std::optional<int> try_reap(pid_t pid);

}  // namespace trainrun::tune

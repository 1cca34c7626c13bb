#pragma once

// A worker process started on this host, by the controller or a node agent:
// posix_spawn of `trainrun-worker ...`, its stdout and stderr on pipes its
// parent reads, in its own process group (so a terminal's Ctrl-C reaches only
// the parent, which stops workers in order), and told its parent's pid so that
// it sets PR_SET_PDEATHSIG itself (common/parent.h: a killed parent leaves no
// orphan). Its pipes' read ends are Fds: whoever reads them takes them.

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/fd.h"

namespace trainrun {

struct LocalWorker {
  pid_t pid = -1;
  Fd stdout_fd;  // non-blocking read ends
  Fd stderr_fd;
};

/// Starts `executable args...` with `env` added to this process's environment.
/// Throws IoError.
LocalWorker spawn_local_worker(const std::filesystem::path& executable,
                               const std::vector<std::string>& args,
                               const std::vector<std::string>& env);

}  // namespace trainrun

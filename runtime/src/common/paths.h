#pragma once

#include <filesystem>
#include <string>

namespace trainrun {

/// The default plugin cache: $TRAINRUN_CACHE_DIR, else $XDG_CACHE_HOME/trainrun,
/// else ~/.cache/trainrun.
std::filesystem::path default_cache_dir();

/// The `trainrun-worker` executable: beside the running executable, else
/// beside the library this code is in (libtrainrun.so in a build tree) or in
/// its prefix's bin/ (installed), else on PATH. Throws UsageError when there
/// is none.
std::filesystem::path find_worker_executable();

/// The `trainrun` executable (a tuner runs each trial in one), found as
/// find_worker_executable finds its own.
std::filesystem::path find_trainrun_executable();

/// A new, empty directory under the system's temporary directory, named
/// `prefix` and a unique suffix. Throws IoError.
std::filesystem::path make_temp_dir(const std::string& prefix);

}  // namespace trainrun

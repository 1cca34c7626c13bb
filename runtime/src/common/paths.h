#pragma once

#include <filesystem>

namespace trainrun {

/// The default plugin cache: $TRAINRUN_CACHE_DIR, else $XDG_CACHE_HOME/trainrun,
/// else ~/.cache/trainrun.
std::filesystem::path default_cache_dir();

/// The `trainrun-worker` executable: beside the running executable, else on
/// PATH. Throws UsageError when there is none.
std::filesystem::path find_worker_executable();

}  // namespace trainrun

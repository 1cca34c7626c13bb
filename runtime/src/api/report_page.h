#pragma once

// report.html: one self-contained page per run (Chart.js inlined, no network)
// with every reported metric against iteration and time, the checkpoints
// (best marked), the attempts, the run's facts and its error. Built from what
// the run directory holds, so a finished run's page can be written again at
// any time (`trainrun results DIR --html FILE`).

#include <cstddef>
#include <filesystem>
#include <string>

namespace trainrun {

/// The page of the run in `run_dir`. `live`: the run is going on, and the
/// page reloads itself every few seconds. Throws as load_result does.
std::string report_page(const std::filesystem::path& run_dir, bool live);

/// Writes report_page() to `file` atomically (a reader sees the old page or
/// the new). Throws IoError.
void write_report_page(const std::filesystem::path& run_dir, const std::filesystem::path& file,
                       bool live);

/// About the most points a chart draws of one metric: longer series are
/// thinned to the lowest and highest value of each stretch, keeping the best
/// checkpoint, and the others while there are at most a quarter as many.
inline constexpr size_t kMaxChartPoints = 2000;
/// The most charts on a page (metrics in name order): a report may carry 4096.
inline constexpr size_t kMaxCharts = 64;

}  // namespace trainrun

#pragma once

// Chart.js (Debian's libjs-chart.js), inlined at build time: report.html
// carries it, so the page works offline.

namespace trainrun {

/// The library's minified UMD build, and its version.
extern const char* const kChartJs;
extern const char* const kChartJsVersion;

}  // namespace trainrun

#include "api/report_page.h"

#include <trainrun/error.h>
#include <trainrun/result.h>
#include <trainrun/tuner.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "api/chart_js.h"
#include "api/stored_run.h"
#include "common/atomic_file.h"
#include "common/metrics_format.h"
#include "storage/run_directory.h"
#include "storage/s3_config.h"

namespace trainrun {
namespace {

// Text from the run (metric names, error messages, config) inside HTML.
std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// JSON inside a <script> element: no "</script>" or "<!--" can end it early.
std::string script_json(const nlohmann::json& value) {
  auto text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '<': out += "\\u003c"; break;
      case '>': out += "\\u003e"; break;
      case '&': out += "\\u0026"; break;
      default: out += c;
    }
  }
  return out;
}

std::string dump(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// How a report's point is drawn: 0 a report, 1 a committed checkpoint still
// kept, 2 the best kept checkpoint.
enum Mark { kReport = 0, kCheckpoint = 1, kBest = 2 };

struct Point {
  int64_t iteration;
  double time;
  double value;
  int mark;
};

// At most about kMaxChartPoints: the lowest and highest value of each
// stretch, the best checkpoint, and the other checkpoints while they are few
// enough to leave room for the curve.
std::vector<Point> thin(std::vector<Point> points) {
  if (points.size() <= kMaxChartPoints) return points;
  const size_t marked = static_cast<size_t>(std::count_if(
      points.begin(), points.end(), [](const Point& p) { return p.mark != kReport; }));
  const bool keep_marks = marked <= kMaxChartPoints / 4;
  const size_t budget = kMaxChartPoints - (keep_marks ? marked : 1);
  const size_t stretch = (points.size() + budget / 2 - 1) / (budget / 2);
  std::vector<Point> kept;
  for (size_t begin = 0; begin < points.size(); begin += stretch) {
    const size_t end = std::min(points.size(), begin + stretch);
    std::set<size_t> chosen;
    size_t low = begin, high = begin;
    for (size_t i = begin; i < end; ++i) {
      if (points[i].value < points[low].value) low = i;
      if (points[i].value > points[high].value) high = i;
      if (points[i].mark == kBest || (keep_marks && points[i].mark != kReport)) chosen.insert(i);
    }
    chosen.insert(low);
    chosen.insert(high);
    for (size_t i : chosen) kept.push_back(points[i]);
  }
  if (kept.back().iteration != points.back().iteration) kept.push_back(points.back());
  return kept;
}

// Every numeric metric (booleans as 0 and 1) as a series of points.
nlohmann::json metric_series(const Result& result, const std::map<std::string, int>& marks) {
  std::map<std::string, std::vector<Point>> series;  // by name: the page's order
  for (const auto& record : result.history) {
    if (!record.metrics.is_object()) continue;
    auto mark = marks.find(record.checkpoint);
    const int m = record.checkpoint.empty() || mark == marks.end() ? kReport : mark->second;
    for (const auto& [name, value] : record.metrics.items()) {
      if (!value.is_number() && !value.is_boolean()) continue;
      double v = value.is_boolean() ? (value.get<bool>() ? 1.0 : 0.0) : value.get<double>();
      series[name].push_back({record.iteration, record.time_total_s, v, m});
    }
  }
  auto out = nlohmann::json::array();
  for (auto& [name, points] : series) {
    if (out.size() == kMaxCharts) break;
    auto rows = nlohmann::json::array();
    for (const auto& p : thin(std::move(points))) {
      rows.push_back({p.iteration, p.time, p.value, p.mark});
    }
    out.push_back({{"name", name}, {"points", std::move(rows)}});
  }
  return out;
}

void fact(std::ostringstream& out, std::string_view name, const std::string& value) {
  out << "<tr><th>" << escape(name) << "</th><td>" << escape(value) << "</td></tr>\n";
}

constexpr const char* kStyle = R"css(
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2330; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.status { display: inline-block; padding: 2px 10px; border-radius: 10px; color: #fff; font-weight: 600; }
.finished { background: #2e7d32; } .running { background: #1565c0; } .failed, .crashed { background: #c62828; }
.interrupted { background: #ef6c00; }
.error { border-left: 4px solid #c62828; background: #fdecea; padding: 8px 12px; white-space: pre-wrap; }
.stack { font-size: 12px; background: #f5f6f8; padding: 8px 12px; overflow-x: auto; }
table { border-collapse: collapse; } th, td { text-align: left; padding: 3px 12px 3px 0; vertical-align: top; }
tbody tr:nth-child(even) { background: #f5f6f8; } .num { font-variant-numeric: tabular-nums; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 16px; }
.chart { border: 1px solid #dde1e7; border-radius: 6px; padding: 8px; height: 260px; }
.best { font-weight: 600; } code { font-size: 12px; }
.axis button { margin-right: 4px; } .axis button.on { font-weight: 700; }
)css";

// Draws the charts from the JSON in #run-data; sets data-charts and
// data-axis on <body>, and each canvas's data-x to its x extent.
constexpr const char* kScript = R"js(
(function () {
  const data = JSON.parse(document.getElementById('run-data').textContent);
  const charts = [];
  // report.html#time opens with time on the x axis.
  let axis = location.hash === '#time' ? 'time' : 'iteration';
  const colors = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#17becf', '#8c564b'];
  function draw() {
    charts.forEach(c => c.destroy());
    charts.length = 0;
    const x = axis === 'iteration' ? 0 : 1;
    data.metrics.forEach((metric, i) => {
      const canvas = document.getElementById('chart-' + i);
      const points = metric.points.map(p => ({x: p[x], y: p[2], mark: p[3]}));
      // The x extent drawn, for a reader of the DOM (the Chromium test).
      canvas.dataset.x = points.length ? points[0].x + '..' + points[points.length - 1].x : '';
      charts.push(new Chart(canvas, {
        type: 'line',
        data: {datasets: [{
          label: metric.name, data: points, borderColor: colors[i % colors.length],
          backgroundColor: colors[i % colors.length], borderWidth: 1.5, tension: 0,
          pointRadius: c => [1.5, 4, 7][c.raw ? c.raw.mark : 0],
          pointStyle: c => (c.raw && c.raw.mark === 2 ? 'star' : c.raw && c.raw.mark === 1 ? 'rectRot' : 'circle'),
          pointBorderColor: c => (c.raw && c.raw.mark === 2 ? '#b8860b' : colors[i % colors.length]),
          pointBorderWidth: c => (c.raw && c.raw.mark === 2 ? 2 : 1)
        }]},
        options: {
          animation: false, maintainAspectRatio: false, parsing: {xAxisKey: 'x', yAxisKey: 'y'},
          scales: {x: {type: 'linear', ticks: {precision: axis === 'iteration' ? 0 : undefined},
                       title: {display: true, text: axis === 'iteration' ? 'iteration' : 'seconds'}}},
          plugins: {legend: {display: false}, title: {display: true, text: metric.name},
                    tooltip: {callbacks: {footer: items => {
                      const m = items[0].raw.mark;
                      return m === 2 ? 'best checkpoint' : m === 1 ? 'checkpoint' : '';
                    }}}}
        }
      }));
    });
    document.body.dataset.charts = String(charts.length);
    document.body.dataset.axis = axis;
  }
  document.querySelectorAll('.axis button').forEach(button => {
    button.classList.toggle('on', button.dataset.axis === axis);
    button.addEventListener('click', () => {
      axis = button.dataset.axis;
      document.querySelectorAll('.axis button').forEach(b => b.classList.toggle('on', b === button));
      draw();
    });
  });
  draw();
})();
)js";

}  // namespace

std::string report_page(const std::filesystem::path& run_dir, bool live) {
  Result result = load_result(run_dir);  // throws UsageError without run.json
  auto info = run_directory::read_run_info(run_dir);
  if (!info) throw UsageError(run_dir.string() + " holds no trainrun run (no run.json)");
  const auto& cfg = info->checkpoint;
  // Kept checkpoints; the best is the first of best_checkpoints when a score ranks them.
  std::map<std::string, int> marks;
  for (const auto& c : result.best_checkpoints) marks[c.name] = kCheckpoint;
  const bool scored = !cfg.score_attribute.empty();
  if (scored && !result.best_checkpoints.empty()) marks[result.best_checkpoints[0].name] = kBest;

  const auto status = std::string(to_string(result.status));
  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  if (live) out << "<meta http-equiv=\"refresh\" content=\"5\">\n";
  out << "<title>" << escape(info->name) << " - trainrun</title>\n<style>" << kStyle
      << "</style>\n</head>\n<body>\n";
  out << "<h1>" << escape(info->name) << " <span class=\"status " << status << "\" id=\"status\">"
      << status << "</span></h1>\n";
  out << "<div>" << result.iterations << " reports";
  if (!result.history.empty()) {
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%.1f", result.history.back().time_total_s);
    out << " in " << seconds << " s";
  }
  if (live) out << " &middot; live: this page reloads every 5 s";
  out << "</div>\n";
  if (result.error) {
    out << "<h2>Error</h2>\n<div class=\"error\" id=\"error\">" << escape(result.error->summary());
    if (result.error->attempt > 1) out << " (attempt " << result.error->attempt << ")";
    out << "</div>\n";
    if (!result.error->stack.empty()) {
      out << "<pre class=\"stack\" id=\"stack\">";
      for (size_t i = 0; i < result.error->stack.size(); ++i) {
        out << '#' << i << ' ' << escape(result.error->stack[i]) << '\n';
      }
      out << "</pre>\n";
    }
  }

  auto series = metric_series(result, marks);
  out << "<h2>Metrics</h2>\n";
  if (series.size() == kMaxCharts) {
    out << "<p>The first " << kMaxCharts << " numeric metrics by name are charted.</p>\n";
  }
  if (series.empty()) {
    out << "<p>No numeric metric reported yet.</p>\n";
  } else {
    out << "<div class=\"axis\">x axis: <button data-axis=\"iteration\" class=\"on\">iteration"
           "</button><button data-axis=\"time\">time (s)</button></div>\n<div class=\"charts\">\n";
    for (size_t i = 0; i < series.size(); ++i) {
      out << "<div class=\"chart\"><canvas id=\"chart-" << i << "\"></canvas></div>\n";
    }
    out << "</div>\n";
  }
  if (!result.history.empty()) {
    out << "<h2>Latest metrics</h2>\n<table id=\"latest\"><tbody>\n";
    for (const auto& [name, value] : result.metrics.items()) {
      out << "<tr><th>" << escape(name) << "</th><td class=\"num\">" << escape(format_value(value))
          << "</td></tr>\n";
    }
    out << "</tbody></table>\n";
  }

  out << "<h2>Checkpoints</h2>\n";
  if (result.best_checkpoints.empty()) {
    out << "<p>None committed.</p>\n";
  } else {
    out << "<p>"
        << (scored ? "Best first by " + escape(cfg.score_attribute) + " (" +
                         (cfg.score_max ? "max" : "min") + ")"
                   : std::string("Most recent first"))
        << "; marked on the charts (&#9733; the best).</p>\n"
        << "<table id=\"checkpoints\"><thead><tr><th>checkpoint</th><th>iteration</th>"
           "<th>metrics</th><th></th></tr></thead><tbody>\n";
    for (const auto& c : result.best_checkpoints) {
      const bool best = marks[c.name] == kBest;
      out << "<tr" << (best ? " class=\"best\"" : "") << "><td>" << escape(c.name)
          << "</td><td class=\"num\">" << c.iteration << "</td><td>"
          << escape(format_metrics(c.metrics)) << "</td><td>" << (best ? "&#9733; best" : "")
          << (c.path == result.checkpoint ? " latest" : "") << "</td></tr>\n";
    }
    out << "</tbody></table>\n";
  }

  if (!result.attempts.empty()) {
    out << "<h2>Attempts</h2>\n<table id=\"attempts\"><thead><tr><th>attempt</th><th>workers</th>"
           "<th>started</th><th>ended</th><th>resumed from</th><th>ended by</th></tr></thead>"
           "<tbody>\n";
    for (const auto& a : result.attempts) {
      out << "<tr><td>" << a.attempt << "</td><td>" << a.world_size << "</td><td>"
          << escape(a.started_at) << "</td><td>" << escape(a.ended_at) << "</td><td>"
          << escape(a.resumed_from) << "</td><td>"
          << escape(a.error       ? a.error->summary()
                    : a.regrouped ? std::string("regrouped to take more workers")
                                  : std::string())
          << "</td></tr>\n";
    }
    out << "</tbody></table>\n";
  }

  bool any_recovery = false;
  for (const auto& a : result.attempts) any_recovery = any_recovery || !a.recoveries.empty();
  if (any_recovery) {
    out << "<h2>Recovered in place</h2>\n<table id=\"recoveries\"><thead><tr><th>attempt</th>"
           "<th>rank lost</th><th>how</th><th>at</th><th>step</th><th>workers left</th>"
           "<th>steps lost</th><th>seconds to the next step</th>"
           "<th>replacement caught up after (s)</th></tr></thead><tbody>\n";
    for (const auto& a : result.attempts) {
      for (const auto& r : a.recoveries) {
        out << "<tr><td>" << a.attempt << "</td><td>" << r.rank << "</td><td>" << escape(r.cause)
            << "</td><td>" << escape(r.at) << "</td><td class=\"num\">" << r.step
            << "</td><td class=\"num\">" << r.world_size << "</td><td class=\"num\">"
            << r.steps_lost << "</td><td class=\"num\">" << r.seconds << "</td><td class=\"num\">";
        if (r.replacement_pid != 0) {
          out << r.caught_up_seconds;
        } else {
          out << "none";
        }
        out << "</td></tr>\n";
      }
    }
    out << "</tbody></table>\n";
  }

  out << "<h2>Run</h2>\n<table id=\"facts\"><tbody>\n";
  // Spelled one way however the directory was named: the run and `trainrun
  // results --html` write the same page.
  auto directory = std::filesystem::absolute(run_dir).lexically_normal();
  if (directory.filename().empty()) directory = directory.parent_path();
  fact(out, "directory", directory.string());
  fact(out, "started", info->started_at);
  fact(out, "ended", info->ended_at.empty() ? "-" : info->ended_at);
  auto workers = std::to_string(info->scaling.num_workers);
  if (info->scaling.min_workers > 0 && info->scaling.min_workers < info->scaling.num_workers) {
    workers = std::to_string(info->scaling.min_workers) + ":" + workers;
  }
  fact(out, "workers",
       workers + (info->scaling.use_gpu ? " (one GPU each)" : " (CPU)") + ", " +
           std::to_string(info->scaling.cpus_per_worker) + " threads each");
  fact(out, "plugin", info->plugin.path + " (" + info->plugin.entry + ")");
  fact(out, "plugin sha256", info->plugin.sha256);
  fact(out, "config", dump(info->config));
  fact(out, "max failures", std::to_string(info->max_failures));
  fact(out, "controller host", info->controller_host);
  fact(out, "versions", "trainrun " + info->trainrun_version + ", LibTorch " + info->torch_version);
  out << "</tbody></table>\n";

  out << "<p><small>trainrun report, charts by Chart.js " << kChartJsVersion
      << " (MIT License)</small></p>\n";
  nlohmann::json data = {{"name", info->name}, {"status", status}, {"metrics", series}};
  out << "<script id=\"run-data\" type=\"application/json\">" << script_json(data)
      << "</script>\n<script>" << kChartJs << "</script>\n<script>" << kScript
      << "</script>\n</body></html>\n";
  return out.str();
}

void write_report_page(const std::filesystem::path& run_dir, const std::filesystem::path& file,
                       bool live) {
  // Derived from the run's records: a power cut may lose it, never half of it.
  write_file_atomic(file, report_page(run_dir, live), Durability::kUnsynced);
}

// The page replaces a regular file, or makes a new one: a rename over a link,
// a fifo or a device would replace it, not write to it.
namespace {

void check_page_target(const std::filesystem::path& file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto type = fs::symlink_status(file, ec).type();
  if (type != fs::file_type::regular && type != fs::file_type::not_found) {
    if (ec) throw IoError("cannot inspect " + file.string() + ": " + ec.message());
    const char* what = type == fs::file_type::symlink     ? "a symbolic link"
                       : type == fs::file_type::directory ? "a directory"
                       : type == fs::file_type::fifo      ? "a fifo"
                       : type == fs::file_type::character ? "a character device"
                       : type == fs::file_type::block     ? "a block device"
                       : type == fs::file_type::socket    ? "a socket"
                                                          : "not a regular file";
    throw UsageError(file.string() + " is " + what +
                     ": the page goes to a new path or replaces a regular file");
  }
}

// Each trial's curve of the experiment's metric on one chart.
constexpr const char* kExperimentScript = R"js(
(function () {
  const data = JSON.parse(document.getElementById('experiment-data').textContent);
  const colors = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#17becf', '#8c564b',
                  '#e377c2', '#7f7f7f', '#bcbd22'];
  const chart = new Chart(document.getElementById('chart-metric'), {
    type: 'line',
    data: {datasets: data.trials.map((t, i) => ({
      label: t.name, data: t.points.map(p => ({x: p[0], y: p[1]})),
      borderColor: colors[i % colors.length], backgroundColor: colors[i % colors.length],
      borderWidth: t.best ? 3 : 1.2, pointRadius: 1.5, tension: 0}))},
    options: {animation: false, maintainAspectRatio: false,
              scales: {x: {type: 'linear', ticks: {precision: 0},
                           title: {display: true, text: 'iteration'}},
                       y: {title: {display: true, text: data.metric}}},
              plugins: {title: {display: true, text: data.metric + ' of each trial'}}}
  });
  document.body.dataset.charts = '1';
  document.body.dataset.trials = String(chart.data.datasets.length);
})();
)js";

std::string experiment_page(const ResultGrid& grid) {
  const auto* best = grid.best();
  nlohmann::json trials = nlohmann::json::array();
  for (const auto& t : grid.trials) {
    std::vector<Point> points;
    for (const auto& r : t.result.history) {
      if (!r.metrics.is_object()) continue;
      auto it = r.metrics.find(grid.metric);
      if (it == r.metrics.end() || !it->is_number()) continue;
      points.push_back({r.iteration, r.time_total_s, it->get<double>(), kReport});
    }
    nlohmann::json xy = nlohmann::json::array();
    for (const auto& p : thin(std::move(points))) xy.push_back({p.iteration, p.value});
    trials.push_back({{"name", t.name}, {"points", xy}, {"best", &t == best}});
  }
  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      << "<title>" << escape(grid.path.filename().string()) << ": trainrun experiment</title>\n"
      << "<style>" << kStyle
      << ".stopped { background: #6d4c41; } .pending { background: #757575; }"
      << "</style></head>\n<body>\n<h1>" << escape(grid.path.filename().string()) << "</h1>\n"
      << "<p>" << grid.trials.size() << " trials, " << escape(grid.metric) << " ("
      << (grid.max ? "max" : "min") << ")";
  if (best != nullptr && best->best) {
    out << "; best " << escape(nlohmann::json(*best->best).dump()) << " by " << escape(best->name);
  }
  out << "</p>\n<div class=\"chart\" style=\"height: 420px\"><canvas id=\"chart-metric\">"
      << "</canvas></div>\n<h2>Trials</h2>\n<table><thead><tr><th>trial</th><th>status</th>"
      << "<th>hyperparameters</th><th>reports</th><th>best</th><th>note</th></tr></thead><tbody>\n";
  for (const auto& t : grid.trials) {
    const auto status = std::string(to_string(t.status));
    out << "<tr" << (&t == best ? " class=\"best\"" : "") << "><td>" << escape(t.name)
        << "</td><td><span class=\"status " << status << "\">" << status << "</span></td><td><code>"
        << escape(dump(t.config)) << "</code></td><td class=\"num\">" << t.iterations
        << "</td><td class=\"num\">" << (t.best ? escape(nlohmann::json(*t.best).dump()) : "-")
        << "</td><td>" << escape(t.note) << "</td></tr>\n";
  }
  out << "</tbody></table>\n<p><small>trainrun experiment report, charts by Chart.js "
      << kChartJsVersion << " (MIT License)</small></p>\n";
  nlohmann::json data = {{"metric", grid.metric}, {"trials", trials}};
  out << "<script id=\"experiment-data\" type=\"application/json\">" << script_json(data)
      << "</script>\n<script>" << kChartJs << "</script>\n<script>" << kExperimentScript
      << "</script>\n</body></html>\n";
  return out.str();
}

}  // namespace

void write_experiment_report(const std::filesystem::path& dir, const std::filesystem::path& file) {
  check_page_target(file);
  write_file_atomic(file, experiment_page(load_experiment(dir)), Durability::kUnsynced);
}

void write_html_report(const std::filesystem::path& run_dir, const std::filesystem::path& file) {
  check_page_target(file);
  if (s3::is_s3_url(run_dir.string())) {
    StoredRun stored(run_dir.string());
    write_report_page(stored.dir(), file, /*live=*/false);
    return;
  }
  write_report_page(run_dir, file, /*live=*/false);
}

}  // namespace trainrun

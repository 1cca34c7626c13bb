#include "fake_runs.h"

#include <fstream>

trainrun::TrainerOptions fake_options(const std::filesystem::path& root, int workers,
                                      nlohmann::json script, const std::string& name) {
  trainrun::TrainerOptions options;
  options.plugin = TEST_PLUGIN;  // inspected by the controller; fake workers never load it
  options.entry = "context";
  options.config = std::move(script);
  options.scaling.num_workers = workers;
  options.scaling.cpus_per_worker = 1;
  options.run.name = name;
  options.run.storage_path = root / "results";
  options.run.startup_timeout = std::chrono::seconds(30);
  options.cache_dir = root / "cache";
  options.worker_executable = FAKE_WORKER;
  options.verbose = false;
  return options;
}

std::vector<std::string> read_lines(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// trainrun-worker: one worker process. Started by the controller for local
// workers, or by a cluster launcher (Slurm, Kubernetes, ssh) as
// `trainrun worker --connect tcp://HOST:PORT`.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>

#include "common/parent.h"
#include "common/paths.h"
#include "common/run_key.h"
#include "common/secret.h"
#include "worker/worker.h"

int main(int argc, char** argv) {
  trainrun::die_with_parent();
  auto secret = trainrun::take_secret_from_environment();
  CLI::App app{"trainrun-worker: runs train functions for a trainrun controller"};
  trainrun::WorkerOptions options;
  int64_t startup_ms = 0;
  app.add_option("--connect", options.connect, "the controller's endpoint, tcp://HOST:PORT")
      ->required();
  app.add_option("--index", options.index, "launch index of a local worker");
  app.add_option("--cache-dir", options.cache_dir, "plugin cache directory");
  app.add_option("--startup-timeout-ms", startup_ms, "how long to wait for the assignment");
  std::filesystem::path key_file;
  app.add_option("--auth-key", key_file, "the run key (trainrun keygen) the controller was given")
      ->envname(trainrun::kAuthKeyVariable);
  app.add_option("--interface", options.interface,
                 "the network interface for gradient traffic (default: the one that reaches "
                 "the controller)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (options.cache_dir.empty()) options.cache_dir = trainrun::default_cache_dir();
  options.startup_timeout = std::chrono::milliseconds(startup_ms);
  options.secret = secret;
  try {
    if (!key_file.empty()) {
      options.keys = trainrun::RunKeys::derive(trainrun::read_run_key(key_file));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainrun worker: %s\n", e.what());
    return 2;
  }
  return trainrun::run_worker(options);
}

// trainrun-worker: one worker process. Started by the controller for local
// workers, or by a cluster launcher (Slurm, Kubernetes, ssh) as
// `trainrun worker --connect tcp://HOST:PORT`; with `--nproc N` (or in a Slurm
// step of one task per node) it is the node's agent, which starts N workers
// and supervises them (agent/node_agent.h).

#include <trainrun/options.h>

#include <CLI/CLI.hpp>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "agent/node_agent.h"
#include "cli/timeout_option.h"
#include "common/parent.h"
#include "common/paths.h"
#include "common/run_key.h"
#include "common/secret.h"
#include "worker/stacks.h"
#include "worker/worker.h"

int main(int argc, char** argv) {
  // A worker's helper that walks its threads' stacks (worker/stacks.h).
  if (argc == 4 && std::string_view(argv[1]) == "--walk-stacks") {
    return trainrun::stacks::walk_threads_main(std::atoi(argv[2]), std::atoi(argv[3]));
  }
  // A write to a socket whose peer is gone (the Gloo pair of a rank that
  // died) fails with EPIPE, which the backend raises, as under Python, which
  // ignores SIGPIPE: by default it would kill this rank, which would then pass
  // for the root cause. A handler, not SIG_IGN: what the train function
  // starts gets the default back at exec.
  struct sigaction broken_pipe {};
  broken_pipe.sa_handler = [](int) {};
  sigemptyset(&broken_pipe.sa_mask);
  ::sigaction(SIGPIPE, &broken_pipe, nullptr);
  // Started by a controller or a node agent: a worker, whatever a launcher's
  // environment it inherited says.
  const bool supervised = trainrun::die_with_parent();
  auto secret = trainrun::take_secret_from_environment();
  CLI::App app{
      "trainrun worker: start workers that join a trainrun run from this machine: a node "
      "agent of N workers (--nproc), or one worker",
      "trainrun worker"};
  trainrun::WorkerOptions options;
  double startup_s = trainrun::kDefaultStartupTimeout.count() / 1000.0;
  app.add_option("--connect", options.connect, "the controller's endpoint, tcp://HOST:PORT")
      ->required();
  app.add_option("--cache-dir", options.cache_dir,
                 "plugin cache directory (default $TRAINRUN_CACHE_DIR, else ~/.cache/trainrun)");
  trainrun::add_timeout_option(
      app, "--startup-timeout", startup_s,
      "seconds to wait for the controller to accept this agent or worker and give it its rank");
  // Set by the controller or the node agent for the workers they start.
  const std::string internal = "Set by trainrun for the workers it starts";
  app.add_option("--index", options.index, "launch index of a local worker")->group(internal);
  app.add_option("--attempt", options.attempt, "the attempt a node agent started this worker for")
      ->check(CLI::NonNegativeNumber)
      ->group(internal);
  app.add_option("--agent-pid", options.agent_pid, "the node agent that started this worker")
      ->check(CLI::NonNegativeNumber)
      ->group(internal);
  std::filesystem::path key_file;
  app.add_option("--auth-key", key_file, "the run key (trainrun keygen) the controller was given")
      ->envname(trainrun::kAuthKeyVariable);
  app.add_option("--interface", options.interface,
                 "the network interface for gradient traffic (default: the one that reaches "
                 "the controller)");
  int nproc = 0;
  app.add_option("--nproc", nproc,
                 "start and supervise this many workers on this host (default: one, this "
                 "process; in a Slurm step of one task per node, the job's tasks per node)")
      ->check(CLI::Range(1, 4096))
      ->excludes("--index");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (options.cache_dir.empty()) options.cache_dir = trainrun::default_cache_dir();
  options.startup_timeout = trainrun::from_seconds(startup_s);
  options.secret = secret;
  try {
    if (!key_file.empty()) {
      options.keys = trainrun::RunKeys::derive(trainrun::read_run_key(key_file));
    }
    if (nproc == 0 && !supervised) nproc = trainrun::slurm_workers_per_node().value_or(0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainrun worker: %s\n", e.what());
    return 2;
  }
  if (nproc > 0) {
    trainrun::AgentOptions agent;
    agent.nproc = nproc;
    agent.connect = options.connect;
    // This executable; the link itself where its file is gone (replaced by an upgrade).
    std::error_code ec;
    agent.worker_executable = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec || !std::filesystem::exists(agent.worker_executable)) {
      agent.worker_executable = "/proc/self/exe";
    }
    agent.cache_dir = options.cache_dir;
    agent.startup_timeout = options.startup_timeout;
    agent.key_file = key_file;
    agent.keys = options.keys;
    agent.interface = options.interface;
    return trainrun::run_agent(agent);
  }
  trainrun::run_worker(options);
}

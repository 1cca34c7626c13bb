// trainrun: run a compiled train function on N workers.
//   trainrun --plugin libx.so --num-workers 2 [--config k=v ...]
//   trainrun inspect libx.so
//   trainrun keygen FILE
//   trainrun results RUN_DIR [--html FILE]
//   trainrun tune --plugin libx.so --param lr=loguniform:1e-4:1e-1 --metric accuracy ...
//   trainrun pack DIR OUT/train-%06d.tar [--shard-size 256M]
//   trainrun index SHARDS...
//   trainrun worker --connect tcp://HOST:PORT   (runs trainrun-worker with these arguments)

#include <train/version.h>
#include <trainrun/error.h>
#include <trainrun/trainer.h>
#include <trainrun/tuner.h>

#include <CLI/CLI.hpp>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <optional>

#include "cli/config_args.h"
#include "cli/shards_command.h"
#include "cli/stacks_command.h"
#include "cli/timeout_option.h"
#include "cli/tune_command.h"
#include "common/constants.h"
#include "common/hash.h"
#include "common/paths.h"
#include "common/run_key.h"
#include "plugin/plugin_file.h"

namespace {

using trainrun::kExitFailed;
using trainrun::kExitInterrupted;
using trainrun::kExitOk;
using trainrun::kExitUsage;

int run_training(trainrun::TrainerOptions options, const std::filesystem::path& config_file,
                 const std::vector<std::string>& config_args) {
  options.config = trainrun::build_config(config_file, config_args);
  options.handle_signals = true;  // Ctrl-C, kill and a closed terminal end the run in order
  const bool in_process = options.scaling.in_process;
  trainrun::Trainer trainer(std::move(options));
  std::optional<trainrun::Result> finished;
  try {
    finished = trainer.fit();
  } catch (const std::exception& e) {
    if (!in_process) throw;
    // LibTorch is in this process, the train thread perhaps still in it: no
    // static destructor may run under it.
    std::cerr << "trainrun: " << e.what() << std::endl;
    std::fflush(nullptr);
    const bool usage = dynamic_cast<const trainrun::UsageError*>(&e) != nullptr ||
                       dynamic_cast<const trainrun::PluginError*>(&e) != nullptr;
    std::_Exit(usage ? kExitUsage : kExitFailed);
  }
  const auto& result = *finished;
  const int code = trainrun::exit_code(result);
  if (in_process && result.error) {
    // A stopped or failed train function may be running still, inside
    // LibTorch: as a worker process does, this one ends without static
    // destructors. A finished one has ended: the process ends as usual, and
    // a sanitizer's or coverage's exit handlers run.
    std::cout.flush();
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return code;
}

// "4", or "2:4" for an elastic group of 2 to 4 workers.
void parse_num_workers(const std::string& text, trainrun::ScalingConfig& scaling) {
  auto number = [&](const std::string& part) {
    if (part.empty() || part.size() > 6 ||
        part.find_first_not_of("0123456789") != std::string::npos || std::stoi(part) < 1) {
      throw CLI::ValidationError("--num-workers", "takes N or MIN:MAX, positive numbers; got '" +
                                                      text.substr(0, 32) + "'");
    }
    return std::stoi(part);
  };
  auto colon = text.find(':');
  scaling.num_workers = number(text.substr(colon == std::string::npos ? 0 : colon + 1));
  scaling.min_workers = colon == std::string::npos ? 0 : number(text.substr(0, colon));
  if (scaling.min_workers > scaling.num_workers) {
    throw CLI::ValidationError("--num-workers", "MIN is more than MAX in '" + text + "'");
  }
}

// "A:B": the first and last step to profile.
std::pair<int64_t, int64_t> parse_profile_steps(const std::string& text) {
  auto number = [&](const std::string& part) -> int64_t {
    if (part.empty() || part.size() > 12 ||
        part.find_first_not_of("0123456789") != std::string::npos) {
      throw CLI::ValidationError("--profile-steps", "takes FIRST:LAST, step numbers from 1; got '" +
                                                        text.substr(0, 32) + "'");
    }
    return std::stoll(part);
  };
  const auto colon = text.find(':');
  if (colon == std::string::npos) number("");  // the message
  std::pair<int64_t, int64_t> steps{number(text.substr(0, colon)), number(text.substr(colon + 1))};
  if (steps.first < 1 || steps.second < steps.first) {
    throw CLI::ValidationError(
        "--profile-steps",
        "takes FIRST:LAST with 1 <= FIRST <= LAST; got '" + text.substr(0, 32) + "'");
  }
  return steps;
}

}  // namespace

// `trainrun worker ARGS` is `trainrun-worker ARGS`: the worker is its own
// executable so that this one never loads LibTorch.
int exec_worker(int argc, char** argv) {
  std::string path = trainrun::find_worker_executable().string();
  std::vector<char*> args{path.data()};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(path.c_str(), args.data());
  std::cerr << "trainrun: cannot run " << path << ": " << std::strerror(errno) << "\n";
  return kExitFailed;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "worker") {
    try {
      return exec_worker(argc, argv);
    } catch (const trainrun::Error& e) {
      std::cerr << "trainrun: " << e.what() << "\n";
      return kExitUsage;
    }
  }
  // A tuner's trial: its options come from the tuner, not the command line.
  if (argc == 2 && std::string(argv[1]) == "trial") {
    try {
      return trainrun::run_trial();
    } catch (const trainrun::UsageError& e) {
      std::cerr << "trainrun trial: " << e.what() << "\n";
      return kExitUsage;
    } catch (const std::exception& e) {
      std::cerr << "trainrun trial: " << e.what() << "\n";
      return kExitFailed;
    }
  }
  // `trainrun stacks` signals a run's controller: one that arrives before the
  // run handles it, or after, is nothing (by default it would end the process).
  ::signal(SIGUSR1, SIG_IGN);
  CLI::App app{
      "trainrun: distributed data-parallel LibTorch training from C++.\n"
      "Runs a train function compiled into a plugin on N worker processes.",
      "trainrun"};
  app.set_version_flag("--version", std::string("trainrun ") + TRAIN_SDK_VERSION);
  app.require_subcommand(0, 1);
  // Listed for --help only: `trainrun worker ...` is handed to trainrun-worker
  // before CLI11 parses (exec_worker).
  app.add_subcommand("worker",
                     "start workers that join a run from another machine: trainrun worker "
                     "--connect tcp://HOST:PORT [--nproc N] (trainrun worker --help)");

  trainrun::TrainerOptions options;
  std::vector<std::string> config_args;
  std::filesystem::path config_file;
  // Every timeout in seconds, fractions allowed.
  auto in_seconds = [](std::chrono::milliseconds ms) { return ms.count() / 1000.0; };
  double heartbeat_s = in_seconds(options.run.heartbeat_timeout);
  double startup_s = in_seconds(options.run.startup_timeout);
  double collective_s = in_seconds(options.run.collective_timeout);
  app.add_option("--plugin", options.plugin, "the plugin (.so) built with the trainrun SDK");
  app.add_option("--entry", options.entry, "the train function to run, if the plugin has several");
  std::string num_workers = "1";
  app.add_option("-n,--num-workers", num_workers,
                 "worker processes: N, or MIN:MAX for an elastic group (default 1)");
  app.add_option("--config", config_args, "key=value handed to train_func (repeatable)");
  app.add_option("--config-file", config_file, "JSON object handed to train_func")
      ->check(CLI::ExistingFile);
  app.add_option("--storage-path", options.run.storage_path,
                 "where runs are stored (default ~/trainrun_results)");
  app.add_option("--name", options.run.name, "run name (default trainrun-<timestamp>)");
  app.add_option("--resume-from", options.run.resume_from,
                 "start from this committed checkpoint directory (any run's)");
  app.add_option("--cpus-per-worker", options.scaling.cpus_per_worker,
                 "intra-op threads per worker (default: cores / local workers)")
      ->check(CLI::PositiveNumber);
  app.add_option("--num-to-keep", options.checkpoint.num_to_keep,
                 "checkpoints kept, the best by score, and the latest (default: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-score-attribute", options.checkpoint.score_attribute,
                 "the reported metric that ranks checkpoints (default: most recent)");
  std::string score_order = "max";
  app.add_option("--checkpoint-score-order", score_order, "max or min (default max)")
      ->check(CLI::IsMember({"max", "min"}));
  std::string upload = "auto";
  app.add_option("--checkpoint-upload", upload,
                 "auto: workers that share the storage's filesystem copy checkpoint files "
                 "there; stream: through the controller's socket (default auto)")
      ->check(CLI::IsMember({"auto", "stream"}));
  app.add_option("--listen", options.network.listen,
                 "take remote workers on this endpoint, tcp://ADDRESS:PORT (port 0: any)");
  app.add_option("--local-workers", options.scaling.local_workers,
                 "workers started on this host (default: all without --listen, none with it)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--auth-key", options.network.auth_key_file,
                 "the run key (trainrun keygen): CURVE encryption and authentication for "
                 "remote workers")
      ->envname(trainrun::kAuthKeyVariable);
  app.add_flag("--insecure", options.network.insecure,
               "allow --listen on a non-loopback address without a run key");
  app.add_flag("--local", options.scaling.in_process,
               "run the train function in this process, as rank 0 of 1, for a debugger or a "
               "sanitizer: gdb --args trainrun --plugin x.so --local");
  app.add_flag("--use-gpu", options.scaling.use_gpu,
               "one CUDA device per worker (by local rank), NCCL for collectives");
  trainrun::add_timeout_option(
      app, "--heartbeat-timeout", heartbeat_s,
      "seconds of silence before a worker, node agent or the controller is lost (at least 0.1)");
  trainrun::add_timeout_option(
      app, "--startup-timeout", startup_s,
      "seconds for the workers to connect, and then for each to load the plugin, join the "
      "process group and start its train function");
  trainrun::add_timeout_option(app, "--collective-timeout", collective_s,
                               "seconds a collective may wait for its peers before its rank fails");
  app.add_option("--max-failures", options.failure.max_failures,
                 "failures the run survives, each restarting every worker from the latest "
                 "checkpoint (-1: no limit)")
      ->check(CLI::Range(-1, std::numeric_limits<int>::max()))
      ->capture_default_str();
  app.add_flag(
      "--no-standby", [&](int64_t) { options.failure.standby = false; },
      "with --max-failures, do not start the next attempt's local workers ahead of a failure "
      "(saves an idle process per local worker; restarts take longer)");
  std::string recovery = "restart";
  app.add_option("--recovery", recovery,
                 "with --max-failures, what a rank that dies does to the others: restart them "
                 "all from the latest checkpoint, or let them go on in-place without it (CPU)")
      ->check(CLI::IsMember({"restart", "in-place"}))
      ->capture_default_str();
  std::string profile_steps;
  app.add_option("--profile-steps", profile_steps,
                 "profile steps FIRST to LAST (a step: one backward pass through a prepared model) "
                 "on every rank with LibTorch's profiler, into <run>/profiles/rank-R.json")
      ->type_name("FIRST:LAST");
  app.add_flag(
      "--no-tensorboard", [&](int64_t) { options.run.tensorboard = false; },
      "write no TensorBoard event files (rank 0's metrics, in the run directory, for "
      "`tensorboard --logdir <storage_path>`)");
  app.add_flag(
      "-q,--quiet", [&](int64_t) { options.verbose = false; }, "only errors on the terminal");
  int progress_s = static_cast<int>(options.progress_interval.count());
  app.add_option("--progress-interval", progress_s,
                 "seconds between progress lines when the output is not a terminal (a "
                 "terminal gets a live status line); 0: neither")
      ->check(CLI::Range(0, 86400))
      ->capture_default_str();

  auto* tune = app.add_subcommand(
      "tune",
      "search hyperparameters: trials of the run's flags, each a run under the experiment's "
      "directory, packed on this host's CPUs, with FIFO, ASHA or PBT (Ray Tune's Tuner)");
  tune->fallthrough();  // every flag of a run applies to each trial
  trainrun::TuneArgs tune_args;
  trainrun::add_tune_options(*tune, tune_args);

  auto* results = app.add_subcommand(
      "results", "print what a run or an experiment left: metrics, checkpoints, error, trials");
  std::filesystem::path results_dir;
  results->add_option("run_dir", results_dir, "<storage_path>/<name>")->required();
  std::filesystem::path html_file;
  results->add_option("--html", html_file,
                      "also write the run's page (charts of every metric, checkpoints, error) "
                      "to this file");

  auto* stacks = app.add_subcommand(
      "stacks", "print every thread's stack of every worker of a live run (also in its logs/)");
  std::filesystem::path stacks_dir;
  stacks->add_option("run_dir", stacks_dir, "<storage_path>/<name>")->required();

  auto* keygen = app.add_subcommand(
      "keygen",
      "write a new run key (mode 0600) for --auth-key: the one secret a deployment shares");
  std::filesystem::path key_path;
  keygen->add_option("file", key_path, "where to write it (never replaced)")->required();

  auto* pack = app.add_subcommand(
      "pack",
      "pack a directory of files (or one folder of files per class, as torchvision's "
      "ImageFolder) into WebDataset tar shards, each with its index");
  trainrun::PackOptions pack_options;
  std::string shard_size = "256M";
  pack->add_option("dir", pack_options.source, "the files")->required();
  pack->add_option("pattern", pack_options.pattern,
                   "where the shards go, with one integer conversion (out/train-%06d.tar)")
      ->required();
  pack->add_option("--shard-size", shard_size, "bytes per shard at most (K, M, G)")
      ->capture_default_str();
  pack->add_option("--shard-samples", pack_options.shard_samples,
                   "samples per shard at most (0: no limit)");
  auto* index = app.add_subcommand(
      "index", "index tar shards written elsewhere (Python's webdataset): <shard>.idx beside each");
  std::vector<std::string> index_specs;
  index->add_option("shards", index_specs, "shard paths, globs or brace ranges")->required();

  auto* inspect = app.add_subcommand("inspect", "print a plugin's entries and versions");
  std::filesystem::path inspect_path;
  inspect->add_option("plugin", inspect_path, "the plugin (.so)")->required();

  try {
    app.parse(argc, argv);
    parse_num_workers(num_workers, options.scaling);
    if (!profile_steps.empty()) options.profile_steps = parse_profile_steps(profile_steps);
    options.failure.in_place = recovery == "in-place";
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }

  try {
    if (*results && std::filesystem::exists(results_dir / "experiment.json")) {
      std::cout << trainrun::describe(trainrun::load_experiment(results_dir));
      if (!html_file.empty()) {
        trainrun::write_experiment_report(results_dir, html_file);
        std::cout << "wrote " << html_file.string() << "\n";
      }
      return kExitOk;
    }
    if (*results) {
      std::cout << trainrun::describe(trainrun::load_result(results_dir));
      if (!html_file.empty()) {
        trainrun::write_html_report(results_dir, html_file);
        std::cout << "wrote " << html_file.string() << "\n";
      }
      return kExitOk;
    }
    if (*stacks) {
      // The workers' answers, and then a moment for the file.
      return trainrun::print_stacks(stacks_dir, trainrun::kStacksWait + std::chrono::seconds(3));
    }
    if (*keygen) {
      trainrun::write_run_key(key_path);
      std::cout << "wrote a run key to " << key_path.string()
                << "; give it to the controller and every node with --auth-key\n";
      return kExitOk;
    }
    if (*pack) {
      pack_options.shard_bytes = trainrun::parse_bytes(shard_size);
      trainrun::pack_directory(pack_options, std::cout);
      return kExitOk;
    }
    if (*index) {
      trainrun::index_shards(index_specs, std::cout);
      return kExitOk;
    }
    if (*inspect) {
      auto info = trainrun::inspect_plugin_file(inspect_path);
      std::cout << trainrun::describe(info, trainrun::sha256_file(inspect_path));
      return kExitOk;
    }
    if (options.plugin.empty()) {
      std::cerr << "trainrun: --plugin is required (see trainrun --help)\n";
      return kExitUsage;
    }
    options.checkpoint.score_max = score_order == "max";
    options.checkpoint.always_stream = upload == "stream";
    options.run.heartbeat_timeout = trainrun::from_seconds(heartbeat_s);
    options.run.startup_timeout = trainrun::from_seconds(startup_s);
    options.run.collective_timeout = trainrun::from_seconds(collective_s);
    options.progress_interval = std::chrono::seconds(progress_s);
    if (*tune) {
      options.config = trainrun::build_config(config_file, config_args);
      return trainrun::run_tune(std::move(options), std::move(tune_args));
    }
    options.status_line = true;
    return run_training(std::move(options), config_file, config_args);
  } catch (const trainrun::PluginError& e) {
    std::cerr << "trainrun: " << e.what() << "\n";
    return kExitUsage;
  } catch (const trainrun::UsageError& e) {
    std::cerr << "trainrun: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "trainrun: " << e.what() << "\n";
    return kExitFailed;
  }
}

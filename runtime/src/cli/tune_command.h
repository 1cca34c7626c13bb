#pragma once

// `trainrun tune`'s options, and `trainrun trial`: the process a tuner starts
// for each trial (tune/trial_channel.h).

#include <trainrun/result.h>
#include <trainrun/tuner.h>

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace trainrun {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInterrupted = 130;

/// The command's exit code for a run's result.
int exit_code(const Result& result);

/// What `trainrun tune` adds to a run's flags.
struct TuneArgs {
  std::vector<std::string> params;  // KEY=DOMAIN
  TuneConfig tune;
  std::string mode = "max";
  std::string scheduler = "fifo";
};

/// Adds `tune`'s own options to its subcommand.
void add_tune_options(CLI::App& command, TuneArgs& args);

/// Runs the experiment with `trainer` as every trial's options. Returns the exit code.
int run_tune(TrainerOptions trainer, TuneArgs args);

/// `trainrun trial`: reads its options from the channel, runs them, asks the
/// tuner at each report whether to go on. Returns the exit code.
int run_trial();

}  // namespace trainrun

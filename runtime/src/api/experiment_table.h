#pragma once

// The table of trials (Ray Tune's "Trial Status"): a count of trials by
// status, then a row per trial with its hyperparameters, reports and best
// value of the metric. The live tuner prints it, and `trainrun results`.

#include <trainrun/tuner.h>

#include <string>
#include <vector>

#include "tune/experiment.h"

namespace trainrun {

/// A trial as the record has it, without its run's Result.
TrialResult trial_result(const tune::TrialRecord& trial);

std::vector<std::string> trial_table(const std::vector<TrialResult>& trials,
                                     const std::string& metric, bool max);

}  // namespace trainrun

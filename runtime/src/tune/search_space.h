#pragma once

// The search space: its domains checked, sampled, and expanded into the
// trials' hyperparameters as Ray Tune's BasicVariantGenerator does
// (num_samples times every combination of the grids, the other keys drawn).

#include <trainrun/tuner.h>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tune/random.h"

namespace trainrun::tune {

/// The most trials one experiment makes.
inline constexpr size_t kMostTrials = 10000;

/// Checks every domain (bounds, list sizes, key names). Throws UsageError in one line.
void check_space(const ParamSpace& space);

/// One value drawn from a domain that is not a grid.
nlohmann::json sample(const Domain& domain, Random& random);

/// Every trial's hyperparameters, in order: for each of num_samples, every
/// combination of the grids (the first key's values outermost), each with
/// the other keys drawn from `seed`'s stream. Throws UsageError beyond
/// kMostTrials.
std::vector<nlohmann::json> make_trials(const ParamSpace& space, int num_samples, uint64_t seed);

/// The space as the record keeps it, exactly: {key: {"domain": "loguniform:1e-04:0.1",
/// "low": 0.0001, "high": 0.1}, key: {"domain": "choice:a,b", "values": ["a", "b"]}}.
nlohmann::json space_to_json(const ParamSpace& space);

}  // namespace trainrun::tune

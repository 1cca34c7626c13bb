#include "tune/search_space.h"

#include <trainrun/error.h>

#include <cmath>

namespace trainrun {

using json = nlohmann::json;

namespace tune {

json sample(const Domain& domain, Random& random) {
  switch (domain.kind) {
    case Domain::Kind::kGrid:
    case Domain::Kind::kChoice: return domain.values[random.below(domain.values.size())];
    case Domain::Kind::kUniform: return domain.low + random.uniform() * (domain.high - domain.low);
    case Domain::Kind::kLogUniform: {
      const double low = std::log(domain.low);
      return std::exp(low + random.uniform() * (std::log(domain.high) - low));
    }
    case Domain::Kind::kRandInt: {
      const auto span = static_cast<uint64_t>(domain.high - domain.low);
      return static_cast<int64_t>(domain.low) + static_cast<int64_t>(random.below(span));
    }
  }
  return nullptr;
}

std::vector<json> make_trials(const ParamSpace& space, int num_samples, uint64_t seed) {
  check_space(space);
  if (num_samples < 1) throw UsageError("num_samples must be at least 1");
  std::vector<const std::pair<const std::string, Domain>*> grids;
  size_t combinations = 1;
  for (const auto& entry : space) {
    if (entry.second.kind != Domain::Kind::kGrid) continue;
    grids.push_back(&entry);
    combinations *= entry.second.values.size();
    if (combinations > kMostTrials) break;
  }
  if (combinations > kMostTrials || combinations * static_cast<size_t>(num_samples) > kMostTrials) {
    throw UsageError("search space: more than " + std::to_string(kMostTrials) +
                     " trials (num_samples times the grids' combinations)");
  }
  Random random(seed);
  std::vector<json> trials;
  for (int s = 0; s < num_samples; ++s) {
    for (size_t c = 0; c < combinations; ++c) {
      json config = json::object();
      // The last grid's values change fastest.
      size_t rest = c;
      for (auto g = grids.rbegin(); g != grids.rend(); ++g) {
        const auto& values = (*g)->second.values;
        config[(*g)->first] = values[rest % values.size()];
        rest /= values.size();
      }
      for (const auto& [key, domain] : space) {
        if (domain.kind != Domain::Kind::kGrid) config[key] = sample(domain, random);
      }
      trials.push_back(std::move(config));
    }
  }
  return trials;
}

json space_to_json(const ParamSpace& space) {
  json j = json::object();
  for (const auto& [key, domain] : space) {
    const bool list = domain.kind == Domain::Kind::kGrid || domain.kind == Domain::Kind::kChoice;
    j[key] = list
                 ? json{{"domain", domain.to_string()}, {"values", domain.values}}
                 : json{{"domain", domain.to_string()}, {"low", domain.low}, {"high", domain.high}};
  }
  return j;
}

}  // namespace tune
}  // namespace trainrun

// ShardSampler: the assignment of shards' samples to this rank, its position,
// and prepare_data_loader for sharded datasets.

#include <train/shards.h>

#include "data/shards/assignment.h"

#include <deque>
#include <optional>

namespace train {
namespace {

// Names a dataset by its shards' sample counts (FNV-1a): a position saved for
// other shards is refused.
int64_t counts_fingerprint(const std::vector<uint64_t>& counts) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (uint64_t count : counts) {
    for (int i = 0; i < 8; ++i) {
      hash ^= count >> (8 * i) & 0xff;
      hash *= 0x100000001b3ULL;
    }
  }
  return static_cast<int64_t>(hash);
}

int64_t read_int(torch::serialize::InputArchive& archive, const char* key) {
  torch::Tensor value;
  archive.read(key, value, /*is_buffer=*/true);
  return value.item<int64_t>();
}

void write_int(torch::serialize::OutputArchive& archive, const char* key, int64_t value) {
  archive.write(key, torch::tensor(value), /*is_buffer=*/true);
}

}  // namespace

struct ShardSampler::State {
  std::vector<uint64_t> counts;
  shards::PlanOptions options;
  uint64_t world = 1, rank = 0;
  size_t epoch = 0;
  // Segments of `history_epoch` before the current one (a world of another
  // size consumed them).
  std::optional<size_t> history_epoch;
  std::vector<shards::Segment> history;
  // The options `history_epoch` was planned with (a position saved under
  // others: another shuffle block, say), used for that epoch only.
  std::optional<shards::PlanOptions> history_options;
  std::optional<std::pair<size_t, size_t>> resume;
  // The plan of `plan_epoch` under the history it was made with.
  std::unique_ptr<shards::EpochPlan> plan;
  size_t plan_epoch = 0;
  std::vector<shards::Segment> plan_history;
  size_t counted_epoch = 0;         // the epoch the counts below are of (reset's)
  size_t position = 0;              // items next() gave
  size_t start = 0;                 // where the epoch started (a resume's)
  std::deque<size_t> issued;        // batches next() gave, not yet handed out
  std::optional<size_t> yielded;    // items handed out, counting
  std::function<void(const std::vector<size_t>&)> on_block;
  std::optional<uint64_t> hinted;   // the block on_block was called for last

  std::vector<shards::Segment> history_of(size_t of) const {
    return history_epoch == of ? history : std::vector<shards::Segment>{};
  }
  const shards::PlanOptions& options_of(size_t of) const {
    return history_epoch == of && history_options ? *history_options : options;
  }
  shards::EpochPlan& plan_of(size_t of) {
    auto segments = history_of(of);
    if (!plan || plan_epoch != of || plan_history != segments) {
      plan = std::make_unique<shards::EpochPlan>(counts, options_of(of), of, segments, world, rank);
      plan_epoch = of;
      plan_history = std::move(segments);
    }
    return *plan;
  }
};

ShardSampler::ShardSampler(std::vector<uint64_t> counts, const Context& ctx, bool shuffle,
                           bool allow_duplicates, uint64_t seed, const ShardOptions& options)
    : state_(std::make_shared<State>()) {
  if (options.chunk_samples() == 0 || options.shuffle_buffer() == 0) {
    throw std::invalid_argument("train::ShardSampler: chunk_samples and shuffle_buffer must be "
                                "at least 1");
  }
  state_->counts = std::move(counts);
  state_->options.shuffle = shuffle;
  state_->options.pad = allow_duplicates;
  state_->options.seed = seed;
  state_->options.chunk = options.chunk_samples();
  state_->options.buffer = options.shuffle_buffer();
  state_->world = static_cast<uint64_t>(ctx.world_size());
  state_->rank = static_cast<uint64_t>(ctx.world_rank());
}

ShardSampler::~ShardSampler() = default;

void ShardSampler::set_epoch(size_t epoch) { state_->epoch = epoch; }

void ShardSampler::resume(size_t epoch, size_t position) {
  state_->resume = std::make_pair(epoch, position);
}

void ShardSampler::reset(c10::optional<size_t> /*new_size*/) {
  auto& state = *state_;
  const size_t size = state.plan_of(state.epoch).size();
  state.position = 0;
  if (state.resume && state.resume->first == state.epoch) {
    state.position = std::min(state.resume->second, size);
  }
  state.resume.reset();
  state.counted_epoch = state.epoch;
  state.start = state.position;
  state.issued.clear();
  state.yielded.reset();
  state.hinted.reset();
}

void ShardSampler::on_block(std::function<void(const std::vector<size_t>&)> hook) {
  state_->on_block = std::move(hook);
}

c10::optional<std::vector<size_t>> ShardSampler::next(size_t batch_size) {
  auto& state = *state_;
  auto& plan = state.plan_of(state.epoch);
  if (state.position >= plan.size()) return c10::nullopt;
  const size_t end = std::min<size_t>(plan.size(), state.position + batch_size);
  std::vector<size_t> batch;
  batch.reserve(end - state.position);
  for (size_t k = state.position; k < end; ++k) {
    const uint64_t buffer = state.options_of(state.epoch).buffer;
    const uint64_t block = k / buffer;
    if (state.on_block && state.hinted != block) {
      // The whole block, from here on: what the next batches read.
      state.hinted = block;
      std::vector<size_t> ahead;
      const size_t block_end = std::min<size_t>(plan.size(), (block + 1) * buffer);
      ahead.reserve(block_end - k);
      for (size_t i = k; i < block_end; ++i) ahead.push_back(plan.sample(i));
      state.on_block(ahead);
    }
    batch.push_back(plan.sample(k));
  }
  state.issued.push_back(end - state.position);
  state.position = end;
  return batch;
}

void ShardSampler::yielded(size_t samples) {
  auto& state = *state_;
  if (samples == 0) {  // the epoch began
    state.yielded = state.start;
    return;
  }
  if (state.issued.empty()) return;
  state.yielded = state.yielded.value_or(state.start) + state.issued.front();
  state.issued.pop_front();
}

void ShardSampler::save(torch::serialize::OutputArchive& archive) const {
  const auto& state = *state_;
  write_int(archive, "shards.samples_fingerprint", counts_fingerprint(state.counts));
  write_int(archive, "shards.epoch", static_cast<int64_t>(state.epoch));
  write_int(archive, "shards.world", static_cast<int64_t>(state.world));
  // What was handed out of the epoch set: nothing yet when it was set after
  // the last one began (a loop's top), or where it is to resume.
  size_t consumed = state.yielded.value_or(state.position);
  if (state.counted_epoch != state.epoch) {
    consumed = state.resume && state.resume->first == state.epoch ? state.resume->second : 0;
  }
  write_int(archive, "shards.consumed", static_cast<int64_t>(consumed));
  const auto& options = state.options_of(state.epoch);
  archive.write("shards.plan",
                torch::tensor({static_cast<int64_t>(options.seed), int64_t{options.shuffle},
                               int64_t{options.pad}, static_cast<int64_t>(options.chunk),
                               static_cast<int64_t>(options.buffer)}),
                /*is_buffer=*/true);
  const auto segments = state.history_of(state.epoch);
  auto history = torch::zeros({static_cast<int64_t>(segments.size()), 2}, torch::kInt64);
  for (size_t i = 0; i < segments.size(); ++i) {
    history[static_cast<int64_t>(i)][0] = static_cast<int64_t>(segments[i].world);
    history[static_cast<int64_t>(i)][1] = static_cast<int64_t>(segments[i].consumed);
  }
  archive.write("shards.history", history, /*is_buffer=*/true);
}

void ShardSampler::load(torch::serialize::InputArchive& archive) {
  auto& state = *state_;
  if (read_int(archive, "shards.samples_fingerprint") != counts_fingerprint(state.counts)) {
    throw std::runtime_error(
        "train::ShardSampler: the saved position is for shards of other sample counts than "
        "these (another dataset, or shards written again): it cannot be resumed here");
  }
  const auto epoch = read_int(archive, "shards.epoch");
  const auto world = read_int(archive, "shards.world");
  const auto consumed = read_int(archive, "shards.consumed");
  torch::Tensor history;
  archive.read("shards.history", history, /*is_buffer=*/true);
  if (epoch < 0 || world <= 0 || consumed < 0 || history.dim() != 2 ||
      (history.size(0) > 0 && history.size(1) != 2) || history.size(0) > 1'000'000) {
    throw std::runtime_error("train::ShardSampler: the saved position is malformed");
  }
  std::vector<shards::Segment> segments;
  history = history.to(torch::kInt64).contiguous();
  for (int64_t i = 0; i < history.size(0); ++i) {
    const int64_t w = history[i][0].item<int64_t>(), c = history[i][1].item<int64_t>();
    if (w <= 0 || c < 0) throw std::runtime_error("train::ShardSampler: the saved position is malformed");
    segments.push_back({static_cast<uint64_t>(w), static_cast<uint64_t>(c)});
  }
  // The epoch goes on planned as it began; the next ones take these options.
  torch::Tensor plan;
  archive.read("shards.plan", plan, /*is_buffer=*/true);
  plan = plan.to(torch::kInt64).contiguous();
  if (plan.numel() != 5 || plan[3].item<int64_t>() <= 0 || plan[4].item<int64_t>() <= 0) {
    throw std::runtime_error("train::ShardSampler: the saved position is malformed");
  }
  shards::PlanOptions saved;
  saved.seed = static_cast<uint64_t>(plan[0].item<int64_t>());
  saved.shuffle = plan[1].item<int64_t>() != 0;
  saved.pad = plan[2].item<int64_t>() != 0;
  saved.chunk = static_cast<uint64_t>(plan[3].item<int64_t>());
  saved.buffer = static_cast<uint64_t>(plan[4].item<int64_t>());
  const bool same_world = static_cast<uint64_t>(world) == state.world;
  if (!same_world) segments.push_back({static_cast<uint64_t>(world), static_cast<uint64_t>(consumed)});
  try {  // replayed now, so that a position that does not fit fails here
    shards::EpochPlan(state.counts, saved, static_cast<uint64_t>(epoch), segments, state.world,
                      state.rank);
  } catch (const std::invalid_argument& error) {
    throw std::runtime_error(std::string("train::ShardSampler: the saved position does not fit "
                                         "these shards: ") + error.what());
  }
  state.epoch = static_cast<size_t>(epoch);
  state.history_epoch = state.epoch;
  state.history = std::move(segments);
  state.history_options = saved;
  state.resume.reset();
  if (same_world && consumed > 0) state.resume = std::make_pair(state.epoch, static_cast<size_t>(consumed));
  state.position = state.start = same_world ? static_cast<size_t>(consumed) : 0;
  state.counted_epoch = state.epoch;
  state.yielded.reset();
  state.issued.clear();
}

size_t ShardSampler::local_size() const { return state_->plan_of(state_->epoch).size(); }

size_t ShardSampler::epoch() const { return state_->epoch; }

size_t ShardSampler::resume_position() const {
  const auto& state = *state_;
  return state.resume && state.resume->first == state.epoch ? state.resume->second : 0;
}

ShardSampler detail::shard_sampler(const std::vector<uint64_t>& counts,
                                   const ShardOptions& sampler_options,
                                   const LoaderOptions& options) {
  auto ctx = get_context();
  if (ctx.world_size() > 1) {
    uint64_t size = 0;
    for (uint64_t count : counts) size += count;
    detail::check_same_dataset_size(size, "prepare_data_loader");
    // The same total can be shards of other sizes, which cut other chunks.
    detail::check_same_on_every_rank(
        counts_fingerprint(counts), "prepare_data_loader",
        "the shards' sample counts differ between ranks (the same samples packed into shards of "
        "other sizes?): every rank must read the same shards");
  }
  return ShardSampler(counts, ctx, options.shuffle(), options.allow_duplicates(), options.seed(),
                      sampler_options);
}

DataLoader<ShardDataset, ShardSampler> prepare_data_loader(ShardDataset dataset,
                                                           const LoaderOptions& options) {
  auto sampler = detail::shard_sampler(
      dataset.reader().counts(),
      ShardOptions(dataset.options()).shuffle_buffer(dataset.shuffle_buffer()), options);
  sampler.on_block([reader = dataset](const std::vector<size_t>& samples) {
    reader.read_ahead(samples);
  });
  return DataLoader<ShardDataset, ShardSampler>(std::move(dataset), std::move(sampler), options,
                                                get_context().device());
}

}  // namespace train

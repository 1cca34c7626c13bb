#include "data/shards/assignment.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace train::shards {

Ranges::Ranges(std::vector<std::pair<uint64_t, uint64_t>> spans) {
  for (const auto& span : spans) {
    if (span.second <= span.first) continue;
    spans_.push_back(span);
    before_.push_back(size() + (span.second - span.first));
  }
}

uint64_t Ranges::at(uint64_t i) const {
  const auto it = std::upper_bound(before_.begin(), before_.end(), i);
  if (it == before_.end()) throw std::out_of_range("position past the ranges' end");
  const auto span = static_cast<size_t>(it - before_.begin());
  const uint64_t first = span == 0 ? 0 : before_[span - 1];
  return spans_[span].first + (i - first);
}

Ranges Ranges::without(std::vector<std::pair<uint64_t, uint64_t>> drop) const {
  std::sort(drop.begin(), drop.end());
  std::vector<std::pair<uint64_t, uint64_t>> kept;
  uint64_t index = 0;  // indices before it are settled
  auto keep = [&](uint64_t from, uint64_t to) {  // indices [from, to), mapped to positions
    while (from < to) {
      const auto it = std::upper_bound(before_.begin(), before_.end(), from);
      const auto span = static_cast<size_t>(it - before_.begin());
      const uint64_t first = span == 0 ? 0 : before_[span - 1];
      const uint64_t end = std::min(to, before_[span]);
      const uint64_t position = spans_[span].first + (from - first);
      if (!kept.empty() && kept.back().second == position) {
        kept.back().second += end - from;
      } else {
        kept.emplace_back(position, position + (end - from));
      }
      from = end;
    }
  };
  for (const auto& [from, to] : drop) {
    if (from > index) keep(index, std::min(from, size()));
    index = std::max(index, std::min(to, size()));
  }
  keep(index, size());
  return Ranges(std::move(kept));
}

uint64_t Random::seed(std::initializer_list<uint64_t> parts) {
  Random mix(0x6a09e667f3bcc909ULL);
  uint64_t seed = 0;
  for (uint64_t part : parts) seed = Random(seed ^ part ^ mix.next()).next();
  return seed;
}

uint64_t Random::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t Random::below(uint64_t n) {
  // The high half of a 128-bit product, redrawn in the few cases that would bias it.
  unsigned __int128 product = static_cast<unsigned __int128>(next()) * n;
  auto low = static_cast<uint64_t>(product);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      product = static_cast<unsigned __int128>(next()) * n;
      low = static_cast<uint64_t>(product);
    }
  }
  return static_cast<uint64_t>(product >> 64);
}

namespace {

// Fisher-Yates over `items`, drawn from `random`.
template <typename T>
void shuffle(std::vector<T>& items, Random& random) {
  for (size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[random.below(i)]);
}

constexpr uint64_t kChunkStream = 1, kBlockStream = 2;  // which draw a seed is for

}  // namespace

EpochPlan::EpochPlan(const std::vector<uint64_t>& counts, const PlanOptions& options,
                     uint64_t epoch, const std::vector<Segment>& done, uint64_t world,
                     uint64_t rank)
    : options_(options), epoch_(epoch) {
  if (world == 0 || rank >= world) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " is not below the world size " +
                                std::to_string(world));
  }
  if (options_.chunk == 0 || options_.buffer == 0) {
    throw std::invalid_argument("a shard chunk and a shuffle buffer hold at least one sample");
  }
  // The chunks, then their epoch order.
  std::vector<std::pair<uint64_t, uint64_t>> chunks;  // first sample, samples
  uint64_t first = 0;
  for (uint64_t count : counts) {
    for (uint64_t at = 0; at < count; at += options_.chunk) {
      chunks.emplace_back(first + at, std::min(options_.chunk, count - at));
    }
    first += count;
  }
  total_ = first;
  if (options_.shuffle) {
    Random random(Random::seed({options_.seed, epoch_, kChunkStream}));
    shuffle(chunks, random);
  }
  chunk_first_.reserve(chunks.size());
  chunk_before_.reserve(chunks.size());
  uint64_t before = 0;
  for (const auto& [chunk_first, samples] : chunks) {
    chunk_first_.push_back(chunk_first);
    chunk_before_.push_back(before);
    before += samples;
  }
  // The segments before this one, each taking away what its ranks consumed.
  remaining_ = Ranges({{0, total_}});
  for (const auto& segment : done) {
    if (segment.world == 0) throw std::invalid_argument("a segment of world size 0");
    const uint64_t n = remaining_.size();
    if (segment.consumed > span(n, segment.world, 0).second) {
      throw std::invalid_argument("a segment consumed " + std::to_string(segment.consumed) +
                                  " items where its ranks had " +
                                  std::to_string(span(n, segment.world, 0).second));
    }
    std::vector<std::pair<uint64_t, uint64_t>> consumed;  // indices into remaining_
    for (uint64_t r = 0; r < segment.world; ++r) {
      const auto [start, length] = span(n, segment.world, r);
      const uint64_t used = std::min(segment.consumed, length);
      // Whole blocks: a run of the span; the block begun: its order's first items.
      const uint64_t whole = used / options_.buffer * options_.buffer;
      auto add = [&](uint64_t from, uint64_t to) {  // span items [from, to)
        if (from >= to) return;
        if (to - from >= n) {
          consumed.emplace_back(0, n);
          return;
        }
        const uint64_t a = (start + from) % n, b = a + (to - from);  // padding wraps round
        consumed.emplace_back(a, std::min(b, n));
        if (b > n) consumed.emplace_back(0, b - n);
      };
      add(0, whole);
      if (used > whole) {
        const uint64_t block = whole / options_.buffer;
        const auto order = block_order(segment_, segment.world, r, block,
                                       std::min(options_.buffer, length - whole));
        for (uint64_t i = 0; i < used - whole; ++i) add(whole + order[i], whole + order[i] + 1);
      }
    }
    remaining_ = remaining_.without(std::move(consumed));
    ++segment_;
  }
  world_ = world;
  rank_ = rank;
  std::tie(start_, length_) = span(remaining_.size(), world_, rank_);
}

std::pair<uint64_t, uint64_t> EpochPlan::span(uint64_t n, uint64_t world, uint64_t rank) const {
  if (n == 0) return {0, 0};
  if (options_.pad) {
    const uint64_t length = (n + world - 1) / world;
    return {rank * length, length};
  }
  const uint64_t base = n / world, extra = n % world;
  return {rank * base + std::min(rank, extra), base + (rank < extra ? 1 : 0)};
}

std::vector<uint64_t> EpochPlan::block_order(uint64_t segment, uint64_t world, uint64_t rank,
                                             uint64_t block, uint64_t length) const {
  std::vector<uint64_t> order(length);
  std::iota(order.begin(), order.end(), uint64_t{0});
  if (options_.shuffle) {
    Random random(Random::seed({options_.seed, epoch_, kBlockStream, segment, world, rank, block}));
    shuffle(order, random);
  }
  return order;
}

uint64_t EpochPlan::sample(uint64_t k) {
  if (k >= length_) throw std::out_of_range("item past this rank's part of the epoch");
  const uint64_t block = k / options_.buffer;
  if (block != block_) {
    order_ = block_order(segment_, world_, rank_, block,
                         std::min(options_.buffer, length_ - block * options_.buffer));
    block_ = block;
  }
  uint64_t index = start_ + block * options_.buffer + order_[k % options_.buffer];
  if (index >= remaining_.size()) index %= remaining_.size();  // padding wraps round
  return sample_at(remaining_.at(index));
}

uint64_t EpochPlan::sample_at(uint64_t position) const {
  const auto chunk = static_cast<size_t>(
      std::upper_bound(chunk_before_.begin(), chunk_before_.end(), position) -
      chunk_before_.begin() - 1);
  return chunk_first_[chunk] + (position - chunk_before_[chunk]);
}

}  // namespace train::shards

#pragma once

// Which samples each rank reads in an epoch: a pure function of the shards'
// sample counts, the seed, the epoch, the world sizes the epoch has run under
// and what was consumed under each, the world size and the rank
// (docs/data.md, "The assignment"). No I/O, no state shared between threads.
//
// The epoch's order: the shards cut into chunks of consecutive samples, the
// chunks permuted (shuffled, with seed and epoch). A segment is a stretch of
// the epoch under one world size: its remaining positions are cut into one
// contiguous span per rank (padded by wrapping round to the first, or not), and
// each rank reads its span in blocks of `buffer` items, each block in an order
// of its own (shuffled). What a rank consumed of a segment is the first
// `consumed` items of that order; the next segment is made of what no rank
// consumed, in epoch order.

#include <cstdint>
#include <utility>
#include <vector>

namespace train::shards {

struct PlanOptions {
  bool shuffle = true;
  bool pad = true;        // every rank gets as many items as the others
  uint64_t seed = 0;
  uint64_t chunk = 64;    // samples read together, from one shard
  uint64_t buffer = 8192; // items mixed together on a rank
};

/// A stretch of an epoch under one world size: each rank consumed the first
/// `consumed` items of its order (or all it had, where it had fewer).
struct Segment {
  uint64_t world = 0;
  uint64_t consumed = 0;
  bool operator==(const Segment& other) const {
    return world == other.world && consumed == other.consumed;
  }
};

/// An ordered set of positions held as ranges [first, second).
class Ranges {
 public:
  Ranges() = default;
  explicit Ranges(std::vector<std::pair<uint64_t, uint64_t>> spans);
  uint64_t size() const { return before_.empty() ? 0 : before_.back(); }
  /// The i-th position.
  uint64_t at(uint64_t i) const;
  /// The positions whose indices are not in `drop` (index ranges, any order,
  /// overlapping allowed), in this order.
  Ranges without(std::vector<std::pair<uint64_t, uint64_t>> drop) const;
  const std::vector<std::pair<uint64_t, uint64_t>>& spans() const { return spans_; }

 private:
  std::vector<std::pair<uint64_t, uint64_t>> spans_;
  std::vector<uint64_t> before_;  // positions up to the end of each span
};

/// The deterministic generator of the assignment (splitmix64): the same
/// numbers on every machine, unlike the standard library's distributions.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  /// Mixes several numbers into one seed.
  static uint64_t seed(std::initializer_list<uint64_t> parts);
  uint64_t next();
  /// Uniform in [0, n), n > 0 (Lemire's method, without bias).
  uint64_t below(uint64_t n);

 private:
  uint64_t state_;
};

/// One rank's items in one epoch's current segment, by the rules above.
class EpochPlan {
 public:
  /// `counts`: samples per shard, in shard order. `done`: the epoch's
  /// segments before the current one. Throws std::invalid_argument for a
  /// rank not below `world`, a chunk or buffer of 0, or a segment that
  /// consumed more than it held.
  EpochPlan(const std::vector<uint64_t>& counts, const PlanOptions& options, uint64_t epoch,
            const std::vector<Segment>& done, uint64_t world, uint64_t rank);

  /// Items this rank gets in the current segment.
  uint64_t size() const { return length_; }
  /// Positions left to the whole group when the current segment began.
  uint64_t remaining() const { return remaining_.size(); }
  /// The sample (an index into all samples, shard after shard) of this rank's
  /// item `k` (k < size()). Not thread-safe: it keeps the block it is in.
  uint64_t sample(uint64_t k);
  /// The epoch's sample at `position` of its order.
  uint64_t sample_at(uint64_t position) const;

 private:
  // The span of `rank` in a segment over `n` positions: its first index and length.
  std::pair<uint64_t, uint64_t> span(uint64_t n, uint64_t world, uint64_t rank) const;
  // The order within block `block` of a rank's span of `length` items.
  std::vector<uint64_t> block_order(uint64_t segment, uint64_t world, uint64_t rank,
                                    uint64_t block, uint64_t length) const;

  PlanOptions options_;
  uint64_t epoch_;
  std::vector<uint64_t> chunk_first_;  // each chunk's first sample, in epoch order
  std::vector<uint64_t> chunk_before_; // positions before each chunk, in epoch order
  uint64_t total_ = 0;
  Ranges remaining_;  // of the current segment
  uint64_t segment_ = 0, world_ = 1, rank_ = 0;
  uint64_t start_ = 0, length_ = 0;  // this rank's span of remaining_
  uint64_t block_ = UINT64_MAX;       // the block cached in order_
  std::vector<uint64_t> order_;
};

}  // namespace train::shards

#pragma once

// The process group's rendezvous store, kept by the controller: the keys and
// values that c10d::Store holds, served to each rank's store connection
// (worker/controller_store.h) in place of a TCPStore on rank 0, so no port is
// open to anyone and the store outlives every rank. Pure: it takes one rank's
// request and returns the replies to send, to that rank and to the ranks whose
// GET or WAIT the request completed. A rank has at most one request waiting
// (its client waits for each answer); a new one from the same rank replaces
// it, as the client gave up on it. Bounded: key length, keys per request and
// the total size of keys and values. Owned by the controller's thread.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "protocol/messages.h"

namespace trainrun {

class RendezvousStore {
 public:
  static constexpr size_t kMaxKeyBytes = 4096;
  static constexpr size_t kMaxKeysPerRequest = 1 << 16;

  /// What the store may hold for a group of `world_size` ranks: 64 MiB plus 512
  /// bytes per pair of ranks (Gloo's full mesh stores each rank's address for
  /// every peer, about 140 bytes a pair).
  static size_t capacity_for(int world_size);

  explicit RendezvousStore(size_t capacity) : capacity_(capacity) {}

  struct Addressed {
    int rank;
    protocol::StoreReply reply;
  };
  /// Applies `rank`'s request. A malformed or refused one is answered with an
  /// error, which the rank's store raises.
  std::vector<Addressed> handle(int rank, const protocol::StoreRequest& request);
  /// Drops the request `rank` waits with, if any (it ended).
  void forget(int rank);

  size_t bytes() const { return bytes_; }
  size_t keys() const { return values_.size(); }
  size_t waiting() const { return waiters_.size(); }

 private:
  struct Waiter {
    uint64_t id = 0;
    std::vector<std::string> keys;
    bool get = false;  // answer with the value of keys[0]
  };

  /// The reply, or none when the request waits; `woken` gets the replies to
  /// the waiters that a key it set completed.
  std::optional<protocol::StoreReply> apply(int rank, const protocol::StoreRequest& request,
                                            std::vector<Addressed>& woken);
  /// Whether setting `key` to a value of this size stays within the capacity.
  bool fits(const std::string& key, size_t value_size) const;
  protocol::StoreReply full(uint64_t id) const;
  /// Sets `key` and answers the waiters its arrival completed.
  void put(const std::string& key, std::vector<uint8_t> value, std::vector<Addressed>& woken);
  bool has_all(const std::vector<std::string>& keys) const;
  protocol::StoreReply answer(uint64_t id, const Waiter& waiter) const;
  /// Replies to the waiters that `key`'s arrival completed.
  void wake(const std::string& key, std::vector<Addressed>& replies);

  size_t capacity_;
  size_t bytes_ = 0;
  std::unordered_map<std::string, std::vector<uint8_t>> values_;
  std::unordered_map<int, Waiter> waiters_;
  std::unordered_map<std::string, std::unordered_set<int>> waiting_on_;  // key -> ranks
};

}  // namespace trainrun

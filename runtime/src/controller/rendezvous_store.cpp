#include "controller/rendezvous_store.h"

#include <charconv>
#include <iterator>

#include "protocol/store_op.h"

namespace trainrun {
namespace {

using protocol::StoreOp;

protocol::StoreReply refused(uint64_t id, std::string error) {
  protocol::StoreReply reply;
  reply.id = id;
  reply.error = std::move(error);
  return reply;
}

// How many keys and values each operation takes; -1: any number of keys.
struct Arity {
  int keys;
  size_t values;
};

Arity arity(StoreOp op) {
  switch (op) {
    case StoreOp::kSet: return {1, 1};
    case StoreOp::kCompareSet: return {1, 2};
    case StoreOp::kGet:
    case StoreOp::kAdd:
    case StoreOp::kDeleteKey: return {1, 0};
    case StoreOp::kCheck:
    case StoreOp::kWait: return {-1, 0};
    case StoreOp::kNumKeys: return {0, 0};
  }
  return {0, 0};
}

// ADD keeps its counter as decimal text, as c10d's TCPStore does, so that a
// GET of it reads the same on either store.
std::optional<int64_t> parse_counter(const std::vector<uint8_t>& bytes) {
  int64_t value = 0;
  auto begin = reinterpret_cast<const char*>(bytes.data());
  auto [end, ec] = std::from_chars(begin, begin + bytes.size(), value);
  if (ec != std::errc() || end != begin + bytes.size()) return std::nullopt;
  return value;
}

std::vector<uint8_t> counter_bytes(int64_t value) {
  auto text = std::to_string(value);
  return {text.begin(), text.end()};
}

}  // namespace

size_t RendezvousStore::capacity_for(int world_size) {
  auto pairs = static_cast<size_t>(world_size) * static_cast<size_t>(world_size);
  return (size_t{64} << 20) + pairs * 512;
}

std::vector<RendezvousStore::Addressed> RendezvousStore::handle(
    int rank, const protocol::StoreRequest& request) {
  forget(rank);  // its client waits for one answer at a time: an older request was given up
  std::vector<Addressed> woken;
  auto reply = apply(rank, request, woken);
  std::vector<Addressed> replies;
  if (reply) replies.push_back({rank, std::move(*reply)});  // the requester's answer first
  replies.insert(replies.end(), std::make_move_iterator(woken.begin()),
                 std::make_move_iterator(woken.end()));
  return replies;
}

std::optional<protocol::StoreReply> RendezvousStore::apply(int rank,
                                                           const protocol::StoreRequest& request,
                                                           std::vector<Addressed>& woken) {
  auto op = protocol::parse_store_op(request.op);
  if (!op) return refused(request.id, "unknown store operation '" + request.op.substr(0, 32) + "'");
  auto [key_count, value_count] = arity(*op);
  if ((key_count >= 0 && request.keys.size() != static_cast<size_t>(key_count)) ||
      request.values.size() != value_count) {
    return refused(request.id, "malformed " + request.op + " request");
  }
  if (request.keys.size() > kMaxKeysPerRequest) {
    return refused(request.id,
                   "more than " + std::to_string(kMaxKeysPerRequest) + " keys in one request");
  }
  for (const auto& key : request.keys) {
    if (key.size() > kMaxKeyBytes) {
      return refused(request.id, "a key longer than " + std::to_string(kMaxKeyBytes) + " bytes");
    }
  }
  protocol::StoreReply reply;
  reply.id = request.id;
  const std::string* key = request.keys.empty() ? nullptr : &request.keys[0];
  switch (*op) {
    case StoreOp::kSet:
      if (!fits(*key, request.values[0].size())) return full(request.id);
      put(*key, request.values[0], woken);
      break;
    case StoreOp::kCompareSet: {
      // c10d's semantics: set when the current value is the expected one (an
      // absent key counts as an empty value); answer with the value now held,
      // or with the expected value when the key is absent and stays so.
      const auto& expected = request.values[0];
      auto found = values_.find(*key);
      if (found == values_.end() ? expected.empty() : found->second == expected) {
        if (!fits(*key, request.values[1].size())) return full(request.id);
        put(*key, request.values[1], woken);
        reply.value = request.values[1];
      } else {
        reply.value = found == values_.end() ? expected : found->second;
      }
      break;
    }
    case StoreOp::kAdd: {
      int64_t value = request.amount;
      if (auto found = values_.find(*key); found != values_.end()) {
        auto current = parse_counter(found->second);
        if (!current) return refused(request.id, "ADD to a key that holds no number: " + *key);
        value += *current;
      }
      auto bytes = counter_bytes(value);
      if (!fits(*key, bytes.size())) return full(request.id);
      put(*key, std::move(bytes), woken);
      reply.number = value;
      break;
    }
    case StoreOp::kDeleteKey:
      if (auto found = values_.find(*key); found != values_.end()) {
        bytes_ -= found->first.size() + found->second.size();
        values_.erase(found);
        reply.number = 1;
      }
      break;
    case StoreOp::kCheck: reply.number = has_all(request.keys) ? 1 : 0; break;
    case StoreOp::kNumKeys: reply.number = static_cast<int64_t>(values_.size()); break;
    case StoreOp::kGet:
    case StoreOp::kWait: {
      Waiter waiter{request.id, request.keys, *op == StoreOp::kGet};
      if (has_all(waiter.keys)) return answer(request.id, waiter);
      for (const auto& wanted : waiter.keys) {
        if (!values_.count(wanted)) waiting_on_[wanted].insert(rank);
      }
      waiters_[rank] = std::move(waiter);
      return std::nullopt;
    }
  }
  return reply;
}

bool RendezvousStore::fits(const std::string& key, size_t value_size) const {
  size_t after = bytes_ + value_size;
  if (auto found = values_.find(key); found != values_.end()) {
    after -= found->second.size();
  } else {
    after += key.size();
  }
  return after <= capacity_;
}

protocol::StoreReply RendezvousStore::full(uint64_t id) const {
  return refused(id, "the rendezvous store is full (it holds at most " + std::to_string(capacity_) +
                         " bytes of keys and values)");
}

void RendezvousStore::put(const std::string& key, std::vector<uint8_t> value,
                          std::vector<Addressed>& woken) {
  auto [it, inserted] = values_.try_emplace(key);
  if (inserted) {
    bytes_ += key.size();
  } else {
    bytes_ -= it->second.size();
  }
  bytes_ += value.size();
  it->second = std::move(value);
  wake(key, woken);
}

bool RendezvousStore::has_all(const std::vector<std::string>& keys) const {
  for (const auto& key : keys) {
    if (!values_.count(key)) return false;
  }
  return true;
}

protocol::StoreReply RendezvousStore::answer(uint64_t id, const Waiter& waiter) const {
  protocol::StoreReply reply;
  reply.id = id;
  if (waiter.get) reply.value = values_.at(waiter.keys[0]);
  return reply;
}

void RendezvousStore::wake(const std::string& key, std::vector<Addressed>& replies) {
  auto waiting = waiting_on_.find(key);
  if (waiting == waiting_on_.end()) return;
  auto ranks = std::move(waiting->second);
  waiting_on_.erase(waiting);
  for (int rank : ranks) {
    auto found = waiters_.find(rank);
    if (found == waiters_.end() || !has_all(found->second.keys)) continue;
    replies.push_back({rank, answer(found->second.id, found->second)});
    forget(rank);
  }
}

void RendezvousStore::forget(int rank) {
  auto found = waiters_.find(rank);
  if (found == waiters_.end()) return;
  for (const auto& key : found->second.keys) {
    auto waiting = waiting_on_.find(key);
    if (waiting == waiting_on_.end()) continue;
    waiting->second.erase(rank);
    if (waiting->second.empty()) waiting_on_.erase(waiting);
  }
  waiters_.erase(found);
}

}  // namespace trainrun

#include <doctest/doctest.h>

#include "controller/rendezvous_store.h"

using namespace trainrun;

namespace {

protocol::StoreRequest request(uint64_t id, const std::string& op, std::vector<std::string> keys,
                               std::vector<std::vector<uint8_t>> values = {}, int64_t amount = 0) {
  protocol::StoreRequest r;
  r.id = id;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  r.amount = amount;
  return r;
}

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

// The one reply a request got at once.
protocol::StoreReply only(const std::vector<RendezvousStore::Addressed>& replies) {
  REQUIRE(replies.size() == 1);
  return replies[0].reply;
}

}  // namespace

TEST_CASE("rendezvous store: set, get, add, check, delete and count as c10d's stores do") {
  RendezvousStore store(1 << 20);
  CHECK(only(store.handle(0, request(1, "SET", {"a"}, {bytes("1")}))).error.empty());
  auto got = only(store.handle(1, request(1, "GET", {"a"})));
  CHECK(got.id == 1);
  CHECK(got.value == bytes("1"));
  CHECK(only(store.handle(0, request(2, "ADD", {"n"}, {}, 5))).number == 5);
  CHECK(only(store.handle(1, request(2, "ADD", {"n"}, {}, -2))).number == 3);
  CHECK(only(store.handle(1, request(3, "GET", {"n"}))).value == bytes("3"));  // decimal text
  CHECK(only(store.handle(0, request(3, "CHECK", {"a", "n"}))).number == 1);
  CHECK(only(store.handle(0, request(4, "CHECK", {"a", "zz"}))).number == 0);
  CHECK(only(store.handle(0, request(5, "NUM_KEYS", {}))).number == 2);
  CHECK(only(store.handle(0, request(6, "DELETE_KEY", {"a"}))).number == 1);
  CHECK(only(store.handle(0, request(7, "DELETE_KEY", {"a"}))).number == 0);
  CHECK(only(store.handle(0, request(8, "NUM_KEYS", {}))).number == 1);
  // ADD to a key that holds no number is refused, not a crash.
  store.handle(0, request(9, "SET", {"text"}, {bytes("abc")}));
  CHECK(only(store.handle(0, request(10, "ADD", {"text"}, {}, 1))).error.find("no number") !=
        std::string::npos);
}

TEST_CASE("rendezvous store: compare-set follows c10d's semantics") {
  RendezvousStore store(1 << 20);
  // Absent key, expected empty: set.
  CHECK(only(store.handle(0, request(1, "COMPARE_SET", {"k"}, {{}, bytes("v1")}))).value ==
        bytes("v1"));
  // Present, expected matches: set.
  CHECK(only(store.handle(0, request(2, "COMPARE_SET", {"k"}, {bytes("v1"), bytes("v2")}))).value ==
        bytes("v2"));
  // Present, expected differs: unchanged, the current value comes back.
  CHECK(only(store.handle(0, request(3, "COMPARE_SET", {"k"}, {bytes("x"), bytes("v3")}))).value ==
        bytes("v2"));
  // Absent, expected not empty: nothing set, the expected value comes back.
  CHECK(only(store.handle(0, request(4, "COMPARE_SET", {"q"}, {bytes("e"), bytes("v")}))).value ==
        bytes("e"));
  CHECK(only(store.handle(0, request(5, "CHECK", {"q"}))).number == 0);
}

TEST_CASE("rendezvous store: GET and WAIT are answered when their keys arrive") {
  RendezvousStore store(1 << 20);
  CHECK(store.handle(1, request(7, "GET", {"addr"})).empty());
  CHECK(store.handle(2, request(3, "WAIT", {"addr", "other"})).empty());
  CHECK(store.waiting() == 2);
  auto replies = store.handle(0, request(1, "SET", {"addr"}, {bytes("here")}));
  REQUIRE(replies.size() == 2);  // rank 0's own reply and rank 1's GET
  CHECK(replies[0].rank == 0);
  CHECK(replies[1].rank == 1);
  CHECK(replies[1].reply.id == 7);
  CHECK(replies[1].reply.value == bytes("here"));
  CHECK(store.waiting() == 1);  // rank 2 still lacks "other"
  replies = store.handle(0, request(2, "ADD", {"other"}, {}, 1));
  REQUIRE(replies.size() == 2);
  CHECK(replies[1].rank == 2);
  CHECK(replies[1].reply.id == 3);
  CHECK(store.waiting() == 0);
}

TEST_CASE("rendezvous store: a rank's new request replaces the wait it gave up on") {
  RendezvousStore store(1 << 20);
  CHECK(store.handle(1, request(1, "WAIT", {"never"})).empty());
  CHECK(only(store.handle(1, request(2, "NUM_KEYS", {}))).id == 2);
  CHECK(store.waiting() == 0);
  // The key arriving later answers nobody.
  CHECK(store.handle(0, request(1, "SET", {"never"}, {bytes("x")})).size() == 1);
  // And a rank that ended waits no more.
  CHECK(store.handle(3, request(1, "WAIT", {"later"})).empty());
  store.forget(3);
  CHECK(store.handle(0, request(2, "SET", {"later"}, {bytes("x")})).size() == 1);
}

TEST_CASE("rendezvous store: malformed and oversized requests are refused with a reason") {
  RendezvousStore store(1000);
  CHECK(only(store.handle(0, request(1, "EXPLODE", {"a"}))).error.find("unknown") !=
        std::string::npos);
  CHECK_FALSE(only(store.handle(0, request(2, "SET", {"a"}))).error.empty());  // no value
  CHECK_FALSE(only(store.handle(0, request(3, "GET", {"a", "b"}))).error.empty());
  CHECK_FALSE(
      only(store.handle(0, request(4, "COMPARE_SET", {"a"}, {bytes("x")}))).error.empty());
  CHECK_FALSE(
      only(store.handle(0, request(5, "GET", {std::string(RendezvousStore::kMaxKeyBytes + 1, 'k')})))
          .error.empty());
  // The capacity bounds keys and values together; replacing a value frees the old one.
  CHECK(only(store.handle(0, request(6, "SET", {"big"}, {std::vector<uint8_t>(900)}))).error.empty());
  auto full = only(store.handle(0, request(7, "SET", {"more"}, {std::vector<uint8_t>(200)})));
  CHECK(full.error.find("full") != std::string::npos);
  CHECK(store.bytes() == 903);
  CHECK(only(store.handle(0, request(8, "SET", {"big"}, {std::vector<uint8_t>(990)}))).error.empty());
  CHECK(store.bytes() == 993);
  CHECK(only(store.handle(0, request(9, "NUM_KEYS", {}))).number == 1);
  CHECK(RendezvousStore::capacity_for(1024) > RendezvousStore::capacity_for(2));
}

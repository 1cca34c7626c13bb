#pragma once

// The rendezvous store of a worker's process group: a c10d::Store whose keys
// the controller keeps (controller/rendezvous_store.h), reached over a
// connection of its own that begins with ATTACH (channel "store"). Nothing
// listens on the worker's side, and the store outlives any rank.
//
// Thread-safe: a mutex serialises the operations, each one request and its
// reply. A reply to a request given up on (a wait that timed out) is told
// apart by its id and skipped. close() ends the connection, which the ZeroMQ
// context needs before it can end; the store refuses every operation after it.

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <zmq.hpp>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "protocol/messages.h"
#include "protocol/store_op.h"
#include "worker/worker.h"

namespace trainrun {

class ControllerStore : public c10d::Store {
 public:
  /// Connects to the controller at `endpoint` and introduces itself with
  /// `attach` (its channel set to the store's).
  ControllerStore(zmq::context_t& context, const WorkerOptions& options, protocol::Attach attach);
  ~ControllerStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  /// Waits for the key (up to the store's timeout), as c10d's stores do.
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  /// This store itself: its one connection serves every user, in turn. c10d
  /// from LibTorch 2.x asks for it (splitting a group); 1.13's Store has no
  /// clone, hence no `override`.
  c10::intrusive_ptr<c10d::Store> clone();

  /// Closes the connection; idempotent.
  void close();

 private:
  /// Sends one request and waits up to `timeout` (zero: no limit) for its
  /// reply. Throws TimeoutError, or Error with the controller's refusal.
  protocol::StoreReply call(protocol::StoreOp op, std::vector<std::string> keys,
                            std::vector<std::vector<uint8_t>> values, int64_t amount,
                            std::chrono::milliseconds timeout);

  std::mutex mutex_;
  std::optional<zmq::socket_t> socket_;
  uint64_t next_id_ = 0;
};

}  // namespace trainrun

#include "worker/controller_store.h"

#include <trainrun/error.h>

#include <algorithm>

#include "protocol/message.h"

namespace trainrun {
namespace {

using Clock = std::chrono::steady_clock;
using protocol::StoreOp;

// "a, b, c and 5 more": which keys a timed-out wait was for.
std::string describe_keys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 3;
  std::string text;
  for (size_t i = 0; i < std::min(keys.size(), kShown); ++i) {
    if (i > 0) text += ", ";
    text += keys[i];
  }
  if (keys.size() > kShown) text += " and " + std::to_string(keys.size() - kShown) + " more";
  return text;
}

}  // namespace

ControllerStore::ControllerStore(zmq::context_t& context, const WorkerOptions& options,
                                 protocol::Attach attach) {
  socket_.emplace(context, zmq::socket_type::dealer);
  socket_->set(zmq::sockopt::linger, 0);  // nothing it sends matters once it closes
  connect_to_controller(*socket_, options, protocol::kStoreChannel);
  attach.channel = protocol::kStoreChannel;
  protocol::send(*socket_, attach);
}

ControllerStore::~ControllerStore() { close(); }

c10::intrusive_ptr<c10d::Store> ControllerStore::clone() {
  return c10::intrusive_ptr<c10d::Store>::reclaim_copy(this);
}

void ControllerStore::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  socket_.reset();
}

protocol::StoreReply ControllerStore::call(StoreOp op, std::vector<std::string> keys,
                                           std::vector<std::vector<uint8_t>> values, int64_t amount,
                                           std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!socket_) throw Error("the rendezvous store is closed");
  protocol::StoreRequest request;
  request.id = ++next_id_;
  request.op = std::string(protocol::to_string(op));
  request.keys = std::move(keys);
  request.values = std::move(values);
  request.amount = amount;
  protocol::send(*socket_, request);
  const bool bounded = timeout > std::chrono::milliseconds::zero();
  const auto deadline = Clock::now() + timeout;
  while (true) {
    auto wait = std::chrono::milliseconds(1000);  // a signal or a clock check each second
    if (bounded) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left <= std::chrono::milliseconds::zero()) {
        throw TimeoutError(
            "rendezvous store: no answer to " + request.op + " within " +
            std::to_string(timeout.count()) + " ms" +
            (request.keys.empty() ? "" : " (keys " + describe_keys(request.keys) + ")"));
      }
      wait = std::min(wait, left + std::chrono::milliseconds(1));
    }
    zmq::pollitem_t item{socket_->handle(), 0, ZMQ_POLLIN, 0};
    protocol::poll(&item, 1, wait);
    if (!(item.revents & ZMQ_POLLIN)) continue;
    auto message = protocol::Incoming::parse(protocol::recv_frames(*socket_));
    if (message.type() == protocol::Refused::kType) {
      throw ProtocolError("the controller refused the rendezvous store's connection: " +
                          message.as<protocol::Refused>().reason);
    }
    if (message.type() != protocol::StoreReply::kType) {
      throw ProtocolError("expected STORE_REPLY, got " + message.type());
    }
    auto reply = message.as<protocol::StoreReply>();
    if (reply.id != request.id) continue;  // the answer to a request given up on
    if (!reply.error.empty()) throw Error("rendezvous store: " + reply.error);
    return reply;
  }
}

void ControllerStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  call(StoreOp::kSet, {key}, {value}, 0, timeout_);
}

std::vector<uint8_t> ControllerStore::compareSet(const std::string& key,
                                                 const std::vector<uint8_t>& expected,
                                                 const std::vector<uint8_t>& desired) {
  return call(StoreOp::kCompareSet, {key}, {expected, desired}, 0, timeout_).value;
}

std::vector<uint8_t> ControllerStore::get(const std::string& key) {
  return call(StoreOp::kGet, {key}, {}, 0, timeout_).value;
}

int64_t ControllerStore::add(const std::string& key, int64_t value) {
  return call(StoreOp::kAdd, {key}, {}, value, timeout_).number;
}

bool ControllerStore::deleteKey(const std::string& key) {
  return call(StoreOp::kDeleteKey, {key}, {}, 0, timeout_).number != 0;
}

bool ControllerStore::check(const std::vector<std::string>& keys) {
  return call(StoreOp::kCheck, keys, {}, 0, timeout_).number != 0;
}

int64_t ControllerStore::getNumKeys() {
  return call(StoreOp::kNumKeys, {}, {}, 0, timeout_).number;
}

void ControllerStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void ControllerStore::wait(const std::vector<std::string>& keys,
                           const std::chrono::milliseconds& timeout) {
  call(StoreOp::kWait, keys, {}, 0, timeout);
}

}  // namespace trainrun

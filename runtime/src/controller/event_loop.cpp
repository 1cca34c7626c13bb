#include "controller/event_loop.h"

#include <algorithm>

#include "protocol/message.h"

namespace trainrun {

EventLoop::Id EventLoop::watch(zmq::socket_t& socket, Handler handler) {
  sources_.push_back({next_id_, {socket.handle(), -1, ZMQ_POLLIN, 0}, std::move(handler)});
  return next_id_++;
}

EventLoop::Id EventLoop::watch(int fd, Handler handler) {
  sources_.push_back({next_id_, {nullptr, fd, ZMQ_POLLIN, 0}, std::move(handler)});
  return next_id_++;
}

void EventLoop::rewatch(Id id, int fd) {
  for (auto& source : sources_) {
    if (source.id == id) source.item = {nullptr, fd, ZMQ_POLLIN, 0};
  }
}

void EventLoop::unwatch(Id id) {
  sources_.erase(std::remove_if(sources_.begin(), sources_.end(),
                                [id](const Source& source) { return source.id == id; }),
                 sources_.end());
}

int EventLoop::wait(std::chrono::milliseconds timeout) {
  items_.clear();
  for (const auto& source : sources_) items_.push_back(source.item);
  // poll(2) skips a negative descriptor.
  protocol::poll(items_.data(), items_.size(), timeout);
  ready_.clear();
  for (size_t i = 0; i < items_.size(); ++i) {
    if (items_[i].revents & ZMQ_POLLIN) ready_.push_back(sources_[i].id);
  }
  // A handler may add or remove sources: each is looked up before it runs,
  // and one removed meanwhile is skipped.
  for (Id id : ready_) {
    auto source = std::find_if(sources_.begin(), sources_.end(),
                               [id](const Source& s) { return s.id == id; });
    if (source == sources_.end()) continue;
    Handler handler = source->handler;
    handler();
  }
  return static_cast<int>(ready_.size());
}

}  // namespace trainrun

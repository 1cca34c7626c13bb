#pragma once

// The controller's one poll(2): ZeroMQ sockets and file descriptors, each
// registered with the function that handles it when it is readable (what
// cppzmq's draft active_poller_t and gloo's tcp::Loop do). A source comes and
// goes with what owns it (the workers of an attempt, the listening socket), so
// no caller indexes a positional array whose length depends on which sockets
// exist. Handlers run on the polling thread, in the order they were
// registered; one may add or remove sources (a source removed is not run
// again, one added is waited for from the next wait). Owned by one thread.

#include <zmq.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <vector>

namespace trainrun {

class EventLoop {
 public:
  using Handler = std::function<void()>;
  using Id = size_t;

  /// Calls `handler` when `socket` is readable; it must outlive the watch.
  Id watch(zmq::socket_t& socket, Handler handler);
  /// Calls `handler` when `fd` is readable; a negative fd is never.
  Id watch(int fd, Handler handler);
  /// Watches `fd` in place of what source `id` watched, keeping its handler
  /// and its turn; unknown ids are ignored.
  void rewatch(Id id, int fd);
  /// Forgets a source; unknown ids are ignored.
  void unwatch(Id id);

  /// Waits up to `timeout` for a source to be readable (a signal ends the wait
  /// early), then runs the handlers of those that are. Returns how many were.
  int wait(std::chrono::milliseconds timeout);

 private:
  struct Source {
    Id id;
    zmq::pollitem_t item;
    Handler handler;
  };
  std::vector<Source> sources_;
  std::vector<zmq::pollitem_t> items_;  // reused by each wait
  std::vector<Id> ready_;
  Id next_id_ = 1;
};

}  // namespace trainrun

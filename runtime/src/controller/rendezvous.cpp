#include "controller/rendezvous.h"

#include <trainrun/error.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace trainrun {

struct Rendezvous::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

Rendezvous::Rendezvous(const std::string& host) : impl_(std::make_unique<Impl>()), host_(host) {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  options.numWorkers = c10::nullopt;
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    throw IoError("cannot start the rendezvous store on " + host + ": " + e.what());
  }
  port_ = impl_->store->getPort();
}

Rendezvous::~Rendezvous() = default;

}  // namespace trainrun

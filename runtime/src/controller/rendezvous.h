#pragma once

// The c10d TCPStore that workers rendezvous on to build their process group,
// hosted by the controller for the lifetime of the run. Kept behind a pimpl so
// only rendezvous.cpp pays for LibTorch's distributed headers.

#include <memory>
#include <string>

namespace trainrun {

class Rendezvous {
 public:
  /// Listens on `host` at a port the OS chooses. Throws IoError.
  explicit Rendezvous(const std::string& host);
  ~Rendezvous();
  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string host_;
  int port_ = 0;
};

}  // namespace trainrun

#pragma once

#include <stdexcept>
#include <string>

namespace trainrun {

/// Base of every error the runtime throws. Messages are one line and carry
/// their context: which file, which peer, which rank.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A file or socket operation failed (open, write, fsync, rename, bind).
class IoError : public Error {
 public:
  using Error::Error;
};

/// A peer did not answer in time.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

/// A message from the network was malformed, or a peer speaks another protocol version.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

/// A plugin cannot be used: missing, not a shared library, no descriptor,
/// ABI or LibTorch mismatch, unknown entry.
class PluginError : public Error {
 public:
  using Error::Error;
};

/// A command-line or configuration value is wrong.
class UsageError : public Error {
 public:
  using Error::Error;
};

}  // namespace trainrun

/// Checks an invariant; throws trainrun::Error with the message and location.
#define TRAINRUN_CHECK(cond, message)                                                         \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      throw ::trainrun::Error(std::string("internal error: ") + (message) + " (" + __FILE__ + \
                              ":" + std::to_string(__LINE__) + ")");                          \
    }                                                                                         \
  } while (false)

#pragma once

// The runtime's exceptions, and the kinds of failure that end a run.

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

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

/// What ended a run that did not finish. Turned into text only where it
/// leaves the process: error.json, the FAILED message, the terminal.
enum class FailureKind {
  kException,    // the train function raised
  kSignal,       // a worker was killed by a signal
  kExit,         // a worker exited before finishing
  kLost,         // a worker stopped answering heartbeats
  kSetup,        // a worker could not connect, join the group or get the plugin
  kPlugin,       // the plugin could not be loaded or run (exit code 2)
  kUsage,        // the train function misused the SDK (e.g. unequal report counts)
  kStorage,      // a checkpoint or a report could not be stored
  kInterrupted,  // SIGINT, SIGTERM or SIGHUP reached the controller
  kInternal,     // the controller itself hit an error it did not expect
  kTimeout,      // ranks waited in a report past the collective timeout for another
};

/// "exception", "signal", ...: the name error.json and the protocol use.
constexpr std::string_view to_string(FailureKind kind) {
  switch (kind) {
    case FailureKind::kException: return "exception";
    case FailureKind::kSignal: return "signal";
    case FailureKind::kExit: return "exit";
    case FailureKind::kLost: return "lost";
    case FailureKind::kSetup: return "setup";
    case FailureKind::kPlugin: return "plugin";
    case FailureKind::kUsage: return "usage";
    case FailureKind::kStorage: return "storage";
    case FailureKind::kTimeout: return "timeout";
    case FailureKind::kInterrupted: return "interrupted";
    case FailureKind::kInternal: return "internal";
  }
  return "unknown";
}

/// The kind named `name`, or nothing for a name no kind has.
inline std::optional<FailureKind> parse_failure_kind(std::string_view name) {
  for (auto kind :
       {FailureKind::kException, FailureKind::kSignal, FailureKind::kExit, FailureKind::kLost,
        FailureKind::kSetup, FailureKind::kPlugin, FailureKind::kUsage, FailureKind::kStorage,
        FailureKind::kTimeout, FailureKind::kInterrupted, FailureKind::kInternal}) {
    if (to_string(kind) == name) return kind;
  }
  return std::nullopt;
}

}  // namespace trainrun

/// Checks an invariant; throws trainrun::Error with the message and location.
#define TRAINRUN_CHECK(cond, message)                                                         \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      throw ::trainrun::Error(std::string("internal error: ") + (message) + " (" + __FILE__ + \
                              ":" + std::to_string(__LINE__) + ")");                          \
    }                                                                                         \
  } while (false)

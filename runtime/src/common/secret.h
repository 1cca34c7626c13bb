#pragma once

// The run's worker secret: local workers prove they are the ones the
// controller started by presenting it in HELLO and ATTACH. It reaches them in
// their environment (never argv, which every local user can read in /proc),
// and a worker takes it out of its environment at once, so that what the train
// function starts does not inherit it.

#include <string>
#include <string_view>

namespace trainrun {

/// The environment variable that carries it to a local worker.
inline constexpr const char* kSecretVariable = "TRAINRUN_WORKER_SECRET";

/// 32 random bytes from the kernel, as hex. Throws IoError.
std::string make_secret();

/// The secret from the environment, removed from it; empty when there is none.
std::string take_secret_from_environment();

/// Whether `given` is `expected`, in time that does not depend on where they differ.
bool secret_matches(std::string_view given, std::string_view expected);

}  // namespace trainrun

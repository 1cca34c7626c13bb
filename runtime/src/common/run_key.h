#pragma once

// The run key: one secret (`trainrun keygen FILE`) that a deployment hands to
// the controller and to every node (a Kubernetes Secret, a file in the Slurm
// job's directory). Everything the control plane needs is derived from it with
// keyed BLAKE2b (libsodium): the controller's CURVE key pair, the one key pair
// all workers present, and the secret a remote worker's HELLO carries. A
// peer without the file can neither complete the CURVE handshake (it lacks the
// server's public key) nor pass the controller's ZAP check (it lacks the
// client key pair).
//
// The file holds 64 hex digits and a newline, mode 0600. Reading refuses a
// file that other users can read.

#include <zmq.hpp>

#include <array>
#include <filesystem>
#include <string>

namespace trainrun {

/// The environment variable that may name the key file instead of --auth-key.
inline constexpr const char* kAuthKeyVariable = "TRAINRUN_AUTH_KEY_FILE";

/// A CURVE key, 32 bytes.
using CurveKey = std::array<uint8_t, 32>;

struct RunKeys {
  CurveKey server_public{}, server_secret{};
  CurveKey client_public{}, client_secret{};
  std::string hello_secret;  // what a remote worker's HELLO carries, hex

  /// Derives every key from the run key's 32 bytes.
  static RunKeys derive(const std::array<uint8_t, 32>& run_key);
};

/// Writes a new run key to `path` (mode 0600); refuses to replace a file.
/// Throws IoError or UsageError.
void write_run_key(const std::filesystem::path& path);

/// Reads a run key file. Throws UsageError naming the file when it is
/// missing, malformed, or readable by group or others.
std::array<uint8_t, 32> read_run_key(const std::filesystem::path& path);

/// CURVE server side for what `socket` binds from now on.
void make_curve_server(zmq::socket_t& socket, const RunKeys& keys);
/// CURVE client side for what `socket` connects to from now on.
void make_curve_client(zmq::socket_t& socket, const RunKeys& keys);

/// The Z85 text of a key (for logs and ZAP's comparisons).
std::string z85(const CurveKey& key);

}  // namespace trainrun

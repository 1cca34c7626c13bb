#pragma once

#include <sodium.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace trainrun {

/// Incremental SHA-256 (libsodium); hex digest.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  std::string hex_digest();

 private:
  crypto_hash_sha256_state state_;
};

/// SHA-256 of a whole file, hex. Throws IoError if it cannot be read.
std::string sha256_file(const std::filesystem::path& path);

}  // namespace trainrun

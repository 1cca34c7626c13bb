#include "common/hash.h"

#include <trainrun/error.h>

#include <cstring>
#include <fstream>
#include <vector>

namespace trainrun {

Sha256::Sha256() {
  if (sodium_init() < 0) throw Error("libsodium failed to initialise");
  crypto_hash_sha256_init(&state_);
}

void Sha256::update(const void* data, size_t size) {
  crypto_hash_sha256_update(&state_, static_cast<const unsigned char*>(data), size);
}

std::string Sha256::hex_digest() {
  unsigned char digest[crypto_hash_sha256_BYTES];
  crypto_hash_sha256_final(&state_, digest);
  char hex[crypto_hash_sha256_BYTES * 2 + 1];
  sodium_bin2hex(hex, sizeof(hex), digest, sizeof(digest));
  return hex;
}

std::string sha256_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot read " + path.string() + ": " + std::strerror(errno));
  Sha256 hash;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    hash.update(buffer.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) throw IoError("error reading " + path.string());
  return hash.hex_digest();
}

}  // namespace trainrun

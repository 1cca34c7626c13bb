#include "common/secret.h"

#include <trainrun/error.h>

#include <sys/random.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace trainrun {

std::string make_secret() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError(std::string("cannot get random bytes: ") + std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : bytes) {
    hex += kHex[b >> 4];
    hex += kHex[b & 15];
  }
  return hex;
}

std::string take_secret_from_environment() {
  const char* value = std::getenv(kSecretVariable);
  std::string secret = value != nullptr ? value : "";
  ::unsetenv(kSecretVariable);
  return secret;
}

bool secret_matches(std::string_view given, std::string_view expected) {
  if (given.size() != expected.size() || expected.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(given[i] ^ expected[i]);
  }
  return diff == 0;
}

}  // namespace trainrun

#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

struct evp_md_ctx_st;

namespace trainrun {

/// Incremental SHA-256; hex digest. OpenSSL's libcrypto, which uses the CPU's
/// SHA extensions: checkpoint commits hash every byte they store.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  void update(const void* data, size_t size);
  std::string hex_digest();

 private:
  struct Free {
    void operator()(evp_md_ctx_st* context) const;
  };
  std::unique_ptr<evp_md_ctx_st, Free> context_;
};

/// SHA-256 of a whole file, hex. Throws IoError if it cannot be read.
std::string sha256_file(const std::filesystem::path& path);

}  // namespace trainrun

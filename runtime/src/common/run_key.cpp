#include "common/run_key.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/fd.h"

namespace trainrun {
namespace {

void init_sodium() {
  static const bool ready = sodium_init() >= 0;
  if (!ready) throw Error("libsodium could not be initialised");
}

// A 32-byte value derived from the run key for one purpose.
std::array<uint8_t, 32> derive_bytes(const std::array<uint8_t, 32>& run_key, const char* purpose) {
  std::array<uint8_t, 32> out{};
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const unsigned char*>(purpose),
                     std::strlen(purpose), run_key.data(), run_key.size());
  return out;
}

std::string to_hex(const uint8_t* bytes, size_t size) {
  std::string hex(size * 2 + 1, '\0');
  sodium_bin2hex(hex.data(), hex.size(), bytes, size);
  hex.pop_back();
  return hex;
}

}  // namespace

RunKeys RunKeys::derive(const std::array<uint8_t, 32>& run_key) {
  init_sodium();
  RunKeys keys;
  auto server_seed = derive_bytes(run_key, "trainrun controller curve key");
  auto client_seed = derive_bytes(run_key, "trainrun worker curve key");
  crypto_box_seed_keypair(keys.server_public.data(), keys.server_secret.data(), server_seed.data());
  crypto_box_seed_keypair(keys.client_public.data(), keys.client_secret.data(), client_seed.data());
  auto hello = derive_bytes(run_key, "trainrun worker hello");
  keys.hello_secret = to_hex(hello.data(), hello.size());
  sodium_memzero(server_seed.data(), server_seed.size());
  sodium_memzero(client_seed.data(), client_seed.size());
  return keys;
}

void write_run_key(const std::filesystem::path& path) {
  init_sodium();
  std::array<uint8_t, 32> key{};
  randombytes_buf(key.data(), key.size());
  auto text = to_hex(key.data(), key.size()) + "\n";
  sodium_memzero(key.data(), key.size());
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd && errno == EEXIST) {
    throw UsageError(path.string() + " exists; a run key is never overwritten (remove it first)");
  }
  if (!fd) throw IoError("cannot create " + path.string() + ": " + std::strerror(errno));
  bool ok = ::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            ::fsync(fd.get()) == 0;
  int saved = errno;
  fd.reset();
  sodium_memzero(text.data(), text.size());
  if (!ok) {
    ::unlink(path.c_str());
    throw IoError("cannot write " + path.string() + ": " + std::strerror(saved));
  }
}

std::array<uint8_t, 32> read_run_key(const std::filesystem::path& path) {
  init_sodium();
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    throw UsageError("cannot read the run key " + path.string() + ": " + std::strerror(errno));
  }
  if ((info.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    throw UsageError("the run key " + path.string() +
                     " is readable by other users; chmod 600 it (trainrun keygen writes it so)");
  }
  std::ifstream in(path);
  std::string text;
  std::getline(in, text, '\0');
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  std::array<uint8_t, 32> key{};
  size_t length = 0;
  if (!in.bad() && text.size() == 64 &&
      sodium_hex2bin(key.data(), key.size(), text.data(), text.size(), nullptr, &length, nullptr) ==
          0 &&
      length == key.size()) {
    sodium_memzero(text.data(), text.size());
    return key;
  }
  throw UsageError("the run key " + path.string() +
                   " is not 64 hex digits (write one with `trainrun keygen FILE`)");
}

void make_curve_server(zmq::socket_t& socket, const RunKeys& keys) {
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, zmq::const_buffer(keys.server_secret.data(), 32));
}

void make_curve_client(zmq::socket_t& socket, const RunKeys& keys) {
  socket.set(zmq::sockopt::curve_serverkey, zmq::const_buffer(keys.server_public.data(), 32));
  socket.set(zmq::sockopt::curve_publickey, zmq::const_buffer(keys.client_public.data(), 32));
  socket.set(zmq::sockopt::curve_secretkey, zmq::const_buffer(keys.client_secret.data(), 32));
}

std::string z85(const CurveKey& key) {
  char text[41] = {0};
  zmq_z85_encode(text, key.data(), key.size());
  return text;
}

}  // namespace trainrun

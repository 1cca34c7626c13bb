#include <trainrun/error.h>

#include <doctest/doctest.h>
#include <sys/stat.h>

#include <fstream>

#include "common/run_key.h"
#include "controller/zap_handler.h"
#include "protocol/message.h"
#include "temp_dir.h"

using namespace trainrun;

namespace {

// A ROUTER that takes CURVE peers of `keys` on loopback, port chosen by the OS,
// its ZAP handler answered on the test's thread.
struct CurveServer {
  zmq::context_t context;
  ZapHandler zap;
  zmq::socket_t router{context, zmq::socket_type::router};
  std::string endpoint;

  explicit CurveServer(const RunKeys& keys) : zap(context, keys) {
    router.set(zmq::sockopt::linger, 0);
    make_curve_server(router, keys);
    router.bind("tcp://127.0.0.1:*");
    endpoint = router.get(zmq::sockopt::last_endpoint);
  }

  // Serves ZAP and waits up to `ms` for a message on the router; returns its
  // payload frame, or "" when none came. `refused` counts refusals.
  std::string receive(int ms, int& refused) {
    for (int i = 0; i < ms / 10; ++i) {
      zmq::pollitem_t items[] = {{zap.socket().handle(), 0, ZMQ_POLLIN, 0},
                                 {router.handle(), 0, ZMQ_POLLIN, 0}};
      protocol::poll(items, 2, std::chrono::milliseconds(10));
      if (items[0].revents & ZMQ_POLLIN) refused += zap.answer().has_value();
      if (items[1].revents & ZMQ_POLLIN) {
        auto frames = protocol::recv_frames(router);
        return frames.size() == 2 ? frames[1].to_string() : "?";
      }
    }
    return "";
  }
};

std::array<uint8_t, 32> key_of(uint8_t fill) {
  std::array<uint8_t, 32> key{};
  key.fill(fill);
  return key;
}

}  // namespace

TEST_CASE("run key: keygen writes 64 hex digits, mode 0600, and never replaces a file") {
  TempDir tmp;
  auto path = tmp.path / "run.key";
  write_run_key(path);
  struct stat info {};
  REQUIRE(::stat(path.c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0600);
  auto key = read_run_key(path);
  CHECK_THROWS_AS(write_run_key(path), UsageError);
  CHECK(read_run_key(path) == key);  // untouched
  write_run_key(tmp.path / "other.key");
  CHECK(read_run_key(tmp.path / "other.key") != key);
}

TEST_CASE("run key: a missing, malformed or world-readable key file is a usage error") {
  TempDir tmp;
  CHECK_THROWS_AS(read_run_key(tmp.path / "absent"), UsageError);
  auto bad = tmp.path / "bad.key";
  std::ofstream(bad) << "not hex at all\n";
  ::chmod(bad.c_str(), 0600);
  CHECK_THROWS_WITH_AS(read_run_key(bad), doctest::Contains("64 hex digits"), UsageError);
  auto open = tmp.path / "open.key";
  write_run_key(open);
  ::chmod(open.c_str(), 0644);
  CHECK_THROWS_WITH_AS(read_run_key(open), doctest::Contains("chmod 600"), UsageError);
}

TEST_CASE("run key: derived keys are the same for the same key, and differ otherwise") {
  auto a = RunKeys::derive(key_of(1));
  auto b = RunKeys::derive(key_of(1));
  auto c = RunKeys::derive(key_of(2));
  CHECK(a.server_public == b.server_public);
  CHECK(a.client_secret == b.client_secret);
  CHECK(a.hello_secret == b.hello_secret);
  CHECK(a.hello_secret.size() == 64);
  CHECK(a.server_public != c.server_public);
  CHECK(a.client_public != c.client_public);
  CHECK(a.server_public != a.client_public);
  CHECK(z85(a.server_public).size() == 40);
}

TEST_CASE(
    "run key: a CURVE peer with the run's key gets through, one with another key gets nothing") {
  auto keys = RunKeys::derive(key_of(7));
  CurveServer server(keys);
  zmq::context_t context;
  int refused = 0;

  zmq::socket_t good(context, zmq::socket_type::dealer);
  good.set(zmq::sockopt::linger, 0);
  make_curve_client(good, keys);
  good.connect(server.endpoint);
  good.send(zmq::str_buffer("hello"), zmq::send_flags::none);
  CHECK(server.receive(5000, refused) == "hello");
  CHECK(refused == 0);

  // Another run's key: the handshake fails (it cannot know this server's key).
  zmq::socket_t stranger(context, zmq::socket_type::dealer);
  stranger.set(zmq::sockopt::linger, 0);
  make_curve_client(stranger, RunKeys::derive(key_of(8)));
  stranger.connect(server.endpoint);
  stranger.send(zmq::str_buffer("let me in"), zmq::send_flags::none);
  CHECK(server.receive(500, refused) == "");

  // The server's public key alone (it may leak: it is public in CURVE's model)
  // with a client key pair of its own: ZAP refuses it.
  RunKeys forged = RunKeys::derive(key_of(9));
  forged.server_public = keys.server_public;
  zmq::socket_t forger(context, zmq::socket_type::dealer);
  forger.set(zmq::sockopt::linger, 0);
  make_curve_client(forger, forged);
  forger.connect(server.endpoint);
  forger.send(zmq::str_buffer("let me in"), zmq::send_flags::none);
  // Until ZAP has refused it (a loaded machine may take seconds); nothing gets through.
  for (int i = 0; i < 20 && refused == 0; ++i) CHECK(server.receive(500, refused) == "");
  CHECK(refused >= 1);

  // A plain (NULL) peer on the CURVE port: nothing.
  zmq::socket_t plain(context, zmq::socket_type::dealer);
  plain.set(zmq::sockopt::linger, 0);
  plain.connect(server.endpoint);
  plain.send(zmq::str_buffer("let me in"), zmq::send_flags::none);
  CHECK(server.receive(500, refused) == "");
}

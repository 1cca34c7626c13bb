#include <doctest/doctest.h>

#include "common/metrics_format.h"
#include "protocol/message.h"
#include "protocol/messages.h"

using namespace trainrun;

namespace {

// A connected DEALER pair over real TCP on an OS-chosen port.
struct SocketPair {
  zmq::context_t context;
  zmq::socket_t a{context, zmq::socket_type::pair};
  zmq::socket_t b{context, zmq::socket_type::pair};
  SocketPair() {
    a.bind("tcp://127.0.0.1:*");
    b.connect(a.get(zmq::sockopt::last_endpoint));
  }
};

std::vector<zmq::message_t> frames(std::initializer_list<std::string> parts) {
  std::vector<zmq::message_t> out;
  for (const auto& p : parts) out.emplace_back(p.data(), p.size());
  return out;
}

template <typename T>
std::string body(int version, const T& payload) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> packer(buffer);
  packer.pack_array(2);
  packer.pack(version);
  packer.pack(payload);
  return std::string(buffer.data(), buffer.size());
}

}  // namespace

TEST_CASE("protocol: a message round-trips over a socket, blobs included") {
  SocketPair sockets;
  protocol::Report report{7, {'a', 'b', 'c'}, true, {{"model.pt", 42, ""}}};
  std::vector<zmq::message_t> blobs;
  blobs.emplace_back(std::string("blob-bytes"));
  protocol::send(sockets.a, report, std::move(blobs));
  auto message = protocol::Incoming::parse(protocol::recv_frames(sockets.b));
  CHECK(message.type() == "REPORT");
  auto decoded = message.as<protocol::Report>();
  CHECK(decoded.iteration == 7);
  CHECK(std::string(decoded.metrics.begin(), decoded.metrics.end()) == "abc");
  CHECK(decoded.checkpoint);
  REQUIRE(decoded.files.size() == 1);
  CHECK(decoded.files[0].path == "model.pt");
  CHECK(decoded.files[0].size == 42);
  REQUIRE(message.blobs().size() == 1);
  CHECK(message.blobs()[0].to_string() == "blob-bytes");
}

TEST_CASE("protocol: truncated and garbage messages are ProtocolErrors") {
  CHECK_THROWS_AS(protocol::Incoming::parse(frames({"HELLO"})), ProtocolError);
  CHECK_THROWS_AS(protocol::Incoming::parse(frames({"HELLO", "\xc1\xc1\xc1"})), ProtocolError);
  CHECK_THROWS_AS(protocol::Incoming::parse(frames({"", "x"})), ProtocolError);
  auto full = body(protocol::kProtocolVersion, protocol::Hello{1, "h", 2, ""});
  CHECK_THROWS_AS(protocol::Incoming::parse(frames({"HELLO", full.substr(0, full.size() / 2)})),
                  ProtocolError);
  CHECK_THROWS_AS(protocol::Incoming::parse(frames({"HELLO", body(1, std::string("x"))})),
                  ProtocolError);  // not [version, payload]
  std::string random(512, '\0');
  for (size_t i = 0; i < random.size(); ++i) random[i] = static_cast<char>((i * 7919) % 251);
  CHECK_THROWS_AS(protocol::Incoming::parse(frames({"REPORT", random})), ProtocolError);
}

TEST_CASE("protocol: a payload of the wrong shape is a ProtocolError naming the type") {
  std::map<std::string, std::string> wrong{{"iteration", "not a number"}};
  auto message =
      protocol::Incoming::parse(frames({"REPORT", body(protocol::kProtocolVersion, wrong)}));
  CHECK_THROWS_WITH_AS(message.as<protocol::Report>(), doctest::Contains("malformed REPORT"),
                       ProtocolError);
}

TEST_CASE("protocol: another protocol version is refused with both versions named") {
  auto other = body(protocol::kProtocolVersion + 1, protocol::Hello{0, "h", 1, ""});
  auto expected = "peer speaks trainrun protocol v" +
                  std::to_string(protocol::kProtocolVersion + 1) + ", this side speaks v" +
                  std::to_string(protocol::kProtocolVersion);
  CHECK_THROWS_WITH_AS(protocol::Incoming::parse(frames({"HELLO", other})),
                       doctest::Contains(expected.c_str()), ProtocolError);
}

TEST_CASE("protocol: metrics past the limits are refused naming the limit") {
  auto pack = [](const nlohmann::json& map) {
    auto bytes = nlohmann::json::to_msgpack(map);
    return std::vector<char>(bytes.begin(), bytes.end());
  };
  nlohmann::json many = nlohmann::json::object();
  for (int i = 0; i < 10000; ++i) many["m" + std::to_string(i)] = i;
  CHECK_THROWS_WITH_AS(trainrun::protocol::decode_metrics(pack(many)),
                       "more than 4096 metrics (a report carries at most that many)",
                       trainrun::ProtocolError);
  CHECK_THROWS_WITH_AS(
      trainrun::protocol::decode_metrics(pack({{"note", std::string(70000, 'x')}})),
      "a metric name or text longer than 65536 bytes", trainrun::ProtocolError);
  CHECK(trainrun::protocol::decode_metrics(pack({{"loss", 0.5}}))["loss"] == 0.5);
}

TEST_CASE("metrics on the terminal: control characters are escapes, not control") {
  using trainrun::escape_control;
  using trainrun::format_metrics;
  CHECK(escape_control("plain text, \xc3\xbcnicode") == "plain text, \xc3\xbcnicode");
  CHECK(escape_control("a\nb\rc\td") == "a\\nb\\rc\\td");
  CHECK(escape_control("\x1b[2J\x7f") == "\\x1b[2J\\x7f");
  CHECK(escape_control("csi\xc2\x9b"
                       "31m") == "csi\\u009b31m");  // C1 CSI as UTF-8
  CHECK(escape_control("\xc2\xa0") == "\xc2\xa0");  // a no-break space stays
  auto line = format_metrics({{"loss\n[trainrun] run finished", "x\ny"}});
  CHECK(line == "loss\\n[trainrun] run finished=x\\ny");
  CHECK(line.find('\n') == std::string::npos);
}

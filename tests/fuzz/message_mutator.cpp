#include "message_mutator.h"

#include <nlohmann/json.hpp>

#include <limits>
#include <map>

#include "protocol/message.h"
#include "protocol/messages.h"

namespace trainrun::fuzz {
namespace {

using nlohmann::json;

// A valid body of each type: [version, payload], as msgpack.
template <typename T>
std::string sample_body(const T& payload) {
  auto body = protocol::pack_body(payload);
  return body.to_string();
}

const std::map<std::string, std::string>& samples() {
  static const std::map<std::string, std::string> bodies = [] {
    namespace p = protocol;
    std::map<std::string, std::string> m;
    auto metrics = json::to_msgpack(json{{"loss", 0.5}, {"name", "x"}});
    p::CheckpointFile file{"model.pt", 4, ""};
    m[p::Hello::kType] = sample_body(p::Hello{0, "host", 1, "secret", 2});
    m[p::Attach::kType] = sample_body(p::Attach{0, 1, "secret", p::kTrainChannel});
    m[p::FetchChunk::kType] = sample_body(p::FetchChunk{p::kPluginSource, 0, 0, 1 << 20});
    m[p::Report::kType] =
        sample_body(p::Report{1, std::vector<char>(metrics.begin(), metrics.end()), true, {file}});
    m[p::Arrive::kType] = sample_body(p::Arrive{1});
    m[p::StepVote::kType] = sample_body(p::StepVote{1, 0});
    m[p::GroupTaken::kType] = sample_body(p::GroupTaken{});
    m[p::Joinable::kType] = sample_body(p::Joinable{});
    m[p::UploadChunk::kType] = sample_body(p::UploadChunk{0, 0});
    m[p::Uploaded::kType] = sample_body(p::Uploaded{1, {file}, ""});
    m[p::FetchCheckpoint::kType] = sample_body(p::FetchCheckpoint{"checkpoint_000001"});
    m[p::StoreRequest::kType] = sample_body(p::StoreRequest{1, "SET", {"k"}, {{1, 2}}, 0});
    m[p::Started::kType] = sample_body(p::Started{0});
    m[p::Progress::kType] = sample_body(p::Progress{0, 3, 10, 3, 12});
    m[p::Done::kType] = sample_body(p::Done{1});
    m[p::Failed::kType] = sample_body(p::Failed{"boom", "exception"});
    m[p::Heartbeat::kType] = sample_body(p::Heartbeat{1});
    m[p::AgentHello::kType] = sample_body(p::AgentHello{"host", 1, "secret", {2, 3}, "", 2});
    m[p::Output::kType] = sample_body(p::Output{2, p::kStderr});
    m[p::Exited::kType] = sample_body(p::Exited{2, 0, 9});
    m[p::AgentAccepted::kType] = sample_body(p::AgentAccepted{1000});
    p::Assign assign;
    assign.world_size = 2;
    m[p::Assign::kType] = sample_body(assign);
    m[p::Chunk::kType] = sample_body(p::Chunk{p::kPluginSource, 0, 0});
    m[p::StoreReply::kType] = sample_body(p::StoreReply{1, "", {1}, 0});
    m[p::ReportAck::kType] = sample_body(p::ReportAck{1});
    m[p::ArriveAck::kType] = sample_body(p::ArriveAck{1});
    m[p::Upload::kType] = sample_body(p::Upload{1, "", 8});
    m[p::UploadCredit::kType] = sample_body(p::UploadCredit{1});
    m[p::CheckpointListing::kType] = sample_body(p::CheckpointListing{"c", {file}});
    m[p::Shutdown::kType] = sample_body(p::Shutdown{"x", true});
    m[p::Restart::kType] = sample_body(p::Restart{2});
    m[p::Refused::kType] = sample_body(p::Refused{"x"});
    m[p::PeerLost::kType] = sample_body(p::PeerLost{1, {0, 2}, {1}});
    m[p::StepDecision::kType] = sample_body(p::StepDecision{1, true, 2, {0, 1, 2}, 3});
    return m;
  }();
  return bodies;
}

zmq::message_t frame(const std::string& bytes) {
  return zmq::message_t(bytes.data(), bytes.size());
}

}  // namespace

MessageMutator::MessageMutator(uint64_t seed) : random_(seed) {}

const std::vector<std::string>& MessageMutator::types() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& [name, body] : samples()) v.push_back(name);
    return v;
  }();
  return names;
}

std::string MessageMutator::random_bytes(size_t max) {
  std::string bytes(below(max + 1), '\0');
  for (auto& c : bytes) c = static_cast<char>(below(256));
  return bytes;
}

std::vector<zmq::message_t> MessageMutator::next() { return next(types()[below(types().size())]); }

std::vector<zmq::message_t> MessageMutator::next(const std::string& type) {
  std::string type_frame = type;
  std::string body = samples().at(type);
  std::vector<std::string> blobs;
  if (type == protocol::UploadChunk::kType || type == protocol::Chunk::kType) {
    blobs.push_back(random_bytes(64));
  }
  // A value of any msgpack type, some of them hostile.
  auto any_value = [&]() -> json {
    switch (below(12)) {
      case 0: return nullptr;
      case 1: return below(2) == 1;
      case 2: return std::numeric_limits<int64_t>::min();
      case 3: return std::numeric_limits<uint64_t>::max();
      case 4: return -static_cast<int64_t>(below(1000));
      case 5: return std::numeric_limits<double>::quiet_NaN();
      case 6: return random_bytes(40);  // text that is rarely UTF-8
      case 7: return std::string(70000, 'x');
      case 8: return json::binary(std::vector<uint8_t>(below(100), 0xc1));
      case 9: return json::array({1, "two", json::object()});
      case 10: return json{{"nested", json{{"deeper", 1}}}};
      default: return static_cast<int64_t>(below(1u << 20));
    }
  };
  switch (below(12)) {
    case 0:  // valid
      break;
    case 1:
    case 2:
    case 3: {  // a field's value replaced
      auto decoded = json::from_msgpack(body);
      auto& payload = decoded[1];
      if (!payload.empty()) {
        auto it = payload.begin();
        std::advance(it, static_cast<long>(below(payload.size())));
        *it = any_value();
      }
      auto bytes = json::to_msgpack(decoded);
      body.assign(bytes.begin(), bytes.end());
      break;
    }
    case 4: {  // a field dropped, or one added
      auto decoded = json::from_msgpack(body);
      auto& payload = decoded[1];
      if (below(2) == 0 && !payload.empty()) {
        auto it = payload.begin();
        std::advance(it, static_cast<long>(below(payload.size())));
        payload.erase(it);
      } else {
        payload[random_bytes(8)] = any_value();
      }
      auto bytes = json::to_msgpack(decoded);
      body.assign(bytes.begin(), bytes.end());
      break;
    }
    case 5:  // flipped bits
      for (size_t i = 0, n = 1 + below(4); i < n && !body.empty(); ++i) {
        body[below(body.size())] ^= static_cast<char>(1 << below(8));
      }
      break;
    case 6:  // cut short, or junk after it
      if (below(2) == 0) {
        body.resize(below(body.size() + 1));
      } else {
        body += random_bytes(32);
      }
      break;
    case 7: {  // a declared length far past the data: an array, a string, a map
      static const char* headers[] = {"\xdd\x7f\xff\xff\xff", "\xdb\x7f\xff\xff\xff",
                                      "\xdf\x7f\xff\xff\xff", "\xc6\x7f\xff\xff\xff"};
      body = std::string("\x92\x03", 2) + std::string(headers[below(4)], 5) + random_bytes(16);
      break;
    }
    case 8:  // nesting without end
      body = std::string("\x92\x03", 2) + std::string(10000 + below(90000), '\x91');
      break;
    case 9: {  // another protocol version
      auto decoded = json::from_msgpack(body);
      decoded[0] = below(2) == 0 ? json(99) : any_value();
      auto bytes = json::to_msgpack(decoded);
      body.assign(bytes.begin(), bytes.end());
      break;
    }
    case 10:  // a broken type frame
      type_frame = below(3) == 0 ? "" : below(2) == 0 ? std::string(200, 'T') : random_bytes(12);
      break;
    default:  // frames missing or extra
      if (below(2) == 0) {
        std::vector<zmq::message_t> alone;
        alone.push_back(frame(type_frame));
        return alone;
      }
      for (size_t i = 0, n = 1 + below(3); i < n; ++i) blobs.push_back(random_bytes(4096));
      break;
  }
  std::vector<zmq::message_t> frames;
  frames.push_back(frame(type_frame));
  frames.push_back(frame(body));
  for (const auto& blob : blobs) frames.push_back(frame(blob));
  return frames;
}

void send_or_skip(zmq::socket_t& socket, std::vector<zmq::message_t>& frames) {
  for (size_t f = 0; f < frames.size(); ++f) {
    auto flags = f + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    if (!socket.send(frames[f], flags | zmq::send_flags::dontwait)) return;
  }
}

}  // namespace trainrun::fuzz

#include <trainrun/error.h>

#include <doctest/doctest.h>

#include <fstream>
#include <optional>

#include "temp_dir.h"
#include "transfer/chunk_pull.h"

using namespace trainrun;

namespace {

// Answers every request the fetcher makes from `source`, in order, and returns
// the bytes of each file as they arrived.
std::vector<std::string> pull(ChunkFetcher& fetcher, const ChunkSource& source, size_t files) {
  std::vector<std::string> out(files);
  auto pending = fetcher.requests();
  size_t guard = 0;
  while (!pending.empty() && ++guard < 10000) {
    auto [chunk, bytes] = source.read(pending.front());
    pending.erase(pending.begin());
    auto file = fetcher.accept(chunk, bytes.size());
    out[file].append(bytes.data<char>(), bytes.size());
    for (auto& more : fetcher.requests()) pending.push_back(more);
  }
  return out;
}

}  // namespace

TEST_CASE("chunk pull: the credit bounds what is in flight, and chunks cover every byte") {
  std::string plugin(10000, '\0');
  for (size_t i = 0; i < plugin.size(); ++i) plugin[i] = static_cast<char>(i * 7);
  ChunkFetcher fetcher(protocol::kPluginSource, {plugin.size()}, 1024, 3);
  auto first = fetcher.requests();
  REQUIRE(first.size() == 3);
  CHECK(first[1].offset == 1024);
  CHECK(fetcher.requests().empty());  // the credit is spent until a chunk comes back
  auto source = ChunkSource::from_memory(protocol::kPluginSource,
                                         std::make_shared<const std::string>(plugin));
  ChunkFetcher again(protocol::kPluginSource, {plugin.size()}, 1024, 3);
  CHECK(pull(again, source, 1)[0] == plugin);
  CHECK(again.complete());
}

TEST_CASE("chunk pull: files in a directory, empty ones included, by index") {
  TempDir tmp;
  std::vector<protocol::CheckpointFile> files = {{"a.bin", 5000, ""}, {"empty", 0, ""},
                                                 {"sub/c.bin", 3, ""}};
  std::filesystem::create_directories(tmp.path / "sub");
  std::ofstream(tmp.path / "a.bin") << std::string(5000, 'a');
  std::ofstream(tmp.path / "empty");
  std::ofstream(tmp.path / "sub" / "c.bin") << "ccc";
  auto source = ChunkSource::from_files(protocol::kCheckpointSource, tmp.path, files);
  ChunkFetcher fetcher(protocol::kCheckpointSource, {5000, 0, 3}, 2048, 2);
  auto got = pull(fetcher, source, 3);
  CHECK(got[0] == std::string(5000, 'a'));
  CHECK(got[1].empty());
  CHECK(got[2] == "ccc");
  CHECK(fetcher.complete());
}

TEST_CASE("chunk pull: a chunk out of order, unasked for or of another size is refused") {
  ChunkFetcher fetcher(protocol::kPluginSource, {4096}, 1024, 2);
  auto requests = fetcher.requests();
  CHECK_THROWS_AS(fetcher.accept({protocol::kPluginSource, 0, 1024}, 1024), ProtocolError);
  CHECK_THROWS_AS(fetcher.accept({protocol::kPluginSource, 0, 0}, 10), ProtocolError);
  CHECK_THROWS_AS(fetcher.accept({protocol::kCheckpointSource, 0, 0}, 1024), ProtocolError);
  CHECK(fetcher.accept({protocol::kPluginSource, 0, 0}, 1024) == 0);
  CHECK(fetcher.accept({protocol::kPluginSource, 0, 1024}, 1024) == 0);
  CHECK_THROWS_AS(fetcher.accept({protocol::kPluginSource, 0, 2048}, 1024), ProtocolError);
}

TEST_CASE("chunk pull: the source refuses requests out of range or for another source") {
  auto source = ChunkSource::from_memory(protocol::kPluginSource,
                                         std::make_shared<const std::string>(100, 'x'));
  CHECK(source.read({protocol::kPluginSource, 0, 90, 10}).second.size() == 10);
  CHECK_THROWS_AS(source.read({protocol::kPluginSource, 0, 95, 10}), ProtocolError);
  CHECK_THROWS_AS(source.read({protocol::kPluginSource, 0, ~0ull, 2}), ProtocolError);
  CHECK_THROWS_AS(source.read({protocol::kPluginSource, 1, 0, 1}), ProtocolError);
  CHECK_THROWS_AS(source.read({protocol::kCheckpointSource, 0, 0, 1}), ProtocolError);
  CHECK_THROWS_AS(source.read({protocol::kPluginSource, 0, 0, kChunkSize + 1}), ProtocolError);
}

TEST_CASE("chunk pull: a file shorter than its listing is an IoError, not short bytes") {
  TempDir tmp;
  std::ofstream(tmp.path / "f") << "abc";
  auto source =
      ChunkSource::from_files(protocol::kCheckpointSource, tmp.path, {{"f", 10, ""}});
  CHECK_THROWS_WITH_AS(source.read({protocol::kCheckpointSource, 0, 0, 10}),
                       doctest::Contains("shorter than its manifest says"), IoError);
}

TEST_CASE("chunk pull: chunks of memory share it and keep it alive until they are sent") {
  auto bytes = std::make_shared<const std::string>(4096, 'p');
  std::optional<zmq::message_t> chunk;
  {
    auto source = ChunkSource::from_memory(protocol::kPluginSource, bytes);
    chunk = std::move(source.read({protocol::kPluginSource, 0, 1024, 1024}).second);
    CHECK(chunk->data<char>() == bytes->data() + 1024);  // no copy
  }
  bytes.reset();  // the source is gone too: the message alone holds the bytes
  CHECK(std::string(chunk->data<char>(), chunk->size()) == std::string(1024, 'p'));
}

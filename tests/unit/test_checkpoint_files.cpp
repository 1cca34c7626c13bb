#include <trainrun/error.h>

#include <doctest/doctest.h>

#include <fstream>

#include "common/hash.h"
#include "controller/checkpoint_store.h"
#include "storage/run_directory.h"
#include "transfer/checkpoint_files.h"
#include "transfer/chunked_file.h"
#include "temp_dir.h"

using namespace trainrun;

namespace {

void write(const std::filesystem::path& path, const std::string& content) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << content;
}

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("checkpoint files: only relative paths inside the checkpoint are safe") {
  for (const char* safe : {"model.pt", "state/optimizer.pt", "a/b/c-rank=1.bin", "..x", "x.."}) {
    CAPTURE(safe);
    CHECK(is_safe_checkpoint_path(safe));
  }
  for (const char* unsafe : {"", "/etc/passwd", "../x", "a/../../x", "a/..", "./x", "a//b", "a/"}) {
    CAPTURE(unsafe);
    CHECK_FALSE(is_safe_checkpoint_path(unsafe));
  }
}

TEST_CASE("checkpoint files: a listing is sorted, sized, and refuses symbolic links") {
  TempDir tmp;
  write(tmp.path / "b.txt", "bb");
  write(tmp.path / "a" / "z.txt", "zzz");
  write(tmp.path / "empty", "");
  auto files = list_checkpoint_files(tmp.path, 3);
  REQUIRE(files.size() == 3);
  CHECK(files[0].path == "a/z.txt");
  CHECK(files[0].size == 3);
  CHECK(files[1].path == "b.txt");
  CHECK(files[2].path == "empty");
  CHECK(files[2].size == 0);
  std::filesystem::create_symlink("/etc/passwd", tmp.path / "link");
  CHECK_THROWS_WITH_AS(list_checkpoint_files(tmp.path, 3),
                       doctest::Contains("rank 3's checkpoint holds a symbolic link, link"),
                       UsageError);
  CHECK_THROWS_AS(list_checkpoint_files(tmp.path / "missing", 0), UsageError);
}

TEST_CASE("checkpoint files: copy_and_hash copies the bytes and returns their sha256") {
  TempDir tmp;
  std::string big(3 * 1024 * 1024 + 17, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7919 % 251);
  write(tmp.path / "big.bin", big);
  write(tmp.path / "empty.bin", "");
  for (const char* name : {"big.bin", "empty.bin"}) {
    CAPTURE(name);
    auto sha = copy_and_hash(tmp.path / name, tmp.path / (std::string(name) + ".copy"));
    CHECK(read(tmp.path / (std::string(name) + ".copy")) == read(tmp.path / name));
    CHECK(sha == sha256_file(tmp.path / name));
  }
  CHECK_THROWS_AS(copy_and_hash(tmp.path / "missing", tmp.path / "x"), IoError);
}

TEST_CASE("checkpoint files: a chunked file takes chunks in order, within its size") {
  TempDir tmp;
  ChunkedFile file(tmp.path / "f", 6, ChunkedFile::Hashing::kSha256);
  file.write(0, "abc", 3);
  CHECK_THROWS_AS(file.write(1, "x", 1), ProtocolError);     // a gap or an overlap
  CHECK_THROWS_AS(file.write(3, "defg", 4), ProtocolError);  // past the size
  CHECK_FALSE(file.complete());
  CHECK_THROWS_AS(file.finish(), ProtocolError);  // bytes missing
  ChunkedFile whole(tmp.path / "g", 6, ChunkedFile::Hashing::kSha256);
  whole.write(0, "abc", 3);
  whole.write(3, "def", 3);
  CHECK(whole.complete());
  auto sha = whole.finish();
  CHECK(read(tmp.path / "g") == "abcdef");
  CHECK(sha == sha256_file(tmp.path / "g"));
}

TEST_CASE("checkpoint files: a chunked file written around the page cache holds its bytes") {
  // Direct I/O takes whole aligned blocks: chunks of whole blocks from
  // unaligned memory, then a chunk that ends mid-block (after which the file
  // goes on through the page cache), then more.
  TempDir tmp;
  const size_t block = 4096;
  std::string bytes(3 * block + 5 + 2 * block + 9, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 31 % 253);
  std::string unaligned = " " + bytes;  // bytes at an odd address
  ChunkedFile file(tmp.path / "d", bytes.size(), ChunkedFile::Hashing::kSha256,
                   ChunkedFile::Caching::kDirect);
  size_t offset = 0;
  for (size_t size : {2 * block, block + 5, 2 * block, size_t{9}}) {
    file.write(offset, unaligned.data() + 1 + offset, size);
    offset += size;
  }
  CHECK(file.complete());
  auto sha = file.finish();
  CHECK(read(tmp.path / "d") == bytes);
  CHECK(sha == sha256_file(tmp.path / "d"));
}

TEST_CASE("checkpoint store: unsafe names and out-of-order chunks are refused, nothing staged") {
  TempDir tmp;
  CheckpointStore store(tmp.path);
  auto staged = [&] {
    for (const auto& entry : std::filesystem::directory_iterator(tmp.path)) {
      if (entry.path().filename().string().rfind(".staging", 0) == 0) return true;
    }
    return false;
  };
  for (const char* name : {"../escape", "/etc/passwd", "a/../../b"}) {
    CAPTURE(name);
    CHECK_THROWS_WITH_AS(store.begin_upload(0, {{name, 1, ""}}, true),
                         doctest::Contains("unsafe path"), UsageError);
    CHECK_FALSE(store.staging());
    CHECK_FALSE(staged());
  }
  store.begin_upload(1, {{"one.bin", 2, ""}, {"two.bin", 2, ""}}, true);
  CHECK(store.uploading());
  store.write_chunk(1, 1, 0, "22", 2);  // one.bin sent nothing, so it must be empty
  CHECK_THROWS_AS(store.write_chunk(1, 0, 0, "11", 2), ProtocolError);  // back to an earlier file
  CHECK_THROWS_AS(store.write_chunk(0, 0, 0, "11", 2), ProtocolError);  // rank 0 is not uploading
  CHECK_THROWS_AS(store.finish_upload(1, {{"one.bin", 2, std::string(64, 'a')},
                                          {"two.bin", 2, std::string(64, 'b')}}),
                  IoError);  // one.bin never arrived whole
  store.abort_staging();
  CHECK_FALSE(staged());
}

TEST_CASE("checkpoint store: streamed files commit with the uploader's sha256 in the manifest") {
  TempDir tmp;
  CheckpointStore store(tmp.path);
  store.begin_upload(0, {{"dir/a.bin", 4, ""}, {"empty", 0, ""}}, true);
  store.begin_upload(1, {{"b-rank=1.bin", 2, ""}}, true);
  store.write_chunk(0, 0, 0, "ab", 2);
  store.write_chunk(0, 0, 2, "cd", 2);
  store.write_chunk(1, 0, 0, "xy", 2);
  CHECK_THROWS_WITH_AS(store.finish_upload(0, {{"dir/a.bin", 4, std::string(64, '0')}}),
                       doctest::Contains("other files than it announced"), ProtocolError);
  TempDir sources;
  write(sources.path / "a", "abcd");
  write(sources.path / "e", "");
  write(sources.path / "b", "xy");
  store.finish_upload(0, {{"dir/a.bin", 4, sha256_file(sources.path / "a")},
                          {"empty", 0, sha256_file(sources.path / "e")}});
  CHECK(store.uploading());
  store.finish_upload(1, {{"b-rank=1.bin", 2, sha256_file(sources.path / "b")}});
  CHECK_FALSE(store.uploading());
  auto committed = store.commit(1, {{"loss", 0.5}});
  CHECK(read(committed.path / "dir" / "a.bin") == "abcd");
  CHECK(std::filesystem::file_size(committed.path / "empty") == 0);
  CHECK_NOTHROW(run_directory::verify_checkpoint(committed.path));
}

TEST_CASE("checkpoint store: the manifest's name is reserved, and a file may not be a directory") {
  TempDir tmp;
  CheckpointStore store(tmp.path);
  CHECK_THROWS_WITH_AS(store.begin_upload(0, {{"manifest.json", 1, ""}}, true),
                       doctest::Contains("a name trainrun keeps for the checkpoint's manifest"),
                       UsageError);
  CHECK_FALSE(store.staging());
  store.begin_upload(0, {{"sub/manifest.json", 1, ""}}, true);  // inside a directory: fine
  store.abort_staging();

  store.begin_upload(0, {{"a", 1, ""}}, true);
  CHECK_THROWS_WITH_AS(store.begin_upload(1, {{"a/b", 1, ""}}, true),
                       doctest::Contains("rank 0 reports a file a where rank 1's checkpoint has a "
                                         "directory of that name"),
                       UsageError);
  CHECK_FALSE(store.staging());
  store.begin_upload(0, {{"x/y/z", 1, ""}}, true);
  CHECK_THROWS_WITH_AS(store.begin_upload(1, {{"x/y", 1, ""}}, true),
                       doctest::Contains("rank 1 reports a file x/y where rank 0's checkpoint has "
                                         "a directory of that name"),
                       UsageError);
}

TEST_CASE("checkpoint store: a commit a crash stopped after its rename is adopted at open") {
  TempDir tmp;
  {
    CheckpointStore store(tmp.path);
    store.begin_upload(0, {{"m.bin", 0, ""}}, true);
    store.finish_upload(0, {{"m.bin", 0, sha256_file("/dev/null")}});
    store.commit(5, {{"loss", 1}});
  }
  // As if the next commit had renamed its directory and then died before the
  // state file: a complete checkpoint_000001 that the state does not list.
  std::filesystem::copy(tmp.path / "checkpoint_000000", tmp.path / "checkpoint_000001");
  // ... and an older one that retention had dropped before the crash could delete it.
  std::filesystem::create_directory(tmp.path / "checkpoint_000000x");  // not ours: left alone
  CheckpointStore reopened(tmp.path);
  REQUIRE(reopened.latest());
  CHECK(reopened.latest()->name == "checkpoint_000001");
  CHECK(reopened.latest()->iteration == 5);  // from its manifest
  CHECK(std::filesystem::exists(tmp.path / "checkpoint_000000x"));
  auto state = run_directory::read_checkpoint_state(tmp.path);
  CHECK(state.next_index == 2);
  CHECK(state.checkpoints.size() == 2);
}

#include <train/shards.h>

#include "data/shards/assignment.h"
#include "data/shards/tar.h"
#include "temp_dir.h"

#include <torch/torch.h>

#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

// Shard files, the assignment of samples to ranks, and the sampler's position,
// on their own: files in a temporary directory, rank contexts made by hand.

namespace {

namespace fs = std::filesystem;
using train::shards::EpochPlan;
using train::shards::PlanOptions;
using train::shards::Segment;

train::Context rank_of(int rank, int world) {
  return train::Context(rank, rank, 0, world, world, torch::kCPU, "shards", "/nonexistent");
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Writes `samples` samples "s<i>" with a cls and a bin field into shards of
// `per_shard`, returning the shards' paths.
std::vector<std::string> write_samples(const fs::path& dir, int samples, uint64_t per_shard) {
  train::ShardWriterOptions options;
  options.max_samples = per_shard;
  train::ShardWriter writer((dir / "part-%04d.tar").string(), options);
  for (int i = 0; i < samples; ++i) {
    std::string key = "s";  // not "s" + ...: GCC 12 warns falsely of that at -O3 (its bug 105329)
    key += std::to_string(i);
    writer.write(key, {{"cls", std::to_string(i % 7)},
                       {"bin", std::string(static_cast<size_t>(i % 700), 'x')}});
  }
  return writer.close();
}

// Every item of rank `rank` of `world` in the current segment of `plan`'s epoch.
std::vector<uint64_t> items(const std::vector<uint64_t>& counts, const PlanOptions& options,
                            uint64_t epoch, const std::vector<Segment>& done, uint64_t world,
                            uint64_t rank, uint64_t limit = UINT64_MAX) {
  EpochPlan plan(counts, options, epoch, done, world, rank);
  std::vector<uint64_t> out;
  for (uint64_t k = 0; k < std::min(plan.size(), limit); ++k) out.push_back(plan.sample(k));
  return out;
}

}  // namespace

TEST_CASE("shards: samples written are read back field by field, through the index") {
  TempDir dir;
  const auto paths = write_samples(dir.path, 25, 10);
  REQUIRE(paths.size() == 3);
  for (const auto& path : paths) CHECK(fs::exists(train::index_path(path)));
  // A key longer than a ustar name takes a pax header.
  const std::string long_key = "deep/" + std::string(150, 'k');
  {
    train::ShardWriter writer((dir.path / "long-%d.tar").string());
    writer.write(long_key, {{"txt", "hello"}, {"seg.png", std::string(1000, '\x01')}});
    writer.close();
  }
  train::ShardReader reader((dir.path / "part-{0000..0002}.tar").string() + " " +
                            (dir.path / "long-0.tar").string());
  CHECK(reader.size() == 26);
  CHECK(reader.counts() == std::vector<uint64_t>{10, 10, 5, 1});
  for (int i = 0; i < 25; ++i) {
    auto sample = reader.read(static_cast<uint64_t>(i));
    CHECK(sample.key == std::string("s").append(std::to_string(i)));  // (see write_samples)
    CHECK(sample.at("cls") == std::to_string(i % 7));
    CHECK(sample.at("bin") == std::string(static_cast<size_t>(i % 700), 'x'));
  }
  auto last = reader.read(25);
  CHECK(last.key == long_key);
  CHECK(last.at("txt") == "hello");
  CHECK(last.at("seg.png").size() == 1000);
  CHECK_THROWS_WITH_AS(last.at("jpg"), doctest::Contains("has no field 'jpg' (it has: txt, seg.png)"),
                       train::ShardError);
  // The index written is the one a scan of the shard makes.
  for (const auto& path : paths) {
    CHECK(train::index_shard(read_file(path), path).serialize() ==
          read_file(train::index_path(path)));
  }
}

TEST_CASE("shards: a shard without an index is indexed on first use, and the index kept") {
  TempDir dir;
  const auto paths = write_samples(dir.path, 12, 5);
  const auto written = read_file(train::index_path(paths[1]));
  fs::remove(train::index_path(paths[1]));
  train::ShardReader reader((dir.path / "part-*.tar").string());
  CHECK(reader.size() == 12);
  CHECK(reader.read(7).key == "s7");
  CHECK(read_file(train::index_path(paths[1])) == written);
}

TEST_CASE("shards: a truncated, corrupt or stale shard is refused naming the shard and sample") {
  TempDir dir;
  const auto paths = write_samples(dir.path, 10, 10);
  const std::string shard = paths[0];
  const std::string bytes = read_file(shard);
  SUBCASE("truncated, with its index: the index is stale") {
    write_file(shard, bytes.substr(0, bytes.size() - 3000));
    CHECK_THROWS_WITH_AS(train::ShardReader{shard},
                         doctest::Contains("it is stale (index the shard again: trainrun index"),
                         train::ShardError);
  }
  SUBCASE("truncated, without an index") {
    write_file(shard, bytes.substr(0, bytes.size() - 3000));
    fs::remove(train::index_path(shard));
    CHECK_THROWS_WITH_AS(train::ShardReader{shard}, doctest::Contains(("shard " + shard + ": truncated").c_str()),
                         train::ShardError);
  }
  SUBCASE("a header's byte changed: its checksum fails when the sample is read") {
    std::string corrupt = bytes;
    const auto index = train::ShardIndex::parse(read_file(train::index_path(shard)), "index");
    corrupt[index.samples[4].first + 3] ^= 0x20;
    write_file(shard, corrupt);
    train::ShardReader reader(shard);
    CHECK(reader.read(3).key == "s3");
    CHECK_THROWS_WITH_AS(reader.read(4),
                         doctest::Contains(("shard " + shard +
                                            ", sample 4: corrupt at byte 0: a tar header's "
                                            "checksum does not match").c_str()),
                         train::ShardError);
  }
  SUBCASE("an index of another shard of the same size") {
    const auto index = train::ShardIndex::parse(read_file(train::index_path(shard)), "index");
    auto shifted = index;
    shifted.samples[2].first = index.samples[1].first;  // sample 1's members, and 2's
    shifted.samples[2].second = index.samples[1].second + index.samples[2].second;
    shifted.samples[1].second = 0;
    CHECK_THROWS_WITH_AS(train::ShardIndex::parse(shifted.serialize(), "x.idx"),
                         doctest::Contains("x.idx: sample 1 lies out of order"), train::ShardError);
    shifted.samples.erase(shifted.samples.begin() + 1);
    write_file(train::index_path(shard), shifted.serialize());
    train::ShardReader reader(shard);
    CHECK_THROWS_WITH_AS(reader.read(1), doctest::Contains("runs into sample s2 (a stale index"),
                         train::ShardError);
  }
  SUBCASE("not an index at all") {
    write_file(train::index_path(shard), "garbage");
    CHECK_THROWS_WITH_AS(train::ShardReader{shard}, doctest::Contains("not a trainrun shard index"),
                         train::ShardError);
  }
  SUBCASE("a missing shard") {
    CHECK_THROWS_WITH_AS(train::ShardReader{(dir.path / "none.tar").string()},
                         doctest::Contains("cannot open shard"), train::ShardError);
  }
}

TEST_CASE("shards: a field twice in one sample, and bad keys and patterns, are refused") {
  TempDir dir;
  // Two members with one name, written by hand.
  std::string tar;
  for (int i = 0; i < 2; ++i) {
    tar += train::shards::file_header("a.txt", 1) + "x" + std::string(511, '\0');
  }
  tar += train::shards::end_of_archive();
  CHECK_THROWS_WITH_AS(train::index_shard(tar, "t.tar"),
                       doctest::Contains("t.tar: sample a has field 'txt' twice"), train::ShardError);
  CHECK_THROWS_AS(train::ShardWriter((dir.path / "x.tar").string()), std::invalid_argument);
  CHECK_THROWS_AS(train::ShardWriter((dir.path / "x-%d-%d.tar").string()), std::invalid_argument);
  CHECK_THROWS_AS(train::ShardWriter((dir.path / "x-%s.tar").string()), std::invalid_argument);
  train::ShardWriter writer((dir.path / "x-%d.tar").string());
  CHECK_THROWS_AS(writer.write("a.b", {{"txt", ""}}), std::invalid_argument);
  CHECK_THROWS_AS(writer.write("a", {{"TXT", ""}}), std::invalid_argument);
  CHECK_THROWS_AS(writer.write("a", {{"txt", ""}, {"txt", ""}}), std::invalid_argument);
  CHECK_THROWS_AS(writer.write("a", {}), std::invalid_argument);
}

TEST_CASE("shards: specs expand brace ranges with their width, lists and sorted globs") {
  CHECK(train::expand_shards("d/t-{08..11}.tar") ==
        std::vector<std::string>{"d/t-08.tar", "d/t-09.tar", "d/t-10.tar", "d/t-11.tar"});
  CHECK(train::expand_shards("{a,b}-{1..2}.tar c.tar") ==
        std::vector<std::string>{"a-1.tar", "a-2.tar", "b-1.tar", "b-2.tar", "c.tar"});
  CHECK(train::expand_shards("s3://bucket/x-{0..1}.tar") ==
        std::vector<std::string>{"s3://bucket/x-0.tar", "s3://bucket/x-1.tar"});
  TempDir dir;
  for (const char* name : {"b.tar", "a.tar", "a.tar.idx"}) write_file(dir.path / name, "");
  CHECK(train::expand_shards((dir.path / "*.tar*").string()) ==
        std::vector<std::string>{(dir.path / "a.tar").string(), (dir.path / "b.tar").string()});
  CHECK_THROWS_WITH_AS(train::expand_shards((dir.path / "*.zip").string()),
                       doctest::Contains("matches no file"), std::invalid_argument);
  CHECK_THROWS_AS(train::expand_shards("t-{3..1}.tar"), std::invalid_argument);
  CHECK_THROWS_AS(train::expand_shards("t-{1..2.tar"), std::invalid_argument);
  CHECK_THROWS_AS(train::expand_shards("t-{x..2}.tar"), std::invalid_argument);
  CHECK_THROWS_AS(train::expand_shards("  "), std::invalid_argument);
}

TEST_CASE("assignment: every sample once per epoch across the ranks, for any shards and ranks") {
  const std::vector<uint64_t> counts{37, 5, 64, 1, 100, 13};  // 220 samples
  for (bool shuffle : {true, false}) {
    for (uint64_t world : {1, 2, 3, 7, 16}) {
      CAPTURE(shuffle);
      CAPTURE(world);
      PlanOptions options;
      options.shuffle = shuffle;
      options.chunk = 8;
      options.buffer = 30;
      // Without padding: each sample exactly once, ranks differ by one item at most.
      options.pad = false;
      std::multiset<uint64_t> seen;
      for (uint64_t r = 0; r < world; ++r) {
        auto mine = items(counts, options, 3, {}, world, r);
        CHECK(mine.size() >= 220 / world);
        CHECK(mine.size() <= 220 / world + 1);
        seen.insert(mine.begin(), mine.end());
      }
      CHECK(seen.size() == 220);
      CHECK(std::set<uint64_t>(seen.begin(), seen.end()).size() == 220);
      // Padded: every rank the same count, every sample at least once, and
      // the padding repeats world - 1 at most.
      options.pad = true;
      seen.clear();
      for (uint64_t r = 0; r < world; ++r) {
        auto mine = items(counts, options, 3, {}, world, r);
        CHECK(mine.size() == (220 + world - 1) / world);
        seen.insert(mine.begin(), mine.end());
      }
      CHECK(std::set<uint64_t>(seen.begin(), seen.end()).size() == 220);
      CHECK(seen.size() - 220 < world);
    }
  }
}

TEST_CASE("assignment: the same on every call, another order each epoch, chunks read together") {
  const std::vector<uint64_t> counts(20, 50);
  PlanOptions options;
  options.chunk = 10;
  options.buffer = 1000;
  options.pad = false;
  const auto a = items(counts, options, 0, {}, 1, 0);
  CHECK(a == items(counts, options, 0, {}, 1, 0));
  const auto b = items(counts, options, 1, {}, 1, 0);
  CHECK(a != b);
  options.seed = 9;
  CHECK(items(counts, options, 0, {}, 1, 0) != a);
  // A block of the whole epoch's order, read in chunk order, is chunks of 10
  // consecutive samples, each chunk from one shard.
  EpochPlan plan(counts, options, 0, {}, 1, 0);
  for (uint64_t position = 0; position < 1000; position += 10) {
    const uint64_t first = plan.sample_at(position);
    CHECK(first % 10 == 0);
    for (uint64_t i = 1; i < 10; ++i) CHECK(plan.sample_at(position + i) == first + i);
  }
  // In order, with no shuffle: the samples as the shards hold them, in contiguous spans.
  options.shuffle = false;
  const auto ordered = items(counts, options, 0, {}, 4, 1);
  for (size_t i = 0; i < ordered.size(); ++i) CHECK(ordered[i] == 250 + i);
}

TEST_CASE("assignment: segments under other world sizes leave exactly what no rank consumed") {
  const std::vector<uint64_t> counts{300, 211, 90};  // 601 samples
  PlanOptions options;
  options.chunk = 16;
  options.buffer = 50;
  options.pad = false;
  for (bool pad : {false, true}) {
    CAPTURE(pad);
    options.pad = pad;
    // 2 ranks consume 73 items each (a block and a part), then 3 ranks 40
    // each, then 1 rank the rest.
    const std::vector<Segment> history{{2, 73}, {3, 40}};
    std::multiset<uint64_t> trained;
    for (uint64_t r = 0; r < 2; ++r) {
      auto mine = items(counts, options, 5, {}, 2, r, 73);
      trained.insert(mine.begin(), mine.end());
    }
    for (uint64_t r = 0; r < 3; ++r) {
      auto mine = items(counts, options, 5, {history[0]}, 3, r, 40);
      trained.insert(mine.begin(), mine.end());
    }
    EpochPlan last(counts, options, 5, history, 1, 0);
    CHECK(last.remaining() == 601 - 2 * 73 - 3 * 40);
    auto rest = items(counts, options, 5, history, 1, 0);
    trained.insert(rest.begin(), rest.end());
    CHECK(trained.size() == 601);
    CHECK(std::set<uint64_t>(trained.begin(), trained.end()).size() == 601);
  }
  CHECK_THROWS_AS(EpochPlan(counts, options, 0, {{2, 400}}, 1, 0), std::invalid_argument);
  CHECK_THROWS_AS(EpochPlan(counts, options, 0, {}, 2, 2), std::invalid_argument);
}

TEST_CASE("shard sampler: a saved position resumes the same order, or another world's share") {
  const std::vector<uint64_t> counts{100, 100, 57};
  auto options = train::ShardOptions().chunk_samples(8).shuffle_buffer(40);
  auto drain = [](train::ShardSampler& sampler, size_t batches, size_t batch = 6) {
    std::vector<size_t> out;
    for (size_t i = 0; i < batches; ++i) {
      auto next = sampler.next(batch);
      if (!next) break;
      sampler.yielded(next->size());
      out.insert(out.end(), next->begin(), next->end());
    }
    return out;
  };
  // Uninterrupted, 2 ranks, epoch 1.
  std::vector<std::vector<size_t>> whole;
  for (int r = 0; r < 2; ++r) {
    train::ShardSampler sampler(counts, rank_of(r, 2), true, false, 3, options);
    sampler.set_epoch(1);
    sampler.reset();
    whole.push_back(drain(sampler, 1000));
  }
  // Saved after 5 batches handed out (7 asked for: read ahead), on rank 1.
  std::ostringstream saved;
  {
    train::ShardSampler sampler(counts, rank_of(1, 2), true, false, 3, options);
    sampler.set_epoch(1);
    sampler.reset();
    sampler.yielded(0);
    for (int i = 0; i < 7; ++i) sampler.next(6);
    for (int i = 0; i < 5; ++i) sampler.yielded(6);
    torch::serialize::OutputArchive archive;
    sampler.save(archive);
    archive.save_to(saved);
  }
  {  // The same world: the same order from item 30 on.
    train::ShardSampler sampler(counts, rank_of(1, 2), true, false, 3, options);
    std::istringstream in(saved.str());
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    sampler.load(archive);
    CHECK(sampler.epoch() == 1);
    sampler.reset();
    auto rest = drain(sampler, 1000);
    CHECK(rest == std::vector<size_t>(whole[1].begin() + 30, whole[1].end()));
  }
  {  // 3 ranks: what neither of the 2 consumed (30 items each), once.
    std::multiset<size_t> trained(whole[0].begin(), whole[0].begin() + 30);
    trained.insert(whole[1].begin(), whole[1].begin() + 30);
    for (int r = 0; r < 3; ++r) {
      train::ShardSampler sampler(counts, rank_of(r, 3), true, false, 3, options);
      std::istringstream in(saved.str());
      torch::serialize::InputArchive archive;
      archive.load_from(in);
      sampler.load(archive);
      CHECK(sampler.local_size() == (257 - 60) / 3 + (static_cast<size_t>(r) < (257 - 60) % 3));
      sampler.reset();
      auto mine = drain(sampler, 1000);
      trained.insert(mine.begin(), mine.end());
    }
    CHECK(trained.size() == 257);
    CHECK(std::set<size_t>(trained.begin(), trained.end()).size() == 257);
  }
  {  // Other shards: refused.
    train::ShardSampler sampler({100, 100, 58}, rank_of(0, 2), true, false, 3, options);
    std::istringstream in(saved.str());
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    CHECK_THROWS_WITH_AS(sampler.load(archive), doctest::Contains("other sample counts"),
                         std::runtime_error);
  }
}

TEST_CASE("shard fields: npy arrays, torch.save tensors and class labels") {
  // numpy.save(np.arange(6, dtype=np.uint8).reshape(2, 3)): the header padded to 128 bytes.
  std::string header = "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }";
  header.resize(128 - 10 - 1, ' ');
  header += '\n';
  std::string npy = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' +
                    header + std::string("\x00\x01\x02\x03\x04\x05", 6);
  auto tensor = train::npy_tensor(npy);
  CHECK(tensor.sizes().vec() == std::vector<int64_t>{2, 3});
  CHECK((tensor.scalar_type() == torch::kUInt8));
  CHECK(torch::equal(tensor, torch::arange(6, torch::kUInt8).reshape({2, 3})));
  CHECK_THROWS_WITH_AS(train::npy_tensor(npy.substr(0, npy.size() - 1)),
                       doctest::Contains("needs 6 bytes of data, not 5"), train::ShardError);
  CHECK_THROWS_AS(train::npy_tensor("not numpy"), train::ShardError);
  // Written as numpy.save writes it, and read back.
  CHECK(train::npy_bytes(torch::arange(6, torch::kUInt8).reshape({2, 3})) == npy);
  for (const auto& t : {torch::arange(5, torch::kFloat), torch::ones({2, 1, 3}, torch::kInt64),
                        torch::tensor(true), torch::arange(6, torch::kDouble).reshape({3, 2}).t()}) {
    const auto back = train::npy_tensor(train::npy_bytes(t));
    CHECK(back.sizes().vec() == t.sizes().vec());
    CHECK(torch::equal(back, t.contiguous()));
  }
  auto pickled = torch::pickle_save(torch::arange(4, torch::kFloat));
  CHECK(torch::equal(train::pt_tensor(std::string(pickled.begin(), pickled.end())),
                     torch::arange(4, torch::kFloat)));
  CHECK_THROWS_AS(train::pt_tensor("junk"), train::ShardError);
  CHECK(train::class_label("7\n") == 7);
  CHECK(train::class_label("-3") == -3);
  CHECK_THROWS_WITH_AS(train::class_label("cat"), doctest::Contains("'cat', not an integer"),
                       train::ShardError);
}

TEST_CASE("shard dataset: a bad sample ends the read naming it, or is skipped and counted") {
  TempDir dir;
  const auto paths = write_samples(dir.path, 12, 12);
  // Sample 5's first header corrupted.
  auto bytes = read_file(paths[0]);
  const auto index = train::ShardIndex::parse(read_file(train::index_path(paths[0])), "index");
  bytes[index.samples[5].first + 10] ^= 0x40;
  write_file(paths[0], bytes);
  auto transform = [](const train::Sample& sample) {
    if (sample.key == "s7") throw std::runtime_error("cannot decode");
    return torch::data::Example<>(torch::tensor(train::class_label(sample.at("cls"))),
                                  torch::tensor(0));
  };
  const std::vector<size_t> all{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  train::ShardDataset strict(paths[0], transform);
  CHECK_THROWS_WITH_AS(strict.get_batch(all),
                       doctest::Contains(("shard " + paths[0] + ", sample 5: corrupt").c_str()),
                       train::ShardError);
  CHECK_THROWS_WITH_AS(strict.get(7),
                       doctest::Contains(("shard " + paths[0] + ", sample 7 (s7): cannot decode")
                                             .c_str()),
                       train::ShardError);
  train::ShardDataset lenient(paths[0], transform, train::ShardOptions().skip_bad_samples(true));
  CHECK(lenient.get_batch(all).size() == 10);
  CHECK(lenient.skipped() == 2);
  // Through the loader: the batch with the bad samples is shorter, and the
  // position still counts it whole.
  train::ShardSampler sampler(lenient.reader().counts(), rank_of(0, 1), false, false, 0,
                              lenient.options());
  train::DataLoader<train::ShardDataset, train::ShardSampler> loader(
      lenient, sampler, train::LoaderOptions().batch_size(4).progress(false), torch::kCPU);
  std::vector<int64_t> sizes;
  for (auto& batch : loader) sizes.push_back(batch.data.size(0));
  CHECK(sizes == std::vector<int64_t>{4, 2, 4});
  torch::serialize::OutputArchive archive;
  loader.save(archive);
  std::ostringstream saved;
  archive.save_to(saved);
  std::istringstream in(saved.str());
  torch::serialize::InputArchive loaded;
  loaded.load_from(in);
  torch::Tensor consumed;
  loaded.read("shards.consumed", consumed, true);
  CHECK(consumed.item<int64_t>() == 12);
}

TEST_CASE("shard sampler: a position keeps the plan it was made with, and an epoch set is new") {
  const std::vector<uint64_t> counts{100, 100};
  auto save = [](const train::ShardSampler& sampler) {
    torch::serialize::OutputArchive archive;
    sampler.save(archive);
    std::ostringstream out;
    archive.save_to(out);
    return out.str();
  };
  auto load = [](train::ShardSampler& sampler, const std::string& bytes) {
    std::istringstream in(bytes);
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    sampler.load(archive);
  };
  auto drain = [](train::ShardSampler& sampler) {
    std::vector<size_t> out;
    while (auto next = sampler.next(5)) {
      sampler.yielded(next->size());
      out.insert(out.end(), next->begin(), next->end());
    }
    return out;
  };
  const auto small = train::ShardOptions().chunk_samples(4).shuffle_buffer(40);
  train::ShardSampler first(counts, rank_of(0, 1), true, true, 2, small);
  first.set_epoch(3);
  first.reset();
  const auto whole = drain(first);
  train::ShardSampler saver(counts, rank_of(0, 1), true, true, 2, small);
  saver.set_epoch(3);
  saver.reset();
  saver.yielded(0);
  for (int i = 0; i < 6; ++i) saver.yielded(saver.next(5)->size());
  const auto saved = save(saver);
  // Loaded where the shuffle block is another size (s3:// shards copied to a
  // disk, a smaller cache): the epoch goes on in the order it began with.
  train::ShardSampler other(counts, rank_of(0, 1), true, true, 2,
                            train::ShardOptions().chunk_samples(4).shuffle_buffer(80));
  load(other, saved);
  other.reset();
  CHECK(drain(other) == std::vector<size_t>(whole.begin() + 30, whole.end()));
  // The next epoch takes the new options; and set at the top of a loop,
  // before its first batch, it is saved as begun at nothing.
  other.set_epoch(4);
  train::ShardSampler fresh(counts, rank_of(0, 1), true, true, 2,
                            train::ShardOptions().chunk_samples(4).shuffle_buffer(80));
  load(fresh, save(other));
  CHECK(fresh.epoch() == 4);
  CHECK(fresh.resume_position() == 0);
  fresh.reset();
  CHECK(drain(fresh).size() == 200);
}

TEST_CASE("shards: an empty file, a shard without its end blocks, and bad npy headers are refused") {
  TempDir dir;
  write_file(dir.path / "empty.tar", "");
  CHECK_THROWS_WITH_AS(train::ShardReader{(dir.path / "empty.tar").string()},
                       doctest::Contains("empty (0 bytes)"), train::ShardError);
  const auto paths = write_samples(dir.path, 4, 4);
  const auto bytes = read_file(paths[0]);
  std::filesystem::remove(train::index_path(paths[0]));
  write_file(paths[0], bytes.substr(0, bytes.size() - 1024));  // cut at a header boundary
  CHECK_THROWS_WITH_AS(train::ShardReader{paths[0]},
                       doctest::Contains("without tar's end-of-archive blocks"), train::ShardError);
  train::ShardWriter writer((dir.path / "dup-%d.tar").string());
  writer.write("a", {{"txt", "1"}});
  CHECK_THROWS_WITH_AS(writer.write("a", {{"cls", "1"}}),
                       doctest::Contains("follows a sample of the same key"), std::invalid_argument);
  auto npy_with = [](std::string header) {
    header.resize(((10 + header.size() + 1 + 63) / 64) * 64 - 11, ' ');
    header += '\n';
    return std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size() & 0xff) +
           static_cast<char>(header.size() >> 8) + header;
  };
  CHECK_THROWS_WITH_AS(train::npy_tensor(npy_with("{'descr': '|u1', 'fortran_order': False, "
                                                  "'shape': (2, -3), }")),
                       doctest::Contains("no shape of whole numbers"), train::ShardError);
  CHECK_THROWS_WITH_AS(train::npy_tensor(npy_with(std::string(20000, ' '))),
                       doctest::Contains("at most 10000 are read"), train::ShardError);
}

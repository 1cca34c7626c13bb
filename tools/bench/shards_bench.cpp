// Sharded data, read as a rank reads it, against the storage's own sequential
// read of the same bytes (tools/bench/shards.py runs it for local and s3://
// shards in interleaved rounds; docs/benchmarks.md).
//
//   shards_bench write DIR [--samples 20000] [--bytes 50000] [--classes 10]
//       synthetic samples of random bytes, written sorted by label into
//       shards of 256 MiB at most (DIR/train-NNNNNN.tar and their indexes)
//   shards_bench read SPEC [--rounds 3] [--batch 64] [--buffer 8192] [--chunk 64]
//       per round, alternating which goes first: `cat` (each shard read whole,
//       in order, 128 KiB at a time as cat does; local shards only) and `reader` (every sample
//       of one epoch in the order rank 0 of 1 reads it, each read and split into
//       its fields); then the loader (prepare_data_loader's, 2 threads) through
//       an epoch, its peak memory, the time to its first batch from a fresh
//       start and after resuming at 10%, 50% and 90% of the epoch, and the label
//       entropy of its batches against a uniform random permutation's.
//       Prints one JSON object per measure; s3:// specs use the AWS_* settings.
//       --cold drops the page cache before each cat and reader round (root).

#include <train/shards.h>

#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>

#include "core/host.h"
#include "data/shards/assignment.h"
#include "worker/object_reads.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void print(nlohmann::json line) { std::cout << line.dump() << std::endl; }

// The process's resident memory now, in MiB.
double rss_mib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

int write_shards(const std::string& dir, int samples, int bytes, int classes) {
  std::filesystem::create_directories(dir);
  train::ShardWriter writer(dir + "/train-%06d.tar");
  std::mt19937_64 random(1);
  std::string payload(static_cast<size_t>(bytes), '\0');
  for (int i = 0; i < samples; ++i) {
    for (size_t j = 0; j < payload.size(); j += 8) {
      const uint64_t r = random();
      std::memcpy(payload.data() + j, &r, std::min<size_t>(8, payload.size() - j));
    }
    const int label = static_cast<int>(static_cast<int64_t>(i) * classes / samples);
    char key[32];
    std::snprintf(key, sizeof(key), "s%08d", i);
    writer.write(key, {{"bin", payload}, {"cls", std::to_string(label)}});
  }
  const auto shards = writer.close();
  print({{"wrote", shards.size()}, {"samples", samples}, {"bytes_per_sample", bytes}});
  return 0;
}

// The host table a train function would have, for s3:// shards: the worker's
// own object reads.
trainrun::ObjectReads objects;
train_host_v1_t object_host() {
  train_host_v1_t host{};
  host.abi_version = TRAIN_PLUGIN_ABI_VERSION;
  host.struct_size = sizeof(host);
  host.object_size = [](void*, const char* url, uint64_t* size, char* error, size_t n) {
    try {
      auto found = objects.size(url);
      if (!found) return 2;
      *size = *found;
      return 0;
    } catch (const std::exception& e) {
      std::snprintf(error, n, "%s", e.what());
      return 1;
    }
  };
  host.read_object = [](void*, const char* url, uint64_t offset, uint64_t length, void* out,
                        char* error, size_t n) {
    try {
      objects.read(url, offset, length, out);
      return 0;
    } catch (const std::exception& e) {
      std::snprintf(error, n, "%s", e.what());
      return 1;
    }
  };
  return host;
}

// Bytes of every shard read in order, 128 KiB at a time as cat(1) reads
// (coreutils' buffer), local only.
uint64_t cat(const std::vector<std::string>& shards) {
  std::vector<char> buffer(128 << 10);
  uint64_t total = 0;
  for (const auto& path : shards) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("cannot open " + path);
    for (ssize_t n; (n = ::read(fd, buffer.data(), buffer.size())) > 0;) total += static_cast<uint64_t>(n);
    ::close(fd);
  }
  return total;
}

struct Setup {
  std::string spec;
  size_t batch;
  uint64_t buffer, chunk;
  bool cold = false;  // the page cache dropped before each measure (root)
};

// Empties the page cache, so that a measure reads from the disk.
void drop_caches() {
  ::sync();
  std::ofstream("/proc/sys/vm/drop_caches") << "1\n";
}

train::ShardOptions shard_options(const Setup& setup) {
  return train::ShardOptions().shuffle_buffer(setup.buffer).chunk_samples(setup.chunk);
}

train::ShardDataset dataset(const Setup& setup) {
  return train::ShardDataset(
      setup.spec,
      [](const train::Sample& sample) {
        return torch::data::Example<>(torch::tensor(static_cast<int64_t>(sample.at("bin").size())),
                                      torch::tensor(train::class_label(sample.at("cls"))));
      },
      shard_options(setup));
}

using Loader = train::DataLoader<train::ShardDataset, train::ShardSampler>;

Loader loader(const Setup& setup, size_t workers) {
  auto data = dataset(setup);
  const train::Context ctx(0, 0, 0, 1, 1, torch::kCPU, "bench", "/nonexistent");
  train::ShardSampler sampler(data.reader().counts(), ctx, true, true, 0,
                              shard_options(setup).shuffle_buffer(data.shuffle_buffer()));
  sampler.on_block([reader = data](const std::vector<size_t>& samples) { reader.read_ahead(samples); });
  return Loader(std::move(data), std::move(sampler),
                train::LoaderOptions().batch_size(setup.batch).workers(workers).progress(false),
                torch::kCPU);
}

// Every sample of epoch 0 in rank 0's order, read and split into fields.
uint64_t read_epoch(const train::ShardDataset& data, const Setup& setup) {
  const auto& reader = data.reader();
  train::shards::PlanOptions options;
  options.chunk = setup.chunk;
  options.buffer = data.shuffle_buffer();
  train::shards::EpochPlan plan(reader.counts(), options, 0, {}, 1, 0);
  uint64_t bytes = 0;
  for (uint64_t k = 0; k < plan.size(); ++k) {
    if (k % options.buffer == 0) {  // as the loader's sampler does at each block
      std::vector<size_t> block;
      for (uint64_t i = k; i < std::min(plan.size(), k + options.buffer); ++i) {
        block.push_back(plan.sample(i));
      }
      data.read_ahead(block);
    }
    const auto index = plan.sample(k);
    const auto [shard, local] = reader.locate(index);
    bytes += reader.extent(shard, local).second;
    (void)data.sample(index);
  }
  return bytes;
}

// Seconds from nothing open to the first batch, from `position` of the epoch.
double first_batch(const Setup& setup, size_t position) {
  const auto start = Clock::now();
  auto l = loader(setup, 2);
  l.set_epoch(0);
  if (position > 0) l.resume(position / setup.batch);
  auto it = l.begin();
  (void)*it;
  return seconds_since(start);
}

// The mean entropy (bits) of the label counts of each batch.
double mean_entropy(const std::vector<int64_t>& labels, size_t batch, int classes) {
  double sum = 0;
  size_t batches = 0;
  for (size_t at = 0; at + batch <= labels.size(); at += batch, ++batches) {
    std::vector<int> counts(static_cast<size_t>(classes), 0);
    for (size_t i = at; i < at + batch; ++i) ++counts[static_cast<size_t>(labels[i])];
    double h = 0;
    for (int c : counts) {
      if (c > 0) h -= c / static_cast<double>(batch) * std::log2(c / static_cast<double>(batch));
    }
    sum += h;
  }
  return batches > 0 ? sum / static_cast<double>(batches) : 0;
}

int read_shards(const Setup& setup, int rounds) {
  const bool remote = setup.spec.rfind("s3://", 0) == 0;
  const auto shards = train::expand_shards(setup.spec);
  auto data = dataset(setup);
  const uint64_t samples = data.reader().size();
  std::vector<int64_t> labels;  // of the first loader epoch's batches
  for (int round = 0; round < rounds; ++round) {
    auto time_cat = [&] {
      if (setup.cold) drop_caches();
      const auto start = Clock::now();
      const uint64_t bytes = cat(shards);
      print({{"measure", "cat"}, {"round", round}, {"cold", setup.cold},
             {"mib_per_s", bytes / seconds_since(start) / (1 << 20)}});
    };
    auto time_reader = [&] {
      auto fresh = dataset(setup);  // an empty chunk cache each round
      if (setup.cold) drop_caches();
      const auto start = Clock::now();
      const uint64_t bytes = read_epoch(fresh, setup);
      print({{"measure", "reader"}, {"round", round}, {"cold", setup.cold},
             {"mib_per_s", bytes / seconds_since(start) / (1 << 20)}});
    };
    // The loader through one epoch (2 threads): its rate and its memory.
    auto time_loader = [&] {
      auto l = loader(setup, 2);
      if (setup.cold) drop_caches();
      const double before = rss_mib();
      double peak = before;
      l.set_epoch(0);
      std::vector<int64_t> seen;
      const auto start = Clock::now();
      uint64_t bytes = 0;
      for (auto& batch : l) {
        bytes += static_cast<uint64_t>(batch.data.sum().item<int64_t>());
        const auto* t = batch.target.data_ptr<int64_t>();
        seen.insert(seen.end(), t, t + batch.target.numel());
        peak = std::max(peak, rss_mib());
      }
      const double seconds = seconds_since(start);
      print({{"measure", "loader"}, {"round", round}, {"cold", setup.cold},
             {"samples_per_s", seen.size() / seconds}, {"mib_per_s", bytes / seconds / (1 << 20)},
             {"peak_rss_growth_mib", peak - before}, {"shuffle_buffer", data.shuffle_buffer()},
             {"chunk_samples", setup.chunk},
             {"read_ahead_mib", shard_options(setup).read_ahead_bytes() >> 20},
             {"cache_mib", remote ? shard_options(setup).cache_bytes() >> 20 : 0}});
      if (labels.empty()) labels = std::move(seen);
    };
    std::vector<std::function<void()>> measures{time_reader, time_loader};
    if (!remote) measures.insert(measures.begin(), time_cat);
    std::rotate(measures.begin(), measures.begin() + round % measures.size(), measures.end());
    for (auto& measure : measures) measure();
  }
  {  // Against a uniform random permutation's batches of the same labels.
    std::vector<int64_t> uniform = labels;
    std::shuffle(uniform.begin(), uniform.end(), std::mt19937_64(7));
    const int classes = static_cast<int>(*std::max_element(labels.begin(), labels.end()) + 1);
    const double ours = mean_entropy(labels, setup.batch, classes);
    const double random = mean_entropy(uniform, setup.batch, classes);
    print({{"measure", "label_entropy"}, {"bits", ours}, {"uniform_bits", random},
           {"ratio", ours / random}});
  }
  for (int round = 0; round < rounds; ++round) {
    nlohmann::json line{{"measure", "first_batch"}, {"round", round}};
    for (double fraction : {0.0, 0.1, 0.5, 0.9}) {
      const auto position = static_cast<size_t>(fraction * static_cast<double>(samples)) /
                            setup.batch * setup.batch;
      line["s_at_" + std::to_string(static_cast<int>(fraction * 100))] =
          first_batch(setup, position);
    }
    print(line);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("sharded data against a sequential read of the same bytes");
  app.require_subcommand(1);
  auto* write = app.add_subcommand("write", "write synthetic shards sorted by label");
  std::string dir;
  int samples = 20000, bytes = 50000, classes = 10;
  write->add_option("dir", dir)->required();
  write->add_option("--samples", samples);
  write->add_option("--bytes", bytes);
  write->add_option("--classes", classes);
  auto* read = app.add_subcommand("read", "read them as a rank does");
  Setup setup{"", 64, 8192, 64};
  int rounds = 3;
  read->add_option("spec", setup.spec)->required();
  read->add_option("--rounds", rounds);
  read->add_option("--batch", setup.batch);
  read->add_option("--buffer", setup.buffer);
  read->add_option("--chunk", setup.chunk);
  read->add_flag("--cold", setup.cold, "drop the page cache before each read (root)");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);
  const auto host = object_host();
  train::detail::HostScope scope(&host);
  if (*write) return write_shards(dir, samples, bytes, classes);
  return read_shards(setup, rounds);
}

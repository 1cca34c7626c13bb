#include "data/shards/disk_cache.h"

#include <train/shard_files.h>

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

namespace train::shards {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSuffix = ".chunk";

// FNV-1a, printed in hex: a file name for a URL of any length and characters.
std::string hash_hex(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  std::ostringstream out;
  out << std::hex << hash;
  return out.str();
}

}  // namespace

DiskCache::DiskCache(fs::path dir, uint64_t capacity) : dir_(std::move(dir)), capacity_(capacity) {
  std::error_code error;
  fs::create_directories(dir_, error);
  if (error || !fs::is_directory(dir_)) {
    throw ShardError("cannot make the shard cache directory " + dir_.string() + ": " +
                     error.message());
  }
  std::lock_guard lock(mutex_);
  evict();  // what earlier runs left, to the bound
}

std::string DiskCache::name(const std::string& url, uint64_t shard_bytes, uint64_t offset,
                            uint64_t length) {
  return hash_hex(url) + "-" + std::to_string(shard_bytes) + "-" + std::to_string(offset) + "-" +
         std::to_string(length) + kSuffix;
}

std::optional<std::string> DiskCache::load(const std::string& name, uint64_t bytes) {
  const auto path = dir_ / name;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string data(bytes, '\0');
  in.read(data.data(), static_cast<std::streamsize>(bytes));
  if (static_cast<uint64_t>(in.gcount()) != bytes || in.peek() != EOF) return std::nullopt;
  std::error_code error;
  fs::last_write_time(path, fs::file_time_type::clock::now(), error);  // used: newest
  return data;
}

void DiskCache::store(const std::string& name, const std::string& bytes) {
  if (bytes.size() > capacity_) return;
  const auto temporary =
      dir_ / (name + ".partial." + std::to_string(::getpid()) + "." +
              std::to_string(std::random_device{}()));
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) {  // a full disk: no cache, never a failed read
      out.close();
      std::error_code ignored;
      fs::remove(temporary, ignored);
      return;
    }
  }
  std::error_code error;
  fs::rename(temporary, dir_ / name, error);
  if (error) {
    fs::remove(temporary, error);
    return;
  }
  std::lock_guard lock(mutex_);
  stored_ += bytes.size();
  if (stored_ > capacity_ / 8) evict();  // a scan per eighth of the bound written
}

void DiskCache::evict() {
  stored_ = 0;
  struct File {
    fs::path path;
    fs::file_time_type used;
    uint64_t bytes;
  };
  std::vector<File> files;
  uint64_t total = 0;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir_, error)) {
    const auto path = entry.path();
    if (path.extension() != kSuffix) continue;
    std::error_code ignored;
    const auto bytes = entry.file_size(ignored);
    const auto used = entry.last_write_time(ignored);
    if (ignored) continue;  // gone meanwhile: another rank evicted it
    files.push_back({path, used, bytes});
    total += bytes;
  }
  std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.used < b.used; });
  for (const auto& file : files) {
    if (total <= capacity_) break;
    std::error_code ignored;
    if (fs::remove(file.path, ignored)) total -= file.bytes;
  }
}

}  // namespace train::shards

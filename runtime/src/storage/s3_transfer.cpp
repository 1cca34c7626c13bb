#include "storage/s3_transfer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/crash_point.h"
#include "common/fd.h"
#include "common/hash.h"

namespace trainrun::s3 {
namespace {

constexpr uint64_t kMaxParts = 10000;  // S3's limit
// How often a transfer looks at its caller's stop flag while it waits.
constexpr auto kStopPoll = std::chrono::milliseconds(200);

size_t part_size_for(uint64_t size, size_t wanted) {
  uint64_t least = (size + kMaxParts - 1) / kMaxParts;
  return static_cast<size_t>(std::max<uint64_t>(wanted, least));
}

void read_exactly(int fd, char* out, size_t size, uint64_t offset,
                  const std::filesystem::path& file) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw IoError("cannot read " + file.string() + ": " +
                    (n < 0 ? std::strerror(errno) : "it is shorter than when it was listed"));
    }
    done += static_cast<size_t>(n);
  }
}

// The first error of several threads, and a stop flag for the rest.
class Failure {
 public:
  void set(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = error;
    stop_ = true;
  }
  bool failed() const { return stop_.load(); }
  void rethrow() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) std::rethrow_exception(error_);
  }
  const std::atomic<bool>* flag() const { return &stop_; }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
  std::atomic<bool> stop_{false};
};

// The clients of one transfer stop at a sibling's failure; the caller's own
// stop flag is looked at between parts.
ClientOptions with_stop(const TransferOptions& options, Failure& failure) {
  ClientOptions client = options.client;
  client.stop = failure.flag();
  return client;
}

long env_number(const char* name, long low, long high, long fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < low || value > high) {
    throw UsageError(std::string(name) + " must be a whole number from " + std::to_string(low) +
                     " to " + std::to_string(high) + ", got '" + text + "'");
  }
  return value;
}

}  // namespace

TransferOptions TransferOptions::from_environment() {
  TransferOptions options;
  options.threads =
      static_cast<int>(env_number("TRAINRUN_S3_CONCURRENCY", 1, 256, options.threads));
  options.part_size = static_cast<size_t>(env_number("TRAINRUN_S3_PART_MB", 5, 5120,
                                                     static_cast<long>(options.part_size >> 20)))
                      << 20;
  return options;
}

std::string upload_file(const Config& config, const std::string& bucket,
                        const std::filesystem::path& file, uint64_t size, const std::string& key,
                        const TransferOptions& options) {
  Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw IoError("cannot read " + file.string() + ": " + std::strerror(errno));
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0 || static_cast<uint64_t>(info.st_size) != size) {
    throw IoError("checkpoint file " + file.string() + " changed size since it was listed");
  }
  const size_t part_size = part_size_for(size, options.part_size);
  Sha256 hash;
  if (size <= part_size) {  // one PUT
    std::vector<char> bytes(size);
    read_exactly(fd.get(), bytes.data(), size, 0, file);
    hash.update(bytes.data(), size);
    Client(config, bucket, options.client).put(key, bytes.data(), size);
    return hash.hex_digest();
  }

  Failure failure;
  Client control(config, bucket, options.client);
  const std::string upload_id = control.create_multipart(key);
  const uint64_t parts = (size + part_size - 1) / part_size;
  const int threads = static_cast<int>(std::clamp<uint64_t>(options.threads, 1, parts));
  std::vector<std::string> etags(parts);

  // Buffers go round: the reader fills a free one, a sender empties it.
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::vector<char>> buffers(threads + 1);
  std::deque<size_t> free_buffers;
  for (size_t i = 0; i < buffers.size(); ++i) free_buffers.push_back(i);
  std::deque<std::pair<uint64_t, size_t>> ready;  // part, buffer
  bool reading_done = false;

  auto send = [&] {
    try {
      Client client(config, bucket, with_stop(options, failure));
      while (true) {
        std::pair<uint64_t, size_t> job;
        {
          std::unique_lock<std::mutex> lock(mutex);
          changed.wait(lock, [&] { return !ready.empty() || reading_done || failure.failed(); });
          if (failure.failed() || ready.empty()) return;
          job = ready.front();
          ready.pop_front();
        }
        auto& buffer = buffers[job.second];
        etags[job.first] = client.upload_part(key, upload_id, static_cast<int>(job.first + 1),
                                              buffer.data(), buffer.size());
        {
          std::lock_guard<std::mutex> lock(mutex);
          crash_point("upload:part");  // tests: a rank killed with parts uploaded
          free_buffers.push_back(job.second);
        }
        changed.notify_all();
      }
    } catch (...) {
      failure.set(std::current_exception());
      changed.notify_all();
    }
  };
  std::vector<std::thread> senders;
  try {
    for (int i = 0; i < threads; ++i) senders.emplace_back(send);
    for (uint64_t part = 0; part < parts; ++part) {
      size_t index;
      {
        std::unique_lock<std::mutex> lock(mutex);
        // Polled: the caller's stop flag has no one to notify us.
        while (!changed.wait_for(lock, kStopPoll, [&] {
          return !free_buffers.empty() || failure.failed() ||
                 (options.client.stop != nullptr && options.client.stop->load());
        })) {
        }
        if (failure.failed()) break;
        if (options.client.stop != nullptr && options.client.stop->load()) {
          throw S3Error("upload of " + control.url(key) + " stopped", 0, "");
        }
        index = free_buffers.front();
        free_buffers.pop_front();
      }
      uint64_t offset = part * part_size;
      auto& buffer = buffers[index];
      buffer.resize(static_cast<size_t>(std::min<uint64_t>(part_size, size - offset)));
      read_exactly(fd.get(), buffer.data(), buffer.size(), offset, file);
      hash.update(buffer.data(), buffer.size());
      {
        std::lock_guard<std::mutex> lock(mutex);
        ready.emplace_back(part, index);
      }
      changed.notify_all();
    }
  } catch (...) {
    failure.set(std::current_exception());
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    reading_done = true;
    changed.notify_all();
    // The parts still in flight stop at the caller's stop flag too.
    while (!changed.wait_for(lock, kStopPoll, [&] {
      return (ready.empty() && free_buffers.size() == buffers.size()) || failure.failed();
    })) {
      if (options.client.stop != nullptr && options.client.stop->load()) {
        lock.unlock();
        failure.set(
            std::make_exception_ptr(S3Error("upload of " + control.url(key) + " stopped", 0, "")));
        lock.lock();
      }
    }
  }
  changed.notify_all();
  for (auto& sender : senders) sender.join();
  try {
    failure.rethrow();
    try {
      control.complete_multipart(key, upload_id, etags);
    } catch (const S3Error& e) {
      // A retry of a completion whose answer was lost finds no upload: the
      // object is there if the first one joined it.
      if (e.code() != "NoSuchUpload" || control.head(key) != std::optional<uint64_t>(size)) throw;
    }
  } catch (...) {
    try {
      Client(config, bucket, options.client.stop == nullptr ? options.client : ClientOptions{})
          .abort_multipart(key, upload_id);
    } catch (const std::exception&) {  // the controller aborts what is left
    }
    throw;
  }
  return hash.hex_digest();
}

std::vector<std::string> download_files(const Config& config, const std::string& bucket,
                                        const std::vector<Download>& files,
                                        const TransferOptions& options) {
  // Every part of every file in one queue, in file order: the fetchers work
  // through it, and the hashing follows them file by file.
  struct Part {
    size_t file;
    uint64_t offset;
    size_t length;
  };
  std::vector<Part> parts;
  std::vector<Fd> fds;
  std::vector<size_t> first_part;
  const size_t part_size = options.part_size;
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& file = files[i];
    Fd fd(::open(file.path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      throw IoError("cannot write " + file.path.string() + ": " + std::strerror(errno));
    }
    // Its blocks allocated up front (a full disk fails here, not midway):
    // parts written out of order into a sparse file fragment it, and cost
    // more than the download itself.
    if (file.size > 0) {
      int error = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(file.size));
      if (error == EOPNOTSUPP || error == EINVAL) {
        error = ::ftruncate(fd.get(), static_cast<off_t>(file.size)) == 0 ? 0 : errno;
      }
      if (error != 0) {
        throw IoError("cannot write " + file.path.string() + ": " + std::strerror(error));
      }
    }
    fds.push_back(std::move(fd));
    first_part.push_back(parts.size());
    for (uint64_t offset = 0; offset < file.size; offset += part_size) {
      parts.push_back(
          {i, offset, static_cast<size_t>(std::min<uint64_t>(part_size, file.size - offset))});
    }
  }
  first_part.push_back(parts.size());
  const int threads =
      static_cast<int>(std::clamp<uint64_t>(options.threads, 1, std::max<size_t>(1, parts.size())));
  Failure failure;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<bool> done(parts.size(), false);
  size_t next = 0;

  auto fetch = [&] {
    try {
      Client client(config, bucket, with_stop(options, failure));
      while (true) {
        size_t index;
        {
          std::lock_guard<std::mutex> lock(mutex);
          if (next >= parts.size() || failure.failed()) return;
          index = next++;
        }
        const auto& part = parts[index];
        const auto& file = files[part.file];
        client.get_range_to_file(file.key, part.offset, part.length, fds[part.file].get());
        {
          std::lock_guard<std::mutex> lock(mutex);
          done[index] = true;
        }
        changed.notify_all();
      }
    } catch (...) {
      failure.set(std::current_exception());
      changed.notify_all();
    }
  };
  std::vector<std::thread> fetchers;
  // Hash in order, behind the fetchers, from the page cache.
  std::vector<std::string> digests;
  std::vector<char> buffer;
  try {
    for (int i = 0; i < threads && !parts.empty(); ++i) fetchers.emplace_back(fetch);
    for (size_t i = 0; i < files.size() && !failure.failed(); ++i) {
      Sha256 hash;
      for (size_t index = first_part[i]; index < first_part[i + 1]; ++index) {
        {
          std::unique_lock<std::mutex> lock(mutex);
          changed.wait(lock, [&] { return done[index] || failure.failed(); });
          if (failure.failed()) break;
        }
        const auto& part = parts[index];
        buffer.resize(part.length);
        read_exactly(fds[i].get(), buffer.data(), part.length, part.offset, files[i].path);
        hash.update(buffer.data(), part.length);
      }
      digests.push_back(hash.hex_digest());
    }
  } catch (...) {
    failure.set(std::current_exception());
  }
  for (auto& fetcher : fetchers) fetcher.join();
  failure.rethrow();
  return digests;
}

}  // namespace trainrun::s3

#pragma once

// Shard files as WebDataset writes them, without LibTorch: a shard is a tar
// file whose members sharing a basename make one sample, each member a field
// named by its extension ("0001.jpg" and "0001.cls": sample "0001" with fields
// "jpg" and "cls"). Beside each shard, "<shard>.idx" lists where each sample
// starts, so that any sample is read without reading the shard from its start
// (docs/data.md gives the layout). Classes here are not thread-safe unless they
// say so; ShardReader's reads are.

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace train {

/// A shard that cannot be read as one (truncated, corrupt, a stale or missing
/// index, a sample whose fields clash). The message names the shard, and the
/// sample where there is one.
class ShardError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One sample: its key and its fields, each the bytes of one tar member, in
/// the order the shard holds them. The fields view `data` (read once, not
/// copied per field), which the sample keeps alive: copies share it.
struct Sample {
  std::string key;
  std::vector<std::pair<std::string, std::string_view>> fields;
  std::shared_ptr<const void> data;

  /// The field named `name` ("jpg", "cls", "seg.png"), or nullptr.
  const std::string_view* find(std::string_view name) const;
  /// The same; throws ShardError naming the key and the fields it has when it
  /// has none of that name.
  std::string_view at(std::string_view name) const;
};

/// Where each sample of a shard lies: its first header's offset and its
/// bytes up to the end of its last member, in shard order.
struct ShardIndex {
  uint64_t shard_bytes = 0;  // the shard's size when it was indexed
  std::vector<std::pair<uint64_t, uint64_t>> samples;

  /// The index file's bytes (docs/data.md, "The index").
  std::string serialize() const;
  /// Parses an index file's bytes; throws ShardError naming `where` when they
  /// are not one (a wrong magic, a size that does not match its count,
  /// offsets out of order or past `shard_bytes`).
  static ShardIndex parse(std::string_view bytes, const std::string& where);
};

/// Indexes a whole shard held in memory (`bytes`, named `where` in errors), as
/// WebDataset groups members: a new sample where the key changes. Throws
/// ShardError for a truncated or corrupt tar, or a field twice in one sample.
ShardIndex index_shard(std::string_view bytes, const std::string& where);

/// Indexes the local shard at `path`, reading its headers (mapped), not its
/// data. Throws ShardError as index_shard does, or when it cannot be opened.
ShardIndex index_local_shard(const std::string& path);

/// The path of `shard`'s index: `shard` + ".idx".
std::string index_path(const std::string& shard);

/// The sample whose members (a range that index_shard recorded) are `bytes`,
/// which `owner` keeps alive; its fields view them. Throws ShardError naming
/// `where` when they are not one sample's members (a stale index, a corrupt
/// shard).
Sample parse_sample(std::string_view bytes, std::shared_ptr<const void> owner,
                    const std::string& where);

/// Local shard paths named by `spec`: one path, brace ranges and lists
/// ("train-{000000..000146}.tar", "{a,b}.tar"), glob patterns in the last
/// component ("data/*.tar"), and several of those separated by spaces.
/// Ranges keep their width; globs are sorted. s3:// specs are kept as
/// written, brace ranges expanded. Throws std::invalid_argument for an empty
/// spec, a malformed brace, or a glob that matches nothing.
std::vector<std::string> expand_shards(const std::string& spec);

/// Options of ShardWriter.
struct ShardWriterOptions {
  /// A shard is closed once it holds this many samples (0: no limit).
  uint64_t max_samples = 0;
  /// ... or once this many bytes (tar headers included; at least one sample
  /// goes into each shard whatever its size).
  uint64_t max_bytes = uint64_t{256} << 20;
};

/// Writes samples into numbered shards, each with its index: Python's
/// webdataset.ShardWriter's files. `pattern` holds one printf integer
/// conversion for the shard's number ("out/train-%06d.tar"). Each shard is
/// written under a temporary name and renamed once whole, with its index
/// written first: a crash leaves no shard that looks whole.
class ShardWriter {
 public:
  /// Throws std::invalid_argument for a pattern without exactly one integer
  /// conversion, or options that allow no sample.
  explicit ShardWriter(std::string pattern, ShardWriterOptions options = {});
  ~ShardWriter();  // closes the open shard; errors there are dropped: call close()
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  /// Adds a sample. `key` is a relative path without a dot in its last
  /// component; each field's name is an extension ("jpg", "cls"). Throws
  /// std::invalid_argument for a bad key or name, or two fields of one name;
  /// ShardError when a file cannot be written (a full disk), naming it.
  void write(const std::string& key,
             const std::vector<std::pair<std::string, std::string>>& fields);
  /// Finishes the open shard. Returns every shard written, in order.
  std::vector<std::string> close();

 private:
  struct Open;
  void finish();

  std::string pattern_;
  ShardWriterOptions options_;
  std::unique_ptr<Open> open_;
  std::vector<std::string> written_;
};

/// A shard's bytes by range: a local file, or an object read through the
/// run's storage. Reads may come from several threads at once.
class ShardSource {
 public:
  virtual ~ShardSource() = default;
  virtual uint64_t size() const = 0;
  /// `length` bytes at `offset` into `out`. Throws ShardError when they
  /// cannot all be read (the shard shrank or is gone, a read failed).
  virtual void read(uint64_t offset, uint64_t length, char* out) const = 0;
  /// The same, as a string.
  std::string read(uint64_t offset, uint64_t length) const {
    std::string bytes(length, '\0');
    read(offset, length, bytes.data());
    return bytes;
  }
  /// Whether reads go over a network (and are worth gathering into chunks).
  virtual bool remote() const { return false; }
  /// Says that the `length` bytes at `offset` will be read soon: a local file
  /// starts reading them from the disk, in one sequential read, at once.
  virtual void will_need(uint64_t /*offset*/, uint64_t /*length*/) const {}
};

/// Opens a shard that is not a local path (s3://): its source, or nullptr
/// when there is no such object. Throws ShardError when it cannot tell.
using ShardOpener = std::function<std::unique_ptr<ShardSource>(const std::string& url)>;

/// Reads samples of shards by their index (reads from any thread at once).
/// A local shard without an index is indexed when opened, and the index
/// written beside it where the directory allows; one in object storage needs
/// its index object ("<shard>.idx") beside it.
class ShardReader {
 public:
  /// Opens every shard of `spec` (expand_shards); `opener` opens those that
  /// are not local paths (none given: they are refused). Throws ShardError
  /// for a missing shard, a corrupt one, or an index that does not match it.
  explicit ShardReader(const std::string& spec, ShardOpener opener = nullptr);
  ~ShardReader();
  ShardReader(ShardReader&&) noexcept;
  ShardReader& operator=(ShardReader&&) noexcept;

  /// The shards' paths, and how many samples each holds.
  const std::vector<std::string>& shards() const;
  const std::vector<uint64_t>& counts() const;
  /// All samples, and their bytes (tar headers included).
  uint64_t size() const { return size_; }
  uint64_t bytes() const { return bytes_; }
  /// Whether some shard is read over a network.
  bool remote() const { return remote_; }
  /// Sample `index` of the dataset (the shards' samples one after the other).
  /// Throws std::out_of_range past the end, ShardError for a sample that cannot
  /// be read, naming the shard and the sample.
  Sample read(uint64_t index) const;
  /// Its shard and its index in that shard.
  std::pair<size_t, uint64_t> locate(uint64_t index) const;
  /// Where sample `local` of shard `shard` lies: its offset and bytes.
  std::pair<uint64_t, uint64_t> extent(size_t shard, uint64_t local) const;
  /// The source of shard `shard`.
  const ShardSource& source(size_t shard) const;

  struct Shard;  // a source and its index

 private:
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<std::string> paths_;
  std::vector<uint64_t> counts_;
  std::vector<uint64_t> starts_;  // each shard's first sample
  uint64_t size_ = 0;
  uint64_t bytes_ = 0;
  bool remote_ = false;
};

}  // namespace train

#pragma once

// The tar format as WebDataset shards use it (POSIX ustar, with pax and GNU
// long-name headers read), by hand: a member is a 512-byte header, its data,
// and zeros to the next 512-byte boundary; two zero blocks end the archive.
// Pure functions over bytes; no I/O.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace train::shards {

constexpr size_t kTarBlock = 512;

/// A tar file that is not one, or not the one an index describes.
class TarError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One header block, parsed. `kind` is the type flag ('0' for a file).
struct TarHeader {
  std::string name;  // prefix/name joined
  uint64_t size = 0;
  char kind = '0';
  bool end = false;  // a zero block: the archive's end
};

/// Parses the header block at `block` (kTarBlock bytes). Throws TarError when
/// its checksum or a number in it is wrong.
TarHeader parse_header(std::string_view block);

/// A pax extended header's path record (its other records are ignored), or
/// none. Throws TarError for a malformed record.
std::optional<std::string> pax_path(std::string_view data);

/// Bytes from `size` to the next block boundary.
constexpr uint64_t padded(uint64_t size) { return (size + kTarBlock - 1) / kTarBlock * kTarBlock; }

/// The header block of a regular file `name` of `size` bytes, and before it a
/// pax header when the name does not fit ustar's fields. Owner root, mode 0644,
/// mtime 0: the same input gives the same bytes.
std::string file_header(const std::string& name, uint64_t size);

/// What ends an archive: two zero blocks.
std::string end_of_archive();

/// WebDataset's split of a member's path into a sample key and a field name:
/// the key is the path up to the first dot of its last component, the field
/// what follows, lowercased. None for a path without a field (no dot), or a
/// top-level "__name__" metadata file.
std::optional<std::pair<std::string, std::string>> split_key(const std::string& path);

}  // namespace train::shards

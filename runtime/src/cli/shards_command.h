#pragma once

// `trainrun pack` and `trainrun index`: shards from a directory of files, and
// indexes for shards written elsewhere (docs/data.md).

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

namespace trainrun {

struct PackOptions {
  std::filesystem::path source;  // files, or one folder of files per class
  std::string pattern;           // "out/train-%06d.tar"
  uint64_t shard_bytes = uint64_t{256} << 20;
  uint64_t shard_samples = 0;  // 0: no limit
};

/// Packs `options.source` into shards: each file a field of the sample named
/// by its path without extensions; a file inside a folder gets that folder's
/// class (its index among the folders, sorted) as a "cls" field, and the
/// class names are written to classes.txt beside the shards. Samples go in
/// key order. Returns the shards written; `out` gets one line of summary.
/// Throws UsageError for a source that is not a directory or holds no file.
std::vector<std::string> pack_directory(const PackOptions& options, std::ostream& out);

/// Indexes each shard of `specs` (local paths, globs, brace ranges), writing
/// "<shard>.idx" beside it; one line per shard to `out`. Throws on the first
/// shard that is not a tar file.
void index_shards(const std::vector<std::string>& specs, std::ostream& out);

/// "256M", "1G", "4096": bytes. Throws UsageError for anything else.
uint64_t parse_bytes(const std::string& text);

}  // namespace trainrun

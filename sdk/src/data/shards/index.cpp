// The index of a shard, and a sample's members read from its bytes.

#include <train/shard_files.h>

#include "data/shards/tar.h"

#include <algorithm>
#include <cstring>

namespace train {
namespace {

constexpr std::string_view kIndexMagic = "TRSHIDX1";  // 8 bytes
constexpr size_t kIndexHeader = 24;                   // magic, shard bytes, count
constexpr size_t kIndexEntry = 16;                    // offset, bytes

void put_u64(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(value >> (8 * i) & 0xff));
}

uint64_t get_u64(const char* in) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = value << 8 | static_cast<unsigned char>(in[i]);
  return value;
}

// One member walked over: its path (a pax or GNU long name applied), where its
// data lies, and where the next header starts.
struct Member {
  std::string path;
  char kind = '0';
  uint64_t begin = 0;  // of its first header
  uint64_t data = 0;
  uint64_t size = 0;
  uint64_t next = 0;
};

// The next member at `at` that is a file or the archive's end (none). Where
// `bytes` are a whole shard (`whole`), they must end with tar's end blocks; a
// sample's range ends with its last member.
std::optional<Member> next_member(std::string_view bytes, uint64_t at, const std::string& where,
                                  bool whole = false) {
  Member member;
  member.begin = at;
  std::optional<std::string> long_name;
  for (;;) {
    if (at == bytes.size()) {
      if (!whole) return std::nullopt;
      throw ShardError(where + (bytes.empty() ? ": empty (0 bytes)"
                                              : ": truncated (it ends at byte " +
                                                    std::to_string(at) +
                                                    " without tar's end-of-archive blocks)"));
    }
    if (at == 0 && bytes.size() < shards::kTarBlock) {
      throw ShardError(where + ": not a tar file (" + std::to_string(bytes.size()) +
                       " bytes, less than one tar header)");
    }
    if (bytes.size() - at < shards::kTarBlock) {
      throw ShardError(where + ": truncated (a tar header is cut short at byte " +
                       std::to_string(at) + ")");
    }
    shards::TarHeader header;
    try {
      header = shards::parse_header(bytes.substr(at, shards::kTarBlock));
    } catch (const shards::TarError& error) {
      throw ShardError(where + ": corrupt at byte " + std::to_string(at) + ": " + error.what());
    }
    if (header.end) return std::nullopt;
    const uint64_t data = at + shards::kTarBlock;
    if (header.size > bytes.size() - data) {
      throw ShardError(where + ": truncated (member " + header.name + " needs " +
                       std::to_string(header.size) + " bytes at byte " + std::to_string(data) +
                       ", " + std::to_string(bytes.size() - data) + " are left)");
    }
    const uint64_t next = data + std::min<uint64_t>(shards::padded(header.size),
                                                    bytes.size() - data);
    if (header.kind == 'x' || header.kind == 'L') {
      const auto text = bytes.substr(data, header.size);
      try {
        long_name = header.kind == 'L' ? std::string(text.substr(0, text.find('\0')))
                                       : shards::pax_path(text);
      } catch (const shards::TarError& error) {
        throw ShardError(where + ": corrupt at byte " + std::to_string(at) + ": " + error.what());
      }
      at = next;
      continue;
    }
    if (header.kind == 'g') {  // global pax: nothing a sample needs
      at = next;
      member.begin = at;
      continue;
    }
    member.path = long_name.value_or(header.name);
    member.kind = header.kind;
    member.data = data;
    member.size = header.size;
    member.next = next;
    return member;
  }
}

bool is_file(char kind) { return kind == '0' || kind == '7'; }

}  // namespace

const std::string_view* Sample::find(std::string_view name) const {
  for (const auto& [field, bytes] : fields) {
    if (field == name) return &bytes;
  }
  return nullptr;
}

std::string_view Sample::at(std::string_view name) const {
  if (const auto* bytes = find(name)) return *bytes;
  std::string have;
  for (const auto& field : fields) have += (have.empty() ? "" : ", ") + field.first;
  throw ShardError("sample " + key + " has no field '" + std::string(name) + "' (it has: " +
                   (have.empty() ? "none" : have) + ")");
}

std::string ShardIndex::serialize() const {
  std::string out(kIndexMagic);
  put_u64(out, shard_bytes);
  put_u64(out, samples.size());
  for (const auto& [offset, bytes] : samples) {
    put_u64(out, offset);
    put_u64(out, bytes);
  }
  return out;
}

ShardIndex ShardIndex::parse(std::string_view bytes, const std::string& where) {
  if (bytes.size() < kIndexHeader || bytes.substr(0, kIndexMagic.size()) != kIndexMagic) {
    throw ShardError(where + ": not a trainrun shard index");
  }
  ShardIndex index;
  index.shard_bytes = get_u64(bytes.data() + 8);
  const uint64_t count = get_u64(bytes.data() + 16);
  if (count > (bytes.size() - kIndexHeader) / kIndexEntry ||
      bytes.size() != kIndexHeader + count * kIndexEntry) {
    throw ShardError(where + ": holds " + std::to_string(bytes.size()) + " bytes, not the " +
                     "header and the " + std::to_string(count) + " entries it announces");
  }
  index.samples.reserve(count);
  uint64_t end = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const char* entry = bytes.data() + kIndexHeader + i * kIndexEntry;
    const uint64_t offset = get_u64(entry), length = get_u64(entry + 8);
    if (offset < end || length < shards::kTarBlock || length > index.shard_bytes - offset ||
        offset > index.shard_bytes) {
      throw ShardError(where + ": sample " + std::to_string(i) +
                       " lies out of order or past the shard's end");
    }
    end = offset + length;
    index.samples.emplace_back(offset, length);
  }
  return index;
}

ShardIndex index_shard(std::string_view bytes, const std::string& where) {
  ShardIndex index;
  index.shard_bytes = bytes.size();
  std::string key;
  std::vector<std::string> fields;  // of the sample being grouped
  uint64_t at = 0;
  while (auto member = next_member(bytes, at, where, /*whole=*/true)) {
    at = member->next;
    if (!is_file(member->kind)) continue;
    auto split = shards::split_key(member->path);
    if (!split) continue;
    auto& [member_key, field] = *split;
    if (index.samples.empty() || member_key != key) {
      key = member_key;
      fields.clear();
      index.samples.emplace_back(member->begin, 0);
    } else if (std::find(fields.begin(), fields.end(), field) != fields.end()) {
      throw ShardError(where + ": sample " + key + " has field '" + field + "' twice");
    }
    fields.push_back(field);
    index.samples.back().second = member->next - index.samples.back().first;
  }
  return index;
}

std::string index_path(const std::string& shard) { return shard + ".idx"; }

Sample parse_sample(std::string_view bytes, std::shared_ptr<const void> owner,
                    const std::string& where) {
  Sample sample;
  uint64_t at = 0;
  while (auto member = next_member(bytes, at, where)) {
    at = member->next;
    if (!is_file(member->kind)) continue;
    auto split = shards::split_key(member->path);
    if (!split) continue;
    if (sample.fields.empty()) {
      sample.key = split->first;
    } else if (split->first != sample.key) {
      throw ShardError(where + ": the index's sample " + sample.key + " runs into sample " +
                       split->first + " (a stale index: run `trainrun index` on the shard)");
    }
    if (sample.find(split->second) != nullptr) {
      throw ShardError(where + ": sample " + sample.key + " has field '" + split->second +
                       "' twice");
    }
    sample.fields.emplace_back(std::move(split->second), bytes.substr(member->data, member->size));
  }
  if (sample.fields.empty()) {
    throw ShardError(where + ": no sample where the index points (a stale index: run "
                     "`trainrun index` on the shard)");
  }
  sample.data = std::move(owner);
  return sample;
}

}  // namespace train

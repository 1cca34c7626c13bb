#include "cli/shards_command.h"

#include <train/shard_files.h>
#include <trainrun/error.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>

namespace trainrun {
namespace {

namespace fs = std::filesystem;

std::string read_whole(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot read " + path.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) throw IoError("cannot read " + path.string());
  return bytes.str();
}

}  // namespace

uint64_t parse_bytes(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::string unit = text.substr(digits);
  uint64_t scale = 1;
  if (unit == "K" || unit == "k") scale = uint64_t{1} << 10;
  else if (unit == "M") scale = uint64_t{1} << 20;
  else if (unit == "G") scale = uint64_t{1} << 30;
  else if (!unit.empty()) digits = 0;
  if (digits == 0 || digits > 12) {
    throw UsageError("'" + text + "' is not a size (bytes, or a number with K, M or G)");
  }
  const uint64_t value = std::stoull(text.substr(0, digits)) * scale;
  if (value == 0) throw UsageError("a shard size of 0 holds nothing");
  return value;
}

std::vector<std::string> pack_directory(const PackOptions& options, std::ostream& out) {
  std::error_code error;
  if (!fs::is_directory(options.source, error)) {
    throw UsageError("pack: " + options.source.string() + " is not a directory");
  }
  // Every file by the sample it belongs to (its path up to the first dot of its
  // name) and its field (what follows).
  std::map<std::string, std::map<std::string, fs::path>> samples;
  std::map<std::string, int64_t> classes;  // folder name -> index, once sorted
  for (auto it = fs::recursive_directory_iterator(options.source); it != fs::end(it); ++it) {
    if (!it->is_regular_file()) continue;
    const auto relative = fs::relative(it->path(), options.source).generic_string();
    const auto slash = relative.rfind('/');
    const auto name_start = slash == std::string::npos ? 0 : slash + 1;
    const auto dot = relative.find('.', name_start);
    if (dot == std::string::npos || dot == name_start || dot + 1 == relative.size()) continue;
    std::string field = relative.substr(dot + 1);
    std::transform(field.begin(), field.end(), field.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (field == "cls" || field == "idx") continue;  // ours to write
    auto& fields = samples[relative.substr(0, dot)];
    if (!fields.emplace(field, it->path()).second) {
      throw UsageError("pack: " + it->path().string() + " and " + fields[field].string() +
                       " would be one field of one sample (names that differ only in case)");
    }
    if (slash != std::string::npos) classes.emplace(relative.substr(0, relative.find('/')), 0);
  }
  if (samples.empty()) {
    throw UsageError("pack: " + options.source.string() + " holds no file with an extension");
  }
  int64_t next = 0;
  for (auto& [name, index] : classes) index = next++;
  train::ShardWriterOptions writer_options;
  writer_options.max_bytes = options.shard_bytes;
  writer_options.max_samples = options.shard_samples;
  train::ShardWriter writer(options.pattern, writer_options);
  for (const auto& [key, fields] : samples) {
    std::vector<std::pair<std::string, std::string>> members;
    for (const auto& [field, path] : fields) members.emplace_back(field, read_whole(path));
    if (const auto slash = key.find('/'); slash != std::string::npos) {
      members.emplace_back("cls", std::to_string(classes.at(key.substr(0, slash))));
    }
    try {
      writer.write(key, members);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("pack: ") + e.what());
    }
  }
  auto shards = writer.close();
  if (!classes.empty()) {
    const auto list = fs::path(shards.front()).parent_path() / "classes.txt";
    std::ofstream names(list);
    for (const auto& [name, index] : classes) names << name << "\n";
    if (!names.flush()) throw IoError("cannot write " + list.string());
  }
  out << "packed " << samples.size() << " samples";
  if (!classes.empty()) out << " of " << classes.size() << " classes";
  out << " into " << shards.size() << " shard" << (shards.size() == 1 ? "" : "s") << ": "
      << shards.front();
  if (shards.size() > 1) out << " .. " << shards.back();
  out << "\n";
  return shards;
}

void index_shards(const std::vector<std::string>& specs, std::ostream& out) {
  for (const auto& spec : specs) {
    std::vector<std::string> paths;
    try {
      paths = train::expand_shards(spec);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("index: ") + e.what());
    }
    for (const auto& path : paths) {
      if (path.rfind("s3://", 0) == 0) {
        throw UsageError("index: " + path + ": index s3:// shards where they were written, "
                         "then upload the .idx files beside them");
      }
      const auto index = train::index_local_shard(path);
      const auto target = train::index_path(path);
      const auto temporary = target + ".partial";
      {
        std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
        file << index.serialize();
        if (!file.flush()) throw IoError("cannot write " + temporary);
      }
      fs::rename(temporary, target);
      out << "indexed " << path << ": " << index.samples.size() << " samples\n";
    }
  }
}

}  // namespace trainrun

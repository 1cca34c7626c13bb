// Shard specs: brace ranges and lists, globs, several separated by spaces.

#include <train/shard_files.h>

#include <glob.h>

#include <algorithm>
#include <sstream>

namespace train {
namespace {

constexpr size_t kMaxExpanded = 10'000'000;  // paths one spec may name

uint64_t parse_bound(const std::string& text, const std::string& spec) {
  if (text.empty() || text.size() > 18 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    throw std::invalid_argument("shard spec '" + spec + "': '" + text +
                                "' is not a range bound (digits only)");
  }
  return std::stoull(text);
}

// The first brace group of `pattern` expanded, recursively.
void expand_braces(const std::string& pattern, const std::string& spec,
                   std::vector<std::string>& out) {
  const auto open = pattern.find('{');
  if (open == std::string::npos) {
    if (pattern.find('}') != std::string::npos) {
      throw std::invalid_argument("shard spec '" + spec + "': a '}' without its '{'");
    }
    if (out.size() >= kMaxExpanded) {
      throw std::invalid_argument("shard spec '" + spec + "' names more than " +
                                  std::to_string(kMaxExpanded) + " shards");
    }
    out.push_back(pattern);
    return;
  }
  const auto close = pattern.find('}', open);
  if (close == std::string::npos || pattern.find('{', open + 1) < close) {
    throw std::invalid_argument("shard spec '" + spec + "': a '{' without its '}'");
  }
  const std::string head = pattern.substr(0, open), tail = pattern.substr(close + 1);
  const std::string body = pattern.substr(open + 1, close - open - 1);
  if (const auto dots = body.find(".."); dots != std::string::npos) {
    const std::string first = body.substr(0, dots), last = body.substr(dots + 2);
    const uint64_t low = parse_bound(first, spec), high = parse_bound(last, spec);
    if (high < low) {
      throw std::invalid_argument("shard spec '" + spec + "': the range {" + body +
                                  "} runs backwards");
    }
    if (high - low >= kMaxExpanded) {
      throw std::invalid_argument("shard spec '" + spec + "' names more than " +
                                  std::to_string(kMaxExpanded) + " shards");
    }
    // Zero-padded to the first bound's width, as WebDataset's braceexpand does.
    const size_t width = first.size() > 1 && first[0] == '0' ? first.size() : 0;
    for (uint64_t n = low; n <= high; ++n) {
      std::string number = std::to_string(n);
      if (number.size() < width) number.insert(0, width - number.size(), '0');
      expand_braces(head + number + tail, spec, out);
    }
    return;
  }
  std::stringstream items(body);
  std::string item;
  bool any = false;
  while (std::getline(items, item, ',')) {
    any = true;
    expand_braces(head + item + tail, spec, out);
  }
  if (!any) throw std::invalid_argument("shard spec '" + spec + "': an empty '{}'");
}

}  // namespace

std::vector<std::string> expand_shards(const std::string& spec) {
  std::vector<std::string> paths;
  std::stringstream words(spec);
  std::string word;
  while (words >> word) {
    std::vector<std::string> expanded;
    expand_braces(word, spec, expanded);
    for (auto& path : expanded) {
      const bool remote = path.rfind("s3://", 0) == 0;
      if (remote || path.find_first_of("*?[") == std::string::npos) {
        paths.push_back(std::move(path));
        continue;
      }
      glob_t matches{};
      const int status = ::glob(path.c_str(), GLOB_ERR, nullptr, &matches);
      std::vector<std::string> found(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
      ::globfree(&matches);
      if (status != 0 || found.empty()) {
        throw std::invalid_argument("shard spec '" + spec + "': '" + path + "' matches no file");
      }
      std::sort(found.begin(), found.end());
      for (auto& match : found) {
        if (match.size() > 4 && match.compare(match.size() - 4, 4, ".idx") == 0) continue;
        paths.push_back(std::move(match));
      }
    }
  }
  if (paths.empty()) throw std::invalid_argument("an empty shard spec names no shard");
  return paths;
}

}  // namespace train

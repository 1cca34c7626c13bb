#include "data/shards/tar.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace train::shards {
namespace {

// A numeric field: octal digits, padded with spaces or NULs, or GNU's base-256
// (high bit of the first byte set) for sizes past 8 GiB.
uint64_t parse_number(std::string_view field, const char* what) {
  if (!field.empty() && (static_cast<unsigned char>(field[0]) & 0x80) != 0) {
    uint64_t value = static_cast<unsigned char>(field[0]) & 0x7f;
    for (size_t i = 1; i < field.size(); ++i) {
      if (value >> 56 != 0) throw TarError(std::string("a tar header's ") + what + " overflows");
      value = value << 8 | static_cast<unsigned char>(field[i]);
    }
    return value;
  }
  uint64_t value = 0;
  size_t i = 0;
  while (i < field.size() && (field[i] == ' ' || field[i] == '\0')) ++i;
  bool digits = false;
  for (; i < field.size() && field[i] >= '0' && field[i] <= '7'; ++i) {
    if (value >> 61 != 0) throw TarError(std::string("a tar header's ") + what + " overflows");
    value = value * 8 + static_cast<uint64_t>(field[i] - '0');
    digits = true;
  }
  for (; i < field.size(); ++i) {
    if (field[i] != ' ' && field[i] != '\0') {
      throw TarError(std::string("a tar header's ") + what + " is not a number");
    }
  }
  if (!digits && what == std::string_view("checksum")) {
    throw TarError("a tar header has no checksum");
  }
  return value;
}

std::string_view c_string(std::string_view field) {
  return field.substr(0, std::min(field.find('\0'), field.size()));
}

void put_octal(char* field, size_t width, uint64_t value) {
  // width - 1 digits and a NUL, as ustar writes them.
  for (size_t i = width - 1; i-- > 0;) {
    field[i] = static_cast<char>('0' + (value & 7));
    value >>= 3;
  }
  field[width - 1] = '\0';
}

std::string header_block(const std::string& name, uint64_t size, char kind) {
  std::string block(kTarBlock, '\0');
  char* h = block.data();
  std::memcpy(h, name.data(), std::min<size_t>(name.size(), 100));
  put_octal(h + 100, 8, 0644);
  put_octal(h + 108, 8, 0);
  put_octal(h + 116, 8, 0);
  if (size < (uint64_t{1} << 33)) {
    put_octal(h + 124, 12, size);
  } else {  // base-256
    h[124] = static_cast<char>(0x80);
    for (int i = 11; i >= 1; --i, size >>= 8) h[124 + i] = static_cast<char>(size & 0xff);
  }
  put_octal(h + 136, 12, 0);
  h[156] = kind;
  std::memcpy(h + 257, "ustar", 6);
  std::memcpy(h + 263, "00", 2);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (char c : block) sum += static_cast<unsigned char>(c);
  put_octal(h + 148, 7, sum);
  h[155] = ' ';
  return block;
}

}  // namespace

TarHeader parse_header(std::string_view block) {
  if (block.size() != kTarBlock) throw TarError("a tar header is cut short");
  TarHeader header;
  const auto* bytes = reinterpret_cast<const unsigned char*>(block.data());
  // The sum of the block with the checksum field as spaces, in loops the
  // compiler vectorises: this runs for every member read.
  uint64_t unsigned_sum = 8 * ' ';
  for (size_t i = 0; i < 148; ++i) unsigned_sum += bytes[i];
  for (size_t i = 156; i < kTarBlock; ++i) unsigned_sum += bytes[i];
  if (unsigned_sum == 8 * ' ' &&
      std::all_of(block.begin() + 148, block.begin() + 156, [](char c) { return c == '\0'; })) {
    header.end = true;  // a zero block
    return header;
  }
  const uint64_t recorded = parse_number(block.substr(148, 8), "checksum");
  if (recorded != unsigned_sum) {
    // Old writers summed signed chars.
    int64_t signed_sum = 8 * ' ';
    for (size_t i = 0; i < kTarBlock; ++i) {
      if (i < 148 || i >= 156) signed_sum += static_cast<signed char>(bytes[i]);
    }
    if (static_cast<int64_t>(recorded) != signed_sum) {
      throw TarError("a tar header's checksum does not match (not a tar file, or not at a header)");
    }
  }
  header.size = parse_number(block.substr(124, 12), "size");
  header.kind = block[156] == '\0' ? '0' : block[156];
  std::string name(c_string(block.substr(0, 100)));
  if (block.substr(257, 5) == "ustar") {
    const auto prefix = c_string(block.substr(345, 155));
    if (!prefix.empty()) name = std::string(prefix) + "/" + name;
  }
  header.name = std::move(name);
  return header;
}

std::optional<std::string> pax_path(std::string_view data) {
  std::optional<std::string> path;
  while (!data.empty()) {
    // "<length> <key>=<value>\n", the length counting the whole record.
    const auto space = data.find(' ');
    if (space == std::string_view::npos || space == 0 || space > 20) {
      throw TarError("a pax header record has no length");
    }
    uint64_t length = 0;
    for (size_t i = 0; i < space; ++i) {
      if (!std::isdigit(static_cast<unsigned char>(data[i]))) {
        throw TarError("a pax header record's length is not a number");
      }
      length = length * 10 + static_cast<uint64_t>(data[i] - '0');
    }
    if (length <= space + 1 || length > data.size() || data[length - 1] != '\n') {
      throw TarError("a pax header record's length is wrong");
    }
    const auto record = data.substr(space + 1, length - space - 2);
    const auto equals = record.find('=');
    if (equals == std::string_view::npos) throw TarError("a pax header record has no '='");
    if (record.substr(0, equals) == "path") path = std::string(record.substr(equals + 1));
    data.remove_prefix(length);
  }
  return path;
}

std::string file_header(const std::string& name, uint64_t size) {
  if (name.size() <= 100) return header_block(name, size, '0');
  // A pax header carries the long path; the ustar name holds its start.
  std::string record = " path=" + name + "\n";
  size_t length = record.size();
  for (size_t digits = 1;; ++digits) {  // the length counts its own digits
    const size_t total = record.size() + digits;
    if (std::to_string(total).size() == digits) {
      length = total;
      break;
    }
  }
  record = std::to_string(length) + record;
  std::string out = header_block("././@PaxHeader", record.size(), 'x');
  out += record;
  out.resize(out.size() + padded(record.size()) - record.size(), '\0');
  out += header_block(name.substr(0, 100), size, '0');
  return out;
}

std::string end_of_archive() { return std::string(2 * kTarBlock, '\0'); }

std::optional<std::pair<std::string, std::string>> split_key(const std::string& path) {
  const auto slash = path.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  if (slash == std::string::npos && path.size() > 4 && path.compare(0, 2, "__") == 0 &&
      path.compare(path.size() - 2, 2, "__") == 0) {
    return std::nullopt;
  }
  const auto dot = path.find('.', base);
  if (dot == std::string::npos || dot == base || dot + 1 == path.size()) return std::nullopt;
  std::string field = path.substr(dot + 1);
  std::transform(field.begin(), field.end(), field.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::make_pair(path.substr(0, dot), std::move(field));
}

}  // namespace train::shards

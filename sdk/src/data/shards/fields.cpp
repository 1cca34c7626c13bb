// Fields WebDataset writes, as tensors: .npy, torch.save's .pt, .cls text.

#include <train/shards.h>

#include <torch/serialize.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <regex>
#include <sstream>

namespace train {
namespace {

constexpr uint64_t kMaxNpyHeader = 10000;

struct NpyType {
  const char* descr;
  torch::ScalarType type;
};
// Little-endian ('<'), or a single byte ('|').
constexpr NpyType kNpyTypes[] = {
    {"|b1", torch::kBool},   {"|u1", torch::kUInt8},  {"|i1", torch::kInt8},
    {"<i2", torch::kInt16},  {"<i4", torch::kInt32},  {"<i8", torch::kInt64},
    {"<f2", torch::kHalf},   {"<f4", torch::kFloat},  {"<f8", torch::kDouble},
    {"<u1", torch::kUInt8},  {"<b1", torch::kBool},   {"<i1", torch::kInt8},
};

}  // namespace

torch::Tensor npy_tensor(std::string_view bytes) {
  // "\x93NUMPY", major, minor, the header's length (2 bytes in 1.0, 4 after),
  // a Python dict literal, then the data.
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) {
    throw ShardError("an npy field does not start with numpy's magic");
  }
  const auto major = static_cast<unsigned char>(bytes[6]);
  if (major < 1 || major > 3) {
    throw ShardError("an npy field has format version " + std::to_string(major) +
                     " (1 to 3 are read)");
  }
  const size_t width = major == 1 ? 2 : 4;
  if (bytes.size() < 8 + width) throw ShardError("an npy field is cut short in its header");
  uint64_t header_length = 0;
  for (size_t i = width; i-- > 0;) {
    header_length = header_length << 8 | static_cast<unsigned char>(bytes[8 + i]);
  }
  // numpy refuses headers past 10000 bytes unless told otherwise; so does
  // this, before any pattern runs over one.
  if (header_length > kMaxNpyHeader) {
    throw ShardError("an npy field's header has " + std::to_string(header_length) +
                     " bytes (at most " + std::to_string(kMaxNpyHeader) + " are read)");
  }
  const size_t data_start = 8 + width + header_length;
  if (data_start > bytes.size()) throw ShardError("an npy field is cut short in its header");
  const std::string header(bytes.substr(8 + width, header_length));
  static const std::regex descr_pattern(R"('descr'\s*:\s*'([^']*)')");
  static const std::regex fortran_pattern(R"('fortran_order'\s*:\s*True)");
  static const std::regex shape_pattern(R"('shape'\s*:\s*\(([0-9, ]*)\))");
  std::smatch match;
  if (!std::regex_search(header, match, descr_pattern)) {
    throw ShardError("an npy field's header has no descr");
  }
  const std::string descr = match[1];
  if (std::regex_search(header, fortran_pattern)) {
    throw ShardError("an npy field is in Fortran order (write it with C order)");
  }
  if (!std::regex_search(header, match, shape_pattern)) {
    throw ShardError("an npy field's header has no shape of whole numbers");
  }
  std::vector<int64_t> shape;
  const std::string dims = match[1];
  std::stringstream parts(dims);
  for (std::string part; std::getline(parts, part, ',');) {
    part.erase(std::remove(part.begin(), part.end(), ' '), part.end());
    if (part.empty()) continue;  // "(5,)"
    if (part.size() > 12) throw ShardError("an npy field's shape is too large");
    shape.push_back(std::stoll(part));
  }
  const NpyType* type = nullptr;
  for (const auto& candidate : kNpyTypes) {
    if (descr == candidate.descr) type = &candidate;
  }
  if (type == nullptr) {
    throw ShardError("an npy field holds dtype '" + descr +
                     "' (little-endian bool, integers and floats are read)");
  }
  uint64_t elements = 1;
  for (int64_t d : shape) {
    if (d != 0 && elements > (uint64_t{1} << 40) / static_cast<uint64_t>(d)) {
      throw ShardError("an npy field's shape is too large");
    }
    elements *= static_cast<uint64_t>(d);
  }
  const uint64_t needed = elements * c10::elementSize(type->type);
  if (bytes.size() - data_start != needed) {
    throw ShardError("an npy field of shape (" + dims + ") and dtype " + descr + " needs " +
                     std::to_string(needed) + " bytes of data, not " +
                     std::to_string(bytes.size() - data_start));
  }
  auto tensor = torch::empty(shape, torch::TensorOptions().dtype(type->type));
  if (needed > 0) std::memcpy(tensor.data_ptr(), bytes.data() + data_start, needed);
  return tensor;
}

std::string npy_bytes(const torch::Tensor& tensor) {
  const NpyType* type = nullptr;
  for (const auto& candidate : kNpyTypes) {
    if (candidate.type == tensor.scalar_type()) {
      type = &candidate;
      break;
    }
  }
  if (type == nullptr) {
    throw ShardError(std::string("npy_bytes: a tensor of ") + c10::toString(tensor.scalar_type()) +
                     " (bool, integers and floats are written)");
  }
  std::string shape;  // "2, 3"; "5," for one dimension, as Python writes a tuple
  for (int64_t i = 0; i < tensor.dim(); ++i) {
    shape += (i > 0 ? ", " : "") + std::to_string(tensor.size(i));
  }
  if (tensor.dim() == 1) shape += ",";
  std::string header = "{'descr': '" + std::string(type->descr) +
                       "', 'fortran_order': False, 'shape': (" + shape + "), }";
  // Padded with spaces and a newline to a multiple of 64 bytes, as numpy does.
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.resize(total - 10 - 1, ' ');
  header += '\n';
  const auto contiguous = tensor.cpu().contiguous();
  const size_t data = static_cast<size_t>(contiguous.numel()) * contiguous.element_size();
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(static_cast<const char*>(contiguous.data_ptr()), data);
  return out;
}

torch::Tensor pt_tensor(std::string_view bytes) {
  c10::IValue value;
  try {
    value = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& error) {
    throw ShardError(std::string("a pt field is not torch.save's bytes: ") + error.what());
  }
  if (!value.isTensor()) throw ShardError("a pt field holds " + value.tagKind() + ", not a tensor");
  return value.toTensor();
}

int64_t class_label(std::string_view bytes) {
  size_t begin = 0, end = bytes.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(bytes[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(bytes[end - 1]))) --end;
  const std::string text(bytes.substr(begin, end - begin));
  const bool negative = !text.empty() && text[0] == '-';
  const std::string digits = negative ? text.substr(1) : text;
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    throw ShardError("a cls field holds '" + text.substr(0, 40) + "', not an integer");
  }
  const int64_t value = std::stoll(digits);
  return negative ? -value : value;
}

}  // namespace train

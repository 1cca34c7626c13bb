// Shards between trainrun and Python's webdataset package (tools/setup_webdataset.sh),
// and the trainrun pack and index commands. Without the package the
// webdataset cases exit 77: skipped, never passed.

#include <train/shards.h>

#include "temp_dir.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

namespace {

namespace fs = std::filesystem;

fs::path wds_python() {
  const char* venv = std::getenv("TRAINRUN_WDS_VENV");
  return fs::path(venv != nullptr ? venv : "/opt/trainrun-wds") / "bin" / "python";
}

void require_webdataset() {
  if (!fs::exists(wds_python())) {
    std::printf("skipped: needs Python's webdataset in %s (tools/setup_webdataset.sh)\n",
                wds_python().parent_path().parent_path().c_str());
    std::fflush(stdout);
    std::_Exit(77);
  }
}

// Runs `command`, returning its exit code and what it printed (stderr too).
std::pair<int, std::string> run(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::string tool() { return wds_python().string() + " " + TEST_SOURCE_DIR "/data/wds_tool.py"; }

std::string hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// A sample as wds_tool.py prints it.
nlohmann::json describe(const train::Sample& sample) {
  nlohmann::json fields = nlohmann::json::object();
  for (const auto& [name, bytes] : sample.fields) fields[name] = hex(bytes);
  return {{"key", sample.key}, {"fields", fields}};
}

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

}  // namespace

TEST_CASE("webdataset reads trainrun's shards: every sample, its fields byte for byte") {
  require_webdataset();
  TempDir dir;
  train::ShardWriterOptions options;
  options.max_samples = 7;
  train::ShardWriter writer((dir.path / "ours-%06d.tar").string(), options);
  std::vector<nlohmann::json> expected;
  for (int i = 0; i < 20; ++i) {
    const std::string key =
        (i % 2 ? "a/" : "b/") + std::string(i == 3 ? 120 : 3, 'k') + std::to_string(i);
    const std::vector<std::pair<std::string, std::string>> fields{
        {"cls", std::to_string(i % 4)},
        {"txt", "sample " + std::to_string(i)},
        {"bin", std::string(static_cast<size_t>(i * 97), static_cast<char>(i))}};
    writer.write(key, fields);
    train::Sample sample;
    sample.key = key;
    for (const auto& [name, bytes] : fields) sample.fields.emplace_back(name, bytes);
    expected.push_back(describe(sample));
  }
  REQUIRE(writer.close().size() == 3);
  const auto [code, output] = run(tool() + " read '" + (dir.path / "ours-{000000..000002}.tar").string() + "'");
  INFO(output);
  REQUIRE(code == 0);
  CHECK(json_lines(output) == expected);
}

TEST_CASE("trainrun reads webdataset's shards, indexing them on first use") {
  require_webdataset();
  TempDir dir;
  const auto [code, output] = run(tool() + " write '" + (dir.path / "theirs-%03d.tar").string() + "' 10");
  INFO(output);
  REQUIRE(code == 0);
  const auto written = json_lines(output);
  train::ShardReader reader((dir.path / "theirs-*.tar").string());
  REQUIRE(reader.size() == written.size());
  CHECK(reader.counts() == std::vector<uint64_t>{4, 4, 2});
  for (uint64_t i = 0; i < reader.size(); ++i) {
    const auto sample = reader.read(i);
    CHECK(describe(sample) == written[i]);
    // numpy.save's array, as written.
    const auto array = train::npy_tensor(sample.at("npy"));
    CHECK(array.sizes().vec() == std::vector<int64_t>{1, static_cast<int64_t>(i % 5 + 1)});
    CHECK(torch::equal(array, torch::arange(static_cast<int64_t>(i % 5 + 1), torch::kFloat)
                                  .reshape({1, -1}) * static_cast<double>(i)));
    CHECK(train::class_label(sample.at("cls")) == static_cast<int64_t>(i % 10));
  }
  CHECK(fs::exists(dir.path / "theirs-000.tar.idx"));
}

TEST_CASE("trainrun pack makes shards of a folder per class, and trainrun index indexes others") {
  TempDir dir;
  const auto source = dir.path / "images";
  for (const char* cls : {"dog", "cat"}) {
    fs::create_directories(source / cls);
    for (int i = 0; i < 3; ++i) {
      std::ofstream(source / cls / (std::to_string(i) + ".JPG"), std::ios::binary)
          << cls << " picture " << i;
    }
  }
  std::ofstream(source / "cat" / "0.json") << "{\"note\": 1}";
  fs::create_directories(dir.path / "out");
  const auto [code, output] = run(std::string(TRAINRUN_EXE) + " pack " + source.string() + " " +
                                  (dir.path / "out" / "train-%04d.tar").string() +
                                  " --shard-samples 4");
  INFO(output);
  REQUIRE(code == 0);
  CHECK(output.find("packed 6 samples of 2 classes into 2 shards") != std::string::npos);
  std::ifstream classes(dir.path / "out" / "classes.txt");
  std::string names((std::istreambuf_iterator<char>(classes)), std::istreambuf_iterator<char>());
  CHECK(names == "cat\ndog\n");
  train::ShardReader reader((dir.path / "out" / "train-{0000..0001}.tar").string());
  REQUIRE(reader.size() == 6);
  auto first = reader.read(0);
  CHECK(first.key == "cat/0");
  CHECK(first.at("jpg") == "cat picture 0");
  CHECK(first.at("json") == "{\"note\": 1}");
  CHECK(first.at("cls") == "0");
  CHECK(reader.read(5).key == "dog/2");
  CHECK(reader.read(5).at("cls") == "1");
  // The index command writes what a first use would.
  const auto shard = (dir.path / "out" / "train-0000.tar").string();
  const auto index = train::index_path(shard);
  std::ifstream in(index, std::ios::binary);
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(index);
  const auto [index_code, index_output] =
      run(std::string(TRAINRUN_EXE) + " index '" + (dir.path / "out" / "*.tar").string() + "'");
  CHECK(index_code == 0);
  CHECK(index_output.find("indexed " + shard + ": 4 samples") != std::string::npos);
  std::ifstream again(index, std::ios::binary);
  CHECK(std::string((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>()) ==
        written);
  // Bad input: one line and exit code 2.
  const auto missing = run(std::string(TRAINRUN_EXE) + " pack " + (dir.path / "none").string() +
                           " x-%d.tar");
  CHECK(missing.first == 2);
  CHECK(missing.second == "trainrun: pack: " + (dir.path / "none").string() + " is not a directory\n");
  const auto size = run(std::string(TRAINRUN_EXE) + " pack " + source.string() +
                        " x-%d.tar --shard-size 12Q");
  CHECK(size.first == 2);
  CHECK(size.second.find("'12Q' is not a size") != std::string::npos);
  const auto not_tar = run(std::string(TRAINRUN_EXE) + " index " + (dir.path / "out" / "classes.txt").string());
  CHECK(not_tar.first == 1);
  CHECK(not_tar.second.find("classes.txt: not a tar file (8 bytes, less than one tar header)") !=
        std::string::npos);
}

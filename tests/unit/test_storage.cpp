#include <trainrun/error.h>

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "common/atomic_file.h"
#include "controller/run_storage.h"
#include "temp_dir.h"

using namespace trainrun;

namespace {

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

TEST_CASE("storage: result.jsonl gets a line per report and progress.csv grows a column") {
  TempDir tmp;
  RunStorage storage(tmp.path, "run");
  CHECK(std::filesystem::is_directory(tmp.path / "run" / "logs"));
  storage.append_result({1, 1.5, 0.5, {{"loss", 0.5}}, ""});
  storage.append_result({2, 2.5, 1.5, {{"loss", 0.25}, {"note", "a,b"}}, "", 2});
  auto lines = slurp(tmp.path / "run" / "result.jsonl");
  CHECK(std::count(lines.begin(), lines.end(), '\n') == 2);
  auto first = nlohmann::json::parse(lines.substr(0, lines.find('\n')));
  CHECK(first["metrics"]["loss"] == 0.5);
  CHECK(slurp(tmp.path / "run" / "progress.csv") ==
        "iteration,timestamp,time_total_s,attempt,loss,note\n"
        "1,1.5,0.5,1,0.5,\n"
        "2,2.5,1.5,2,0.25,\"a,b\"\n");
}

TEST_CASE("storage: atomic writes replace whole files and leave no temporary") {
  TempDir tmp;
  write_file_atomic(tmp.path / "state.json", "one");
  write_file_atomic(tmp.path / "state.json", "two");
  CHECK(slurp(tmp.path / "state.json") == "two");
  CHECK(std::distance(std::filesystem::directory_iterator(tmp.path),
                      std::filesystem::directory_iterator()) == 1);
  CHECK_THROWS_WITH_AS(write_file_atomic(tmp.path / "missing" / "x.json", "x"),
                       doctest::Contains("cannot create"), IoError);
}

TEST_CASE("storage: error.json is written and cleared") {
  TempDir tmp;
  RunStorage storage(tmp.path, "run");
  storage.write_error(RunError{FailureKind::kException, "raised: boom", 1, "h", 42});
  auto error = nlohmann::json::parse(slurp(tmp.path / "run" / "error.json"));
  CHECK(error["rank"] == 1);
  CHECK(error["kind"] == "exception");
  storage.write_error(std::nullopt);
  CHECK_FALSE(std::filesystem::exists(tmp.path / "run" / "error.json"));
}

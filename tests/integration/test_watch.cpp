// A run people can watch: progress from rank 0's prepared loader (a live
// status line on a terminal, plain lines elsewhere, none with --quiet) and the
// run directory's report.html.

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>
#include <utility>

#include "run_helpers.h"

namespace {

const std::string kEpochs = std::string("--plugin '") + TEST_PLUGIN + "' --entry epochs";

// The lines that say "progress: ...".
std::vector<std::string> progress_lines(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.find("progress: ") != std::string::npos) lines.push_back(line);
  }
  return lines;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("without a terminal, progress is a plain line every interval and nothing else") {
  Sandbox box;
  // 3 epochs of 5 batches a rank, 0.2 s a batch: 3 s of training. The
  // evaluation loader made during each batch is not the one shown.
  auto run = box.run(kEpochs + " -n 2 --name w --config epochs=3 --config sleep_ms=200 " +
                     "--config evaluate=true --progress-interval 1");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  auto lines = progress_lines(run.output);
  CHECK(lines.size() >= 2);
  std::regex shape(
      R"(\[trainrun\] progress: epoch [1-3]/3, batch [0-5]/5(, [0-9.]+ samples/s)?, elapsed [0-9]+:[0-9]{2}(, ETA [0-9]+:[0-9]{2})?)");
  for (const auto& line : lines) CHECK_MESSAGE(std::regex_match(line, shape), line);
  // 2 ranks x 1 sample / 0.2 s is about 10 samples/s; the plain line has the rate.
  bool rated = false;
  for (const auto& line : lines) rated = rated || contains(line, "samples/s");
  CHECK(rated);
  CHECK_FALSE(contains(run.output, "\x1b"));
  CHECK_FALSE(contains(run.output, "\r"));
}

TEST_CASE("--quiet and --progress-interval 0 print no progress") {
  Sandbox box;
  auto quiet = box.run(kEpochs + " -n 1 --name q --config epochs=2 --config sleep_ms=150 " +
                       "--progress-interval 1 --quiet");
  INFO(quiet.output);
  CHECK(quiet.exit_code == 0);
  CHECK(quiet.output.empty());
  auto off = box.run(kEpochs + " -n 1 --name o --config epochs=2 --config sleep_ms=150 " +
                     "--progress-interval 0");
  INFO(off.output);
  CHECK(off.exit_code == 0);
  CHECK(progress_lines(off.output).empty());
  CHECK(contains(off.output, "run finished"));
}

TEST_CASE("on a terminal, a live status line stays below the output and is gone at the end") {
  Sandbox box;
  auto run = box.run_on_terminal(kEpochs + " -n 2 --name t --config epochs=3 --config sleep_ms=200",
                                 /*columns=*/90);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  // Each status is drawn with a carriage return and an erase to the line's end.
  std::vector<std::string> statuses;
  size_t at = 0;
  while ((at = run.output.find("\r\x1b[K", at)) != std::string::npos) {
    at += 4;
    auto end = run.output.find_first_of("\r\n", at);
    auto text = run.output.substr(at, end - at);
    // An erase before an output line, or the status line itself.
    if (text.rfind("epoch ", 0) == 0) statuses.push_back(text);
  }
  REQUIRE(statuses.size() >= 3);
  std::regex shape(
      R"(epoch [1-3]/3 \[[#-]{20}\] [0-5]/5(  [0-9.]+ samples/s)?(  [a-z_]+=[^ ]+)*  [0-9]+:[0-9]{2}(  ETA [0-9]+:[0-9]{2})?)");
  for (const auto& status : statuses) {
    CHECK_MESSAGE(std::regex_match(status, shape), status);
    CHECK(status.size() <= 89);  // one short of the terminal's width
  }
  // After the first report the line shows its metrics (as many as fit).
  bool metrics = false;
  for (const auto& status : statuses) metrics = metrics || contains(status, "accuracy=");
  CHECK(metrics);
  // No plain progress lines on a terminal; the report lines scroll above.
  CHECK(progress_lines(run.output).empty());
  CHECK(contains(run.output, "report 3 ("));
  // The closing lines come after the status line was erased for good.
  auto last_erase = run.output.rfind("\r\x1b[K");
  auto finished = run.output.find("run finished");
  REQUIRE(finished != std::string::npos);
  CHECK(last_erase < finished);
}

TEST_CASE("report.html is written while the run goes on, and again by trainrun results --html") {
  Sandbox box;
  auto page = box.run_dir("h") / "report.html";
  pid_t pid = box.start(kEpochs + " -n 2 --name h --config epochs=4 --config sleep_ms=250 " +
                        "--checkpoint-score-attribute accuracy --num-to-keep 2");
  // While it runs the page reloads itself.
  bool live = false;
  for (int i = 0; i < 200 && !live; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::error_code ec;
    if (std::filesystem::exists(page, ec))
      live = contains(read_text(page), "http-equiv=\"refresh\"");
  }
  CHECK(live);
  REQUIRE(Sandbox::wait(pid) == 0);
  auto html = read_text(page);
  CHECK_FALSE(contains(html, "http-equiv=\"refresh\""));
  CHECK(contains(html, "class=\"status finished\""));
  CHECK(contains(html, " * Chart.js v"));  // inlined, not fetched
  CHECK_FALSE(contains(html, "src=\"http"));
  // The best checkpoint by accuracy is marked; the note's markup is text.
  std::regex best(R"(<tr class="best"><td>checkpoint_000003</td><td class="num">4</td>)");
  CHECK(std::regex_search(html, best));
  CHECK(contains(html, "&lt;b&gt;epoch&lt;/b&gt;"));
  CHECK_FALSE(contains(html, "<b>epoch</b>"));
  // Every numeric metric is a chart: accuracy, epoch, loss (not the text note).
  CHECK(contains(html, "id=\"chart-2\""));
  CHECK_FALSE(contains(html, "id=\"chart-3\""));

  // The same page, written again from the run directory.
  auto again = box.root() / "again.html";
  auto results =
      box.run("results '" + box.run_dir("h").string() + "' --html '" + again.string() + "'");
  INFO(results.output);
  CHECK(results.exit_code == 0);
  CHECK(read_text(again) == html);
}

TEST_CASE("a failed run's report.html shows its error") {
  Sandbox box;
  auto run = box.run(std::string("--plugin '") + TEST_PLUGIN +
                     "' --entry throws -n 2 --name f --config fail_rank=1");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  auto html = read_text(box.run_dir("f") / "report.html");
  CHECK(contains(html, "class=\"status failed\""));
  std::regex error(
      R"(<div class="error" id="error">rank 1 \([^)]*\) raised in [^<]*: boom on rank 1</div>)");
  CHECK(std::regex_search(html, error));
  CHECK(contains(html, "<pre class=\"stack\" id=\"stack\">#0 throws(train::Config const"));
  // --html on something that is not a run: a usage error, nothing written.
  auto bad = box.run("results '" + box.root().string() + "' --html '" +
                     (box.root() / "x.html").string() + "'");
  CHECK(bad.exit_code == 2);
  CHECK(contains(bad.output, "no run.json"));
  CHECK_FALSE(std::filesystem::exists(box.root() / "x.html"));
}

TEST_CASE("results --html replaces a regular file or makes a new one, and nothing else") {
  Sandbox box;
  auto run = box.run(std::string("--plugin '") + TEST_PLUGIN + "' --entry steps -n 1 --name r");
  REQUIRE(run.exit_code == 0);
  auto html_to = [&](const std::filesystem::path& target) {
    return box.run("results '" + box.run_dir("r").string() + "' --html '" + target.string() + "'");
  };
  auto root = box.root();
  std::ofstream(root / "kept.txt") << "kept";
  std::filesystem::create_symlink(root / "kept.txt", root / "link.html");
  REQUIRE(::mkfifo((root / "fifo.html").c_str(), 0600) == 0);
  std::filesystem::create_directory(root / "dir.html");
  for (auto [name, what] :
       {std::pair{"link.html", "a symbolic link"}, std::pair{"fifo.html", "a fifo"},
        std::pair{"dir.html", "a directory"}}) {
    CAPTURE(name);
    auto refused = html_to(root / name);
    CHECK(refused.exit_code == 2);
    CHECK(contains(refused.output, (root / name).string() + " is " + what));
    CHECK_FALSE(contains(refused.output, "wrote"));
  }
  CHECK(std::filesystem::is_symlink(root / "link.html"));
  CHECK(read_text(root / "kept.txt") == "kept");
  CHECK(std::filesystem::is_fifo(root / "fifo.html"));
  // A device is refused too (as root a rename would replace /dev/full itself).
  auto device = html_to("/dev/full");
  CHECK(device.exit_code == 2);
  CHECK(contains(device.output, "/dev/full is a character device"));
  CHECK(std::filesystem::is_character_file("/dev/full"));
  // A write that fails fails the command.
  auto missing = html_to(root / "no-such-dir" / "page.html");
  CHECK(missing.exit_code == 1);
  CHECK_FALSE(contains(missing.output, "wrote"));
  // A regular file is replaced, and a new path made.
  std::ofstream(root / "old.html") << "old";
  CHECK(html_to(root / "old.html").exit_code == 0);
  CHECK(contains(read_text(root / "old.html"), "<!DOCTYPE html>"));
  CHECK(html_to(root / "new.html").exit_code == 0);
  CHECK(contains(read_text(root / "new.html"), "<!DOCTYPE html>"));
}

TEST_CASE("a run writes TensorBoard events in its directory unless --no-tensorboard") {
  Sandbox box;
  auto events = [&](const std::string& name) {
    int found = 0;
    for (const auto& entry : std::filesystem::directory_iterator(box.run_dir(name))) {
      found += entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
    }
    return found;
  };
  const std::string plugin = std::string("--plugin '") + TEST_PLUGIN + "' --entry steps -n 2 ";
  REQUIRE(box.run(plugin + "--name on --config steps=3").exit_code == 0);
  CHECK(events("on") == 1);
  REQUIRE(box.run(plugin + "--name off --config steps=3 --no-tensorboard").exit_code == 0);
  CHECK(events("off") == 0);
  // (tests/tensorboard/check_run.sh reads them with TensorBoard's own reader.)
}

TEST_CASE("--profile-steps writes a Chrome trace of those steps on every rank") {
  Sandbox box;
  auto run = box.run(std::string("--plugin '") + QUICKSTART_PLUGIN +
                     "' -n 2 --name p --profile-steps 2:4 --config steps=6");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  for (const char* rank : {"rank-0.json", "rank-1.json"}) {
    CAPTURE(rank);
    auto trace = read_json(box.run_dir("p") / "profiles" / rank);
    const auto& events = trace.is_object() ? trace["traceEvents"] : trace;
    REQUIRE(events.is_array());
    int operators = 0;
    for (const auto& event : events) {
      operators += event.value("name", std::string()).rfind("aten::", 0) == 0;
    }
    CHECK(operators > 10);
  }
  auto results = box.run("results '" + box.run_dir("p").string() + "'");
  CHECK(contains(results.output, "profiles:"));
  CHECK(contains(results.output, "profiles/rank-1.json"));
  // One worker prepares no reducer: a prepared loader's batches count the steps.
  auto one = box.run(kEpochs + " -n 1 --name one --profile-steps 3:5 --config epochs=1");
  INFO(one.output);
  REQUIRE(one.exit_code == 0);
  const auto trace = read_json(box.run_dir("one") / "profiles" / "rank-0.json");
  CHECK((trace.is_object() || trace.is_array()));  // Kineto's object, or 1.13's array
  CHECK_FALSE(std::filesystem::exists(box.run_dir("one") / "profiles" / "rank-0.json.partial"));
  // Nothing that counts steps: said so, and no file.
  auto none = box.run(std::string("--plugin '") + QUICKSTART_PLUGIN +
                      "' -n 1 --name none --profile-steps 2:3 --config steps=4");
  CHECK(none.exit_code == 0);
  CHECK(contains(none.output, "no profile: steps 2 to 3 never began"));
  CHECK_FALSE(std::filesystem::exists(box.run_dir("none") / "profiles" / "rank-0.json"));
  // A range that is not one: refused before anything starts.
  for (const char* bad : {"0:3", "4:2", "3", "a:b"}) {
    CAPTURE(bad);
    auto refused = box.run(std::string("--plugin '") + QUICKSTART_PLUGIN +
                           "' -n 1 --name q --profile-steps " + bad);
    CHECK(refused.exit_code == 2);
    CHECK(contains(refused.output, "--profile-steps"));
  }
}

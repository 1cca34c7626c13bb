#include "api/console.h"

#include <spdlog/pattern_formatter.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace trainrun {
namespace {

size_t terminal_width() {
  winsize size{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

// The controller's lines, through the console.
class ConsoleSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  ConsoleSink(Console& console, bool color) : console_(console), color_(color) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    std::string text(formatted.data(), formatted.size());
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    // The controller's lines carry workers' text (metric names, error
    // messages): control characters other than tabs and newlines do nothing.
    // (C1 controls, U+0080 to U+009F, included).
    for (size_t i = 0; i < text.size(); ++i) {
      auto u = static_cast<unsigned char>(text[i]);
      if ((u < 0x20 && text[i] != '\t' && text[i] != '\n') || u == 0x7f) text[i] = '?';
      if (u == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) < 0xA0) {
        text.replace(i, 2, "?");
      }
    }
    const char* on = !color_                            ? nullptr
                     : msg.level >= spdlog::level::err  ? "\033[31m"
                     : msg.level == spdlog::level::warn ? "\033[33m"
                                                        : nullptr;
    if (on == nullptr) {
      console_.line(0, text);
    } else {
      console_.line(0, on + text + "\033[0m");
    }
  }
  void flush_() override {}

 private:
  Console& console_;
  bool color_;
};

}  // namespace

bool Console::stdout_is_terminal() {
  const char* term = std::getenv("TERM");
  return ::isatty(STDOUT_FILENO) == 1 && term != nullptr && std::strcmp(term, "dumb") != 0;
}

size_t Console::status_width() { return terminal_width() - 1; }

void Console::erase() {
  if (!shown_) return;
  std::fputs("\r\033[K", stdout);
  std::fflush(stdout);
  shown_ = false;
}

void Console::draw() {
  if (!live_ || status_.empty()) return;
  std::fputs("\r\033[K", stdout);
  std::fwrite(status_.data(), 1, status_.size(), stdout);
  std::fflush(stdout);
  shown_ = true;
  drawn_at_ = Clock::now();
}

void Console::line(int stream, std::string_view text) {
  std::lock_guard lock(mutex_);
  erase();
  std::FILE* out = stream == 0 ? stdout : stderr;
  std::fwrite(text.data(), 1, text.size(), out);
  std::fputc('\n', out);
  std::fflush(out);
  draw();
}

void Console::status(std::string text) {
  if (!live_) return;
  std::lock_guard lock(mutex_);
  status_ = std::move(text);
  if (Clock::now() - drawn_at_ >= std::chrono::milliseconds(100)) draw();
}

void Console::clear() {
  std::lock_guard lock(mutex_);
  erase();
  status_.clear();
}

std::shared_ptr<spdlog::sinks::sink> Console::sink() {
  return std::make_shared<ConsoleSink>(*this, color_);
}

}  // namespace trainrun

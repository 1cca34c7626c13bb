#include "inproc_harness.h"

#include <trainrun/error.h>

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/hash.h"

namespace trainrun::testing {
namespace {

std::atomic<int> g_runs{0};

}  // namespace

std::vector<char> encode_metrics(const nlohmann::json& metrics) {
  auto bytes = nlohmann::json::to_msgpack(metrics);
  return std::vector<char>(bytes.begin(), bytes.end());
}

Peer::Peer(zmq::context_t& context, const std::string& endpoint)
    : socket_(context, zmq::socket_type::dealer) {
  socket_.set(zmq::sockopt::linger, 0);
  protocol::connect_dealer(socket_, endpoint);
}

bool Peer::has_message(std::chrono::milliseconds wait) {
  if (!held_.empty()) return true;
  auto until = std::chrono::steady_clock::now() + wait;
  do {
    zmq::pollitem_t item{socket_.handle(), -1, ZMQ_POLLIN, 0};
    protocol::poll(&item, 1, std::chrono::milliseconds(1));
    while (true) {
      auto frames = protocol::recv_frames(socket_, true);
      if (frames.empty()) break;
      auto message = protocol::Incoming::parse(std::move(frames));
      if (message.type() != protocol::Heartbeat::kType) held_.push_back(std::move(message));
    }
    if (!held_.empty()) return true;
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

protocol::Incoming Peer::next(ManualClock* clock, Clock::duration step, const std::string& type) {
  auto until = std::chrono::steady_clock::now() + kPatience;
  while (!has_message(std::chrono::milliseconds(0))) {
    if (std::chrono::steady_clock::now() >= until) {
      throw Error("expected " + type + ", but nothing came within " +
                  std::to_string(kPatience.count()) + " s");
    }
    if (clock != nullptr) clock->advance(step);
  }
  auto message = std::move(held_.front());
  held_.erase(held_.begin());
  if (message.type() == protocol::Refused::kType && type != message.type()) {
    throw Error("expected " + type + ", got REFUSED: " + message.as<protocol::Refused>().reason);
  }
  if (message.type() != type) throw Error("expected " + type + ", got " + message.type());
  return message;
}

void ScriptedWorker::hello(int attempt, int64_t agent_pid) {
  protocol::Hello hello;
  hello.index = -1;  // a remote worker
  hello.host = host;
  hello.pid = pid;
  hello.attempt = attempt;
  hello.agent_pid = agent_pid;
  main.send(hello);
}

void ScriptedWorker::start(const protocol::Assign& assign, bool shares_storage) {
  train.emplace(context, endpoint);
  train->send(
      protocol::Attach{assign.world_rank, pid, assign.attach_secret, protocol::kTrainChannel});
  train->send(protocol::Started{assign.world_rank, shares_storage});
}

void ScriptedWorker::attach_upload(const protocol::Assign& assign) {
  upload.emplace(context, endpoint);
  upload->send(
      protocol::Attach{assign.world_rank, pid, assign.attach_secret, protocol::kUploadChannel});
}

void ScriptedWorker::report(int64_t iteration) {
  protocol::Report report;
  report.iteration = iteration;
  report.metrics = encode_metrics({{"step", iteration}});
  train->send(report);
}

InprocRun::InprocRun(const std::filesystem::path& root, TrainerOptions options)
    : endpoint_("inproc://controller-" + std::to_string(++g_runs)),
      lines_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000)) {
  if (options.run.name.empty()) options.run.name = "inproc";
  options.run.storage_path = root;
  options.scaling.local_workers = 0;
  options.network.listen = endpoint_;
  options.failure.standby = false;
  options.verbose = false;
  options.cache_dir = root / "cache";
  storage_ = std::make_unique<RunStorage>(root, options.run.name);
  checkpoints_ = std::make_unique<CheckpointStore>(storage_->dir(), options.checkpoint);
  stop_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_fd_) throw IoError("cannot create an eventfd");

  ControllerSetup setup;
  setup.options = std::move(options);
  setup.entry = "train";
  setup.plugin_bytes = std::make_shared<const std::string>("not a plugin: never fetched");
  setup.plugin_sha256 = std::string(64, '0');
  setup.log = std::make_shared<spdlog::logger>("inproc", lines_);
  setup.log->set_pattern("%v");
  setup.stop_fd = stop_fd_.get();
  setup.time = &clock_;
  setup.context = &context_;
  std::packaged_task<RunOutcome()> task([this, setup = std::move(setup)]() mutable {
    Controller controller(std::move(setup), *storage_, *checkpoints_);
    return controller.run();
  });
  outcome_ = task.get_future();
  thread_ = std::thread(std::move(task));
}

InprocRun::~InprocRun() {
  // The controller's log, to read why a scenario failed.
  if (std::getenv("TRAINRUN_TEST_LOG") != nullptr) {
    for (const auto& line : lines_->last_formatted()) std::fprintf(stderr, "| %s", line.c_str());
  }
  if (thread_.joinable()) {
    // A scenario that failed midway: the run is stopped, and its grace
    // periods passed, so that the thread ends.
    stop();
    for (int i = 0;
         i < 20000 && outcome_.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready;
         ++i) {
      clock_.advance(std::chrono::seconds(1));
    }
    thread_.join();
  }
}

void InprocRun::stop() {
  uint64_t one = 1;
  [[maybe_unused]] auto written = ::write(stop_fd_.get(), &one, sizeof(one));
}

bool InprocRun::logged(const std::string& text) const {
  for (const auto& line : lines_->last_formatted()) {
    if (line.find(text) != std::string::npos) return true;
  }
  return false;
}

bool InprocRun::wait_for_log(const std::string& text) const {
  auto until = std::chrono::steady_clock::now() + kPatience;
  while (!logged(text)) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

RunOutcome InprocRun::outcome(Clock::duration step) {
  auto until = std::chrono::steady_clock::now() + kPatience;
  while (outcome_.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready) {
    if (std::chrono::steady_clock::now() >= until) throw Error("the run did not end");
    clock_.advance(step);
  }
  thread_.join();
  return outcome_.get();
}

}  // namespace trainrun::testing

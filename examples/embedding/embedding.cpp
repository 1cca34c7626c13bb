// A host program that trains through trainrun's C++ API instead of the
// `trainrun` command: it runs a plugin's train function on 2 local workers,
// receives each report's metrics in a callback as the run goes, and keeps the
// run's own output off its terminal.
//
//   embedding PLUGIN.so [STORAGE_PATH]

#include <trainrun/error.h>
#include <trainrun/trainer.h>

#include <iostream>
#include <string_view>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " PLUGIN.so [STORAGE_PATH]\n";
    return 2;
  }
  trainrun::TrainerOptions options;
  options.plugin = argv[1];
  options.scaling.num_workers = 2;
  options.config = {{"steps", 10}};
  options.run.name = "embedded";
  if (argc > 2) options.run.storage_path = argv[2];
  trainrun::Callbacks callbacks;
  callbacks.on_report = [](const trainrun::ReportRecord& report) {
    std::cout << "iteration " << report.iteration << ": " << report.metrics.dump() << std::endl;
  };
  callbacks.on_output = [](std::string_view) {};  // the run's own lines: its logs/ have them
  try {
    trainrun::Trainer trainer(options, callbacks);
    trainrun::Result result = trainer.fit();
    if (result.error) {
      std::cerr << "training failed: " << result.error->summary() << "\n";
      return 1;
    }
    std::cout << "finished: " << result.iterations << " reports in " << result.path << "\n";
    return 0;
  } catch (const trainrun::Error& e) {  // bad options, a bad plugin
    std::cerr << "cannot train: " << e.what() << "\n";
    return 2;
  }
}

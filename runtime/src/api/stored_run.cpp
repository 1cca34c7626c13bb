#include "api/stored_run.h"

#include <trainrun/error.h>

#include "common/paths.h"
#include "storage/run_objects.h"

namespace trainrun {

StoredRun::StoredRun(const std::string& url) {
  auto location = s3::parse_url(url);
  auto slash = location.prefix.rfind('/');
  auto name = location.prefix.substr(slash == std::string::npos ? 0 : slash + 1);
  if (name.empty()) throw UsageError(url + " names a bucket, not a run (s3://BUCKET/PREFIX/NAME)");
  location.prefix = slash == std::string::npos ? "" : location.prefix.substr(0, slash);
  RunObjects objects(location.url(), name);
  objects.check_access();
  url_ = objects.url();
  dir_ = make_temp_dir("trainrun-results-");
  try {
    objects.pull_run_files(dir_);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    throw;
  }
}

StoredRun::~StoredRun() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace trainrun

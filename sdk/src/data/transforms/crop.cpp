// torchvision's RandomResizedCrop.get_params, number for number: the area
// and aspect draws in float32 as torch draws them, Python's round (half to
// even) on the side lengths, the centre crop after ten misses.

#include <train/images.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace train {
namespace {

int python_round(double value) { return static_cast<int>(std::nearbyint(value)); }

void check_range(std::pair<double, double> range, const char* name) {
  // Bounded, so that every side length computed from them is a number an int holds.
  if (!(range.first >= 1e-6) || !(range.first <= range.second) || !(range.second <= 1e6)) {
    throw ImageError(std::string("random_resized_crop: ") + name + " (" +
                     std::to_string(range.first) + ", " + std::to_string(range.second) +
                     ") must be in order, within [1e-6, 1e6]");
  }
}

}  // namespace

Window random_resized_crop_params(int height, int width, std::pair<double, double> scale,
                                  std::pair<double, double> ratio, ImageRandom& random) {
  if (height < 1 || width < 1) {
    throw ImageError("random_resized_crop: an empty image (" + std::to_string(width) + "x" +
                     std::to_string(height) + ")");
  }
  check_range(scale, "scale");
  check_range(ratio, "ratio");
  const double area = static_cast<double>(height) * width;
  // torch.log(torch.tensor(ratio)): float32.
  const float log_low = std::log(static_cast<float>(ratio.first));
  const float log_high = std::log(static_cast<float>(ratio.second));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area =
        area * random.uniform(static_cast<float>(scale.first), static_cast<float>(scale.second));
    const double aspect = std::exp(random.uniform(log_low, log_high));  // float32, as torch.exp
    const double w_exact = std::sqrt(target_area * aspect);
    const double h_exact = std::sqrt(target_area / aspect);
    if (!(w_exact < width + 1.0) || !(h_exact < height + 1.0)) continue;  // no int needed
    const int w = python_round(w_exact);
    const int h = python_round(h_exact);
    if (0 < w && w <= width && 0 < h && h <= height) {
      const auto top = random.integer(0, height - h + 1);
      const auto left = random.integer(0, width - w + 1);
      return {static_cast<double>(top), static_cast<double>(left), static_cast<double>(h),
              static_cast<double>(w)};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < std::min(ratio.first, ratio.second)) {
    h = python_round(w / std::min(ratio.first, ratio.second));
  } else if (in_ratio > std::max(ratio.first, ratio.second)) {
    w = python_round(h * std::max(ratio.first, ratio.second));
  }
  return {static_cast<double>((height - h) / 2), static_cast<double>((width - w) / 2),
          static_cast<double>(h), static_cast<double>(w)};
}

}  // namespace train

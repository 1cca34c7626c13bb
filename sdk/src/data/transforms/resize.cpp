// resize_image through OpenCV's imgproc (SIMD): area averaging to shrink by 2
// or more, as an antialiased filter does, bilinear otherwise. OpenCV's own thread pool is
// turned off: the loader's threads are the parallelism, one image each.

#include <train/images.h>

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>

namespace train {
namespace {

// A window's edge in whole pixels, within [0, extent].
int edge(double at, int extent) { return std::clamp(static_cast<int>(std::lround(at)), 0, extent); }

std::string describe(const Window& w) {
  return std::to_string(w.width) + "x" + std::to_string(w.height) + " at (" +
         std::to_string(w.left) + ", " + std::to_string(w.top) + ")";
}

}  // namespace

void resize_image(const Image& in, const Window& window, int height, int width, Image& out) {
  static std::once_flag sequential;
  std::call_once(sequential, [] { cv::setNumThreads(0); });
  if (&in == &out) throw ImageError("resize_image: the output must be another image");
  if (height < 1 || width < 1) {
    throw ImageError("resize_image: an output of " + std::to_string(width) + "x" +
                     std::to_string(height));
  }
  // Rounding may leave a fractional window a pixel past an edge; more is a
  // window outside the image.
  constexpr double kSlack = 1.0;
  if (window.top < -kSlack || window.left < -kSlack ||
      window.top + window.height > in.height + kSlack ||
      window.left + window.width > in.width + kSlack) {
    throw ImageError("resize_image: the window " + describe(window) + " is outside a " +
                     std::to_string(in.width) + "x" + std::to_string(in.height) + " image");
  }
  if (!(window.height > 0) || !(window.width > 0)) {
    throw ImageError("resize_image: the window " + describe(window) + " is empty");
  }
  // Whole pixels; a window narrower than half a pixel keeps the one it is in.
  int y0 = edge(window.top, in.height), y1 = edge(window.top + window.height, in.height);
  int x0 = edge(window.left, in.width), x1 = edge(window.left + window.width, in.width);
  if (y1 <= y0) y1 = (y0 = std::min(y0, in.height - 1)) + 1;
  if (x1 <= x0) x1 = (x0 = std::min(x0, in.width - 1)) + 1;
  const cv::Mat source(in.height, in.width, CV_8UC3, const_cast<uint8_t*>(in.pixels.data()));
  const cv::Mat region = source(cv::Rect(x0, y0, x1 - x0, y1 - y0));
  out.resize(height, width);
  cv::Mat target(height, width, CV_8UC3, out.pixels.data());
  // Bilinear weighs 2 source pixels a side: it averages every pixel of a
  // shrink by less than 2, which the fused decode leaves; area averaging (4
  // times its cost here) keeps a greater shrink from aliasing.
  const bool halves = region.cols >= 2 * width && region.rows >= 2 * height;
  cv::resize(region, target, target.size(), 0, 0, halves ? cv::INTER_AREA : cv::INTER_LINEAR);
}

}  // namespace train

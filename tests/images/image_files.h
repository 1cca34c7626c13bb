#pragma once

// Images for the image tests: a deterministic picture with edges, gradients
// and texture (as a photograph has, unlike noise or flat colour), encoded as
// JPEG through libjpeg and as PNG through libspng, of every colour type.

#include <train/images.h>

#include <string>

namespace test_images {

/// A height x width picture, the same for the same arguments.
train::Image picture(int height, int width, uint32_t seed = 1);

enum class JpegColor { kRgb, kGray, kCmyk };
/// `image` as a JPEG of `quality` (4:2:0 for colour, as PIL writes it).
/// CMYK is written inverted, as Photoshop writes it, with 255 - black = `white`.
std::string encode_jpeg(const train::Image& image, int quality = 90,
                        JpegColor color = JpegColor::kRgb, int white = 255);

enum class PngColor { kRgb, kGray, kPalette, kRgba, kRgb16 };
/// `image` as a PNG of that colour type (grey: its red channel; palette: its
/// colours cut to 6 levels a channel; RGBA: alpha 128; 16-bit: each byte twice).
std::string encode_png(const train::Image& image, PngColor color = PngColor::kRgb);

/// Mean absolute difference of two images of one size, per channel value.
double mean_difference(const train::Image& a, const train::Image& b);

}  // namespace test_images

// jpeglib.h uses FILE and size_t without including their headers.
#include <stdio.h>
// clang-format off
#include <jpeglib.h>
// clang-format on

#include <spng.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <vector>

#include "image_files.h"

namespace test_images {

train::Image picture(int height, int width, uint32_t seed) {
  train::Image image;
  image.resize(height, width);
  uint32_t state = seed * 2654435761u + 1;
  const auto noise = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<int>(state >> 28) - 8;  // -8..7
  };
  const double cx = width * 0.6, cy = height * 0.4, r = std::min(height, width) / 4.0;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const bool disc = (x - cx) * (x - cx) + (y - cy) * (y - cy) < r * r;
      const bool stripe = (x / 16 + y / 24) % 5 == 0;
      int rgb[3] = {40 + 180 * x / width, 30 + 200 * y / height,
                    static_cast<int>(128 + 90 * std::sin(x * 0.05 + y * 0.03))};
      if (disc) rgb[0] = 230, rgb[1] = 200 - 100 * y / height, rgb[2] = 40;
      if (stripe) rgb[2] = 250 - rgb[2] / 2;
      for (int c = 0; c < 3; ++c) {
        image.row(y)[3 * x + c] = static_cast<uint8_t>(std::clamp(rgb[c] + noise(), 0, 255));
      }
    }
  }
  return image;
}

std::string encode_jpeg(const train::Image& image, int quality, JpegColor color, int white) {
  jpeg_compress_struct info{};
  jpeg_error_mgr errors{};
  info.err = jpeg_std_error(&errors);
  jpeg_create_compress(&info);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&info, &buffer, &size);
  info.image_width = static_cast<JDIMENSION>(image.width);
  info.image_height = static_cast<JDIMENSION>(image.height);
  const int components = color == JpegColor::kRgb ? 3 : color == JpegColor::kGray ? 1 : 4;
  info.input_components = components;
  info.in_color_space = color == JpegColor::kRgb    ? JCS_RGB
                        : color == JpegColor::kGray ? JCS_GRAYSCALE
                                                    : JCS_CMYK;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, quality, TRUE);
  jpeg_start_compress(&info, TRUE);
  std::vector<uint8_t> row(static_cast<size_t>(image.width) * components);
  while (info.next_scanline < info.image_height) {
    const uint8_t* in = image.row(static_cast<int>(info.next_scanline));
    for (int x = 0; x < image.width; ++x) {
      if (color == JpegColor::kRgb) {
        for (int c = 0; c < 3; ++c) row[3 * x + c] = in[3 * x + c];
      } else if (color == JpegColor::kGray) {
        row[x] = in[3 * x];
      } else {  // inverted CMYK, as Photoshop writes it (with an Adobe marker)
        for (int c = 0; c < 3; ++c) row[4 * x + c] = in[3 * x + c];
        row[4 * x + 3] = static_cast<uint8_t>(white);
      }
    }
    JSAMPROW pointer = row.data();
    jpeg_write_scanlines(&info, &pointer, 1);
  }
  jpeg_finish_compress(&info);
  std::string bytes(reinterpret_cast<const char*>(buffer), size);
  jpeg_destroy_compress(&info);
  std::free(buffer);
  return bytes;
}

std::string encode_png(const train::Image& image, PngColor color) {
  std::unique_ptr<spng_ctx, decltype(&spng_ctx_free)> ctx(spng_ctx_new(SPNG_CTX_ENCODER),
                                                          &spng_ctx_free);
  spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = static_cast<uint32_t>(image.width);
  ihdr.height = static_cast<uint32_t>(image.height);
  ihdr.bit_depth = color == PngColor::kRgb16 ? 16 : 8;
  std::vector<uint8_t> data;
  spng_plte plte{};
  const size_t pixels = static_cast<size_t>(image.width) * image.height;
  switch (color) {
    case PngColor::kRgb:
      ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
      data = image.pixels;
      break;
    case PngColor::kGray:
      ihdr.color_type = SPNG_COLOR_TYPE_GRAYSCALE;
      for (size_t i = 0; i < pixels; ++i) data.push_back(image.pixels[3 * i]);
      break;
    case PngColor::kRgba:
      ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR_ALPHA;
      for (size_t i = 0; i < pixels; ++i) {
        for (int c = 0; c < 3; ++c) data.push_back(image.pixels[3 * i + c]);
        data.push_back(128);
      }
      break;
    case PngColor::kRgb16:
      ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
      for (uint8_t v : image.pixels) data.push_back(v), data.push_back(v);
      break;
    case PngColor::kPalette: {
      ihdr.color_type = SPNG_COLOR_TYPE_INDEXED;
      plte.n_entries = 216;
      for (int i = 0; i < 216; ++i) {
        plte.entries[i].red = static_cast<uint8_t>(i / 36 * 51);
        plte.entries[i].green = static_cast<uint8_t>(i / 6 % 6 * 51);
        plte.entries[i].blue = static_cast<uint8_t>(i % 6 * 51);
      }
      for (size_t i = 0; i < pixels; ++i) {
        int index = 0;
        for (int c = 0; c < 3; ++c) index = index * 6 + (image.pixels[3 * i + c] + 25) / 51;
        data.push_back(static_cast<uint8_t>(index));
      }
      break;
    }
  }
  spng_set_ihdr(ctx.get(), &ihdr);
  if (color == PngColor::kPalette) spng_set_plte(ctx.get(), &plte);
  if (int code = spng_encode_image(ctx.get(), data.data(), data.size(), SPNG_FMT_PNG,
                                   SPNG_ENCODE_FINALIZE)) {
    throw std::runtime_error(std::string("spng_encode_image: ") + spng_strerror(code));
  }
  size_t size = 0;
  int code = 0;
  void* buffer = spng_get_png_buffer(ctx.get(), &size, &code);
  if (buffer == nullptr) throw std::runtime_error("spng_get_png_buffer failed");
  std::string bytes(static_cast<const char*>(buffer), size);
  std::free(buffer);
  return bytes;
}

double mean_difference(const train::Image& a, const train::Image& b) {
  if (a.height != b.height || a.width != b.width) return 1e9;
  double sum = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) sum += std::abs(int{a.pixels[i]} - b.pixels[i]);
  return sum / static_cast<double>(a.pixels.size());
}

}  // namespace test_images

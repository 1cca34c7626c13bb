// decode_image, image_size and decode_resized: the format told by its first
// bytes, then its decoder.

#include "data/decode/decoders.h"

namespace train {
namespace {

[[noreturn]] void unknown_format(std::string_view bytes) {
  throw ImageError(bytes.empty()
                       ? "an empty image field"
                       : "neither a JPEG nor a PNG (" + std::to_string(bytes.size()) + " bytes)");
}

}  // namespace

void Image::resize(int new_height, int new_width) {
  height = new_height;
  width = new_width;
  pixels.resize(static_cast<size_t>(new_height) * new_width * kChannels);
}

ImageSize image_size(std::string_view bytes) {
  if (decode::is_jpeg(bytes)) return decode::jpeg_size(bytes);
  if (decode::is_png(bytes)) return decode::png_size(bytes);
  unknown_format(bytes);
}

void decode_image(std::string_view bytes, Image& out) {
  if (decode::is_jpeg(bytes)) return decode::decode_jpeg(bytes, out);
  if (decode::is_png(bytes)) return decode::decode_png(bytes, out);
  unknown_format(bytes);
}

void decode_resized(std::string_view bytes, const Window& window, int height, int width,
                    Image& out) {
  thread_local Image decoded;
  if (decode::is_jpeg(bytes)) {
    Window scaled;
    decode::decode_jpeg_window(bytes, window, height, width, decoded, scaled);
    return resize_image(decoded, scaled, height, width, out);
  }
  decode_image(bytes, decoded);
  resize_image(decoded, window, height, width, out);
}

}  // namespace train

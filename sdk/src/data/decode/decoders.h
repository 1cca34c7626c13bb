#pragma once

// The decoders behind decode_image and decode_resized: one file per format,
// each safe to call from several threads at once (no state between calls).

#include <train/images.h>

#include <string_view>

namespace train::decode {

/// The largest image decoded (pixels): past it a header is taken as hostile.
inline constexpr uint64_t kMaxPixels = uint64_t{1} << 28;

bool is_jpeg(std::string_view bytes);
bool is_png(std::string_view bytes);

ImageSize jpeg_size(std::string_view bytes);
void decode_jpeg(std::string_view bytes, Image& out);
/// `window` of the JPEG decoded at the smallest scale that keeps it at least
/// height x width: the pixels of the rows and block columns it covers, in
/// `out`, and the window in `out`'s pixels in `scaled`.
void decode_jpeg_window(std::string_view bytes, const Window& window, int height, int width,
                        Image& out, Window& scaled);

ImageSize png_size(std::string_view bytes);
void decode_png(std::string_view bytes, Image& out);

}  // namespace train::decode

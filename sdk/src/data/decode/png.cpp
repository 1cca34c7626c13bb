// PNG through libspng: every colour type and bit depth as 8-bit RGB (alpha
// dropped, as PIL's convert("RGB") drops it), with limits on what a hostile
// file may make it allocate.

#include <spng.h>

#include <memory>
#include <string>

#include "data/decode/decoders.h"

namespace train::decode {
namespace {

constexpr uint32_t kMaxSide = 1 << 16;
constexpr size_t kMaxChunkBytes = size_t{1} << 24;  // text, ICC profiles and the like
constexpr size_t kMaxCacheBytes = size_t{1} << 26;  // all of them together

using Context = std::unique_ptr<spng_ctx, decltype(&spng_ctx_free)>;

void check(int code, const char* what) {
  if (code != 0) throw ImageError(std::string("PNG: ") + what + ": " + spng_strerror(code));
}

Context open(std::string_view bytes) {
  Context ctx(spng_ctx_new(0), &spng_ctx_free);
  if (!ctx) throw ImageError("PNG: out of memory");
  check(spng_set_image_limits(ctx.get(), kMaxSide, kMaxSide), "limits");
  check(spng_set_chunk_limits(ctx.get(), kMaxChunkBytes, kMaxCacheBytes), "limits");
  check(spng_set_png_buffer(ctx.get(), bytes.data(), bytes.size()), "reading");
  return ctx;
}

ImageSize header(spng_ctx* ctx) {
  spng_ihdr ihdr{};
  check(spng_get_ihdr(ctx, &ihdr), "reading the header");
  if (uint64_t{ihdr.width} * ihdr.height > kMaxPixels) {
    throw ImageError("PNG: an image of " + std::to_string(ihdr.width) + "x" +
                     std::to_string(ihdr.height) + " pixels is refused");
  }
  return {static_cast<int>(ihdr.height), static_cast<int>(ihdr.width)};
}

}  // namespace

bool is_png(std::string_view bytes) {
  return bytes.size() >= 8 && bytes.substr(0, 8) == std::string_view("\x89PNG\r\n\x1a\n", 8);
}

ImageSize png_size(std::string_view bytes) { return header(open(bytes).get()); }

void decode_png(std::string_view bytes, Image& out) {
  auto ctx = open(bytes);
  const auto size = header(ctx.get());
  size_t length = 0;
  check(spng_decoded_image_size(ctx.get(), SPNG_FMT_RGB8, &length), "sizing");
  out.resize(size.height, size.width);
  if (length != out.pixels.size()) throw ImageError("PNG: unexpected decoded size");
  check(spng_decode_image(ctx.get(), out.pixels.data(), length, SPNG_FMT_RGB8, SPNG_DECODE_TRNS),
        "decoding");
}

}  // namespace train::decode

// JPEG through libjpeg-turbo's libjpeg API: whole images, and a window of one
// decoded alone at a reduced DCT scale (jpeg_crop_scanline,
// jpeg_skip_scanlines), as DALI's and tf.data's fused crops do.
//
// libjpeg reports errors by calling back: here it longjmps to the setjmp in
// Decompressor::run, which turns the message into an ImageError. Nothing with
// a destructor lives in the frames a longjmp crosses (run's bodies hold ints).

#include "data/decode/decoders.h"

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <string>

#include <jerror.h>
#include <jpeglib.h>

namespace train::decode {
namespace {

struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
  bool truncated = false;  // libjpeg filled the rest of the image with grey
};

[[noreturn]] void error_exit(j_common_ptr info) {
  auto* errors = reinterpret_cast<ErrorManager*>(info->err);
  (*info->err->format_message)(info, errors->message);
  std::longjmp(errors->jump, 1);
}

// Warnings are not printed: a truncated image is an error once decoded (the
// others, such as extraneous bytes before a marker, PIL ignores too).
void emit_message(j_common_ptr info, int level) {
  if (level >= 0) return;
  auto* errors = reinterpret_cast<ErrorManager*>(info->err);
  if (info->err->msg_code == JWRN_JPEG_EOF && !errors->truncated) {
    errors->truncated = true;
    (*info->err->format_message)(info, errors->message);
  }
  ++info->err->num_warnings;
}

class Decompressor {
 public:
  explicit Decompressor(std::string_view bytes) {
    info_.err = jpeg_std_error(&errors_.pub);
    errors_.pub.error_exit = error_exit;
    errors_.pub.emit_message = emit_message;
    run([&](j_decompress_ptr info) {
      jpeg_create_decompress(info);
      created_ = true;
      jpeg_mem_src(info, reinterpret_cast<const unsigned char*>(bytes.data()),
                   static_cast<unsigned long>(bytes.size()));
    });
  }
  ~Decompressor() {
    if (created_) jpeg_destroy_decompress(&info_);
  }
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;

  // Runs libjpeg calls; an error inside comes out as an ImageError.
  template <typename Body>
  void run(Body&& body) {
    if (setjmp(errors_.jump) != 0) throw ImageError(std::string("JPEG: ") + errors_.message);
    body(&info_);
  }

  // Reads the header and sets RGB output (or CMYK, converted after).
  void read_header() {
    run([](j_decompress_ptr info) { jpeg_read_header(info, TRUE); });
    if (info_.image_width == 0 || info_.image_height == 0 ||
        uint64_t{info_.image_width} * info_.image_height > kMaxPixels) {
      throw ImageError("JPEG: an image of " + std::to_string(info_.image_width) + "x" +
                       std::to_string(info_.image_height) + " pixels is refused");
    }
    cmyk_ = info_.jpeg_color_space == JCS_CMYK || info_.jpeg_color_space == JCS_YCCK;
    info_.out_color_space = cmyk_ ? JCS_CMYK : JCS_RGB;
  }

  // Rows [first, end) of the output (after jpeg_start_decompress and any
  // crop) into `out`, which has their width.
  void read_rows(int first, int end, Image& out) {
    std::vector<uint8_t> cmyk(cmyk_ ? static_cast<size_t>(out.width) * 4 : 0);
    for (int y = first; y < end; ++y) {
      JSAMPROW row = cmyk_ ? cmyk.data() : out.row(y - first);
      run([&row](j_decompress_ptr info) { jpeg_read_scanlines(info, &row, 1); });
      if (cmyk_) cmyk_to_rgb(cmyk.data(), out.row(y - first), out.width);
    }
    if (errors_.truncated) throw ImageError(std::string("JPEG: ") + errors_.message);
  }

  jpeg_decompress_struct& info() { return info_; }

 private:
  // PIL's conversion; Adobe's CMYK JPEGs store the inks inverted.
  void cmyk_to_rgb(const uint8_t* in, uint8_t* out, int width) const {
    const bool inverted = info_.saw_Adobe_marker;
    for (int x = 0; x < width; ++x, in += 4, out += 3) {
      const int k = inverted ? 255 - in[3] : in[3];
      for (int c = 0; c < 3; ++c) {
        const int ink = inverted ? 255 - in[c] : in[c];
        out[c] = static_cast<uint8_t>(255 - std::min(255, ink + k));
      }
    }
  }

  jpeg_decompress_struct info_{};
  ErrorManager errors_{};
  bool created_ = false;
  bool cmyk_ = false;
};

}  // namespace

bool is_jpeg(std::string_view bytes) {
  return bytes.size() >= 3 && static_cast<uint8_t>(bytes[0]) == 0xff &&
         static_cast<uint8_t>(bytes[1]) == 0xd8 && static_cast<uint8_t>(bytes[2]) == 0xff;
}

ImageSize jpeg_size(std::string_view bytes) {
  Decompressor jpeg(bytes);
  jpeg.read_header();
  return {static_cast<int>(jpeg.info().image_height), static_cast<int>(jpeg.info().image_width)};
}

void decode_jpeg(std::string_view bytes, Image& out) {
  Decompressor jpeg(bytes);
  jpeg.read_header();
  jpeg.run([](j_decompress_ptr info) { jpeg_start_decompress(info); });
  const int height = static_cast<int>(jpeg.info().output_height);
  out.resize(height, static_cast<int>(jpeg.info().output_width));
  jpeg.read_rows(0, height, out);
  jpeg.run([](j_decompress_ptr info) { jpeg_finish_decompress(info); });
}

void decode_jpeg_window(std::string_view bytes, const Window& window, int height, int width,
                        Image& out, Window& scaled) {
  Decompressor jpeg(bytes);
  jpeg.read_header();
  auto& info = jpeg.info();
  // The smallest of the scales 1/8, 1/4 and 1/2 that leaves the window no
  // smaller than the output (else whole): the resize after it shrinks by less
  // than 2. libjpeg-turbo's other scales (3/8, 5/8...) have no SIMD inverse
  // DCT, and cost more than they save.
  int eighths = 8;
  for (int m : {1, 2, 4}) {
    if (window.width * m / 8 >= width && window.height * m / 8 >= height) {
      eighths = m;
      break;
    }
  }
  info.scale_num = static_cast<unsigned>(eighths);
  info.scale_denom = 8;
  jpeg.run([](j_decompress_ptr info) { jpeg_start_decompress(info); });
  const double sy = static_cast<double>(info.output_height) / info.image_height;
  const double sx = static_cast<double>(info.output_width) / info.image_width;
  const int out_height = static_cast<int>(info.output_height);
  const int out_width = static_cast<int>(info.output_width);
  const int y0 = std::clamp(static_cast<int>(std::floor(window.top * sy)), 0, out_height - 1);
  const int y1 = std::clamp(static_cast<int>(std::ceil((window.top + window.height) * sy)),
                            y0 + 1, out_height);
  const int x0 = std::clamp(static_cast<int>(std::floor(window.left * sx)), 0, out_width - 1);
  const int x1 = std::clamp(static_cast<int>(std::ceil((window.left + window.width) * sx)),
                            x0 + 1, out_width);
  // The columns widen to whole blocks (an iMCU): xoffset moves left.
  JDIMENSION xoffset = static_cast<JDIMENSION>(x0);
  JDIMENSION columns = static_cast<JDIMENSION>(x1 - x0);
  jpeg.run([&xoffset, &columns](j_decompress_ptr info) {
    jpeg_crop_scanline(info, &xoffset, &columns);
  });
  out.resize(y1 - y0, static_cast<int>(info.output_width));
  if (y0 > 0) {
    const auto rows = static_cast<JDIMENSION>(y0);
    jpeg.run([rows](j_decompress_ptr info) { jpeg_skip_scanlines(info, rows); });
  }
  jpeg.read_rows(y0, y1, out);
  jpeg.run([](j_decompress_ptr info) { jpeg_abort_decompress(info); });  // the rows below
  scaled = {window.top * sy - y0, window.left * sx - static_cast<double>(xoffset),
            window.height * sy, window.width * sx};
}

}  // namespace train::decode

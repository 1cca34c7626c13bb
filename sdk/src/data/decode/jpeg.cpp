// JPEG through libjpeg-turbo's libjpeg API: whole images, and a window of one
// decoded alone at a reduced DCT scale (jpeg_crop_scanline,
// jpeg_skip_scanlines), as DALI's and tf.data's fused crops do.
//
// libjpeg reports errors by calling back: here it longjmps to the setjmp in
// Decompressor::run, which turns the message into an ImageError. Nothing with
// a destructor lives in the frames a longjmp crosses (run's bodies hold ints).

// jpeglib.h uses FILE and size_t without including their headers.
#include <stdio.h>
// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <string>

#include "data/decode/decoders.h"

namespace train::decode {
namespace {

// What one decode may take: libjpeg's working memory (a progressive image's
// coefficients), and the scans of a progressive image (a small hostile file
// of thousands of scans would hold a loader thread for minutes; libjpeg-turbo's
// own tools stop at the same count).
constexpr long kMaxWorkingMemory = 1L << 30;
constexpr int kMaxScans = 500;

struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
  bool truncated = false;  // libjpeg filled the rest of the image with grey
};

struct ScanLimit {
  jpeg_progress_mgr pub;
  ErrorManager* errors;
};

void count_scans(j_common_ptr info) {
  auto* limit = reinterpret_cast<ScanLimit*>(info->progress);
  auto* decompress = reinterpret_cast<j_decompress_ptr>(info);
  if (decompress->input_scan_number > kMaxScans) {
    std::snprintf(limit->errors->message, sizeof limit->errors->message,
                  "more than %d scans: refused", kMaxScans);
    std::longjmp(limit->errors->jump, 1);
  }
}

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
    scans_.pub.progress_monitor = count_scans;
    scans_.errors = &errors_;
    run([&](j_decompress_ptr info) {
      jpeg_create_decompress(info);
      created_ = true;
      info->mem->max_memory_to_use = kMaxWorkingMemory;
      info->progress = &scans_.pub;
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
  // Pillow's conversion, (255 - ink) (255 - black) / 255; Adobe's CMYK JPEGs
  // store the inks inverted.
  void cmyk_to_rgb(const uint8_t* in, uint8_t* out, int width) const {
    const bool inverted = info_.saw_Adobe_marker;
    for (int x = 0; x < width; ++x, in += 4, out += 3) {
      const int white = inverted ? in[3] : 255 - in[3];  // 255 - black
      for (int c = 0; c < 3; ++c) {
        const int paper = inverted ? in[c] : 255 - in[c];  // 255 - ink
        out[c] = static_cast<uint8_t>((paper * white + 127) / 255);
      }
    }
  }

  jpeg_decompress_struct info_{};
  ErrorManager errors_{};
  ScanLimit scans_{};
  bool created_ = false;
  bool cmyk_ = false;
};

// Whether an end-of-image marker (FF D9) is among the last bytes: entropy-coded
// data never holds one (an FF there is followed by 00), and some cameras
// write a trailer after it.
bool ends_whole(std::string_view bytes) {
  constexpr size_t kTrailer = 4096;
  const size_t from = bytes.size() > kTrailer ? bytes.size() - kTrailer : 0;
  for (size_t i = bytes.size(); i-- > from + 1;) {
    if (static_cast<uint8_t>(bytes[i - 1]) == 0xff && static_cast<uint8_t>(bytes[i]) == 0xd9) {
      return true;
    }
  }
  return false;
}

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
  // The rows below the window are never read: a truncated file is told by its
  // missing end marker instead, whatever the crop.
  if (!ends_whole(bytes)) {
    throw ImageError("JPEG: Premature end of JPEG file (no end-of-image marker)");
  }
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
  // Scaled pixel k covers source pixels [8k/m, 8(k+1)/m): the output's size is
  // rounded up, its scale is exactly m/8.
  const double sy = eighths / 8.0, sx = eighths / 8.0;
  const int out_height = static_cast<int>(info.output_height);
  const int out_width = static_cast<int>(info.output_width);
  const int y0 = std::clamp(static_cast<int>(std::floor(window.top * sy)), 0, out_height - 1);
  const int y1 = std::clamp(static_cast<int>(std::ceil((window.top + window.height) * sy)), y0 + 1,
                            out_height);
  const int x0 = std::clamp(static_cast<int>(std::floor(window.left * sx)), 0, out_width - 1);
  const int x1 =
      std::clamp(static_cast<int>(std::ceil((window.left + window.width) * sx)), x0 + 1, out_width);
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

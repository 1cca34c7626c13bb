// The image pipeline on its own: crops against torchvision's, the fused
// decode against the unfused one, every colour type, a user's decoder, step
// and target, bad images, and batches from shards and a folder.
//
// The torchvision case exits 77 (skipped, never passed) without Debian's
// python3-torchvision.

#include <train/images.h>

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <sstream>

#include "doctest_torch.h"
#include "image_files.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;
using test_images::encode_jpeg;
using test_images::encode_png;
using test_images::JpegColor;
using test_images::mean_difference;
using test_images::picture;
using test_images::PngColor;

// Draws recorded elsewhere, handed out in order; a draw of another kind or
// range than the next recorded one fails the test.
class Replay : public train::ImageRandom {
 public:
  explicit Replay(const nlohmann::json& draws) {
    for (const auto& draw : draws) draws_.push_back(draw);
  }
  float uniform(float low, float high) override {
    const auto draw = next("u");
    CHECK(low == static_cast<float>(draw[1].get<double>()));
    CHECK(high == static_cast<float>(draw[2].get<double>()));
    return static_cast<float>(draw[3].get<double>());
  }
  int64_t integer(int64_t low, int64_t high) override {
    const auto draw = next("i");
    CHECK(low == draw[1].get<int64_t>());
    CHECK(high == draw[2].get<int64_t>());
    return draw[3].get<int64_t>();
  }
  size_t left() const { return draws_.size(); }

 private:
  nlohmann::json next(const char* kind) {
    REQUIRE_MESSAGE(!draws_.empty(), "a draw more than torchvision made");
    auto draw = draws_.front();
    draws_.pop_front();
    REQUIRE(draw[0].get<std::string>() == kind);
    return draw;
  }
  std::deque<nlohmann::json> draws_;
};

// A fixed stream for both sides of a comparison.
class Counter : public train::ImageRandom {
 public:
  explicit Counter(uint64_t seed) : state_(seed) {}
  float uniform(float low, float high) override {
    return static_cast<float>((next() >> 40) * 0x1.0p-24) * (high - low) + low;
  }
  int64_t integer(int64_t low, int64_t high) override {
    return low + static_cast<int64_t>(next() % static_cast<uint64_t>(high - low));
  }

 private:
  uint64_t next() {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return state_ ^ (state_ >> 29);
  }
  uint64_t state_;
};

std::string run_command(const std::string& command, int& status) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  status = ::pclose(pipe);
  return out;
}

// prefix + i, not written `"p" + std::to_string(i)`: GCC 12 warns falsely of
// that at -O3 (its bug 105329).
std::string key_of(const char* prefix, int i) {
  return std::string(prefix).append(std::to_string(i));
}

train::Sample sample_of(const std::string& key,
                        std::vector<std::pair<std::string, std::string>> fields) {
  auto owned =
      std::make_shared<std::vector<std::pair<std::string, std::string>>>(std::move(fields));
  train::Sample sample;
  sample.key = key;
  for (const auto& [name, bytes] : *owned) sample.fields.emplace_back(name, bytes);
  sample.data = owned;
  return sample;
}

train::Image to_image(const torch::Tensor& chw) {  // uint8 [3, H, W]
  train::Image image;
  image.resize(static_cast<int>(chw.size(1)), static_cast<int>(chw.size(2)));
  const auto hwc = chw.permute({1, 2, 0}).contiguous();
  std::memcpy(image.pixels.data(), hwc.data_ptr<uint8_t>(), image.pixels.size());
  return image;
}

// Writes `count` samples of pictures (JPEG, or PNG every `png_every`th) with
// their index as the label, into shards of 8.
std::string write_picture_shards(const fs::path& dir, int count, int png_every = 0) {
  train::ShardWriterOptions options;
  options.max_samples = 8;
  train::ShardWriter writer((dir / "train-%06d.tar").string(), options);
  for (int i = 0; i < count; ++i) {
    const auto image = picture(60 + i % 3 * 10, 80, static_cast<uint32_t>(i));
    const bool png = png_every > 0 && i % png_every == 0;
    writer.write(key_of("p", i),
                 {{png ? "png" : "jpg", png ? encode_png(image) : encode_jpeg(image)},
                  {"cls", std::to_string(i)}});
  }
  writer.close();
  return (dir / "train-*.tar").string();
}

}  // namespace

TEST_CASE("the crop parameters are torchvision's RandomResizedCrop's for the same random numbers") {
  std::ostringstream cases;
  cases.precision(17);
  struct Case {
    int height, width;
    double s0, s1, r0, r1;
  };
  const Case shapes[] = {{375, 500, 0.08, 1, 0.75, 4.0 / 3}, {500, 333, 0.08, 1, 0.75, 4.0 / 3},
                         {224, 224, 0.5, 1, 0.75, 4.0 / 3},  {10, 500, 0.9, 1, 0.75, 4.0 / 3},
                         {600, 12, 0.9, 1, 0.75, 4.0 / 3},   {375, 500, 0.25, 0.5, 0.5, 2},
                         {1, 1, 0.08, 1, 0.75, 4.0 / 3},     {480, 640, 1, 1, 1, 1}};
  std::vector<Case> all;
  for (int seed = 0; seed < 400; ++seed) {
    const auto& shape = shapes[seed % std::size(shapes)];
    all.push_back(shape);
    cases << seed << ' ' << shape.height << ' ' << shape.width << ' ' << shape.s0 << ' ' << shape.s1
          << ' ' << shape.r0 << ' ' << shape.r1 << '\n';
  }
  TempDir dir;
  std::ofstream(dir.path / "cases") << cases.str();
  int status = 0;
  const auto out = run_command(std::string(TORCHVISION_PYTHON) + " " + TORCHVISION_CROPS + " < " +
                                   (dir.path / "cases").string(),
                               status);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
    std::printf("skipped: needs torchvision in %s (Debian's python3-torchvision)\n",
                TORCHVISION_PYTHON);
    std::fflush(stdout);
    std::_Exit(77);
  }
  REQUIRE(status == 0);
  std::istringstream lines(out);
  std::string line;
  size_t compared = 0, fallbacks = 0;
  while (std::getline(lines, line)) {
    const auto expected = nlohmann::json::parse(line);
    const auto& shape = all.at(compared);
    Replay random(expected["draws"]);
    const auto crop = train::random_resized_crop_params(
        shape.height, shape.width, {shape.s0, shape.s1}, {shape.r0, shape.r1}, random);
    const auto want = expected["crop"];
    INFO("case " << compared << ": " << line);
    CHECK(crop.top == want[0].get<int>());
    CHECK(crop.left == want[1].get<int>());
    CHECK(crop.height == want[2].get<int>());
    CHECK(crop.width == want[3].get<int>());
    CHECK(random.left() == 0);
    fallbacks += expected["draws"].size() == 20;
    ++compared;
  }
  CHECK(compared == all.size());
  CHECK(fallbacks > 0);  // the centre crop after ten misses was compared too
}

TEST_CASE(
    "a JPEG's crop decoded alone and scaled agrees with the whole decode within resampling "
    "error") {
  // ImageNet's usual sizes decode only the crop's blocks; the larger ones also
  // at a reduced scale (a window twice the output's size or more).
  for (const auto& [height, width] : {std::pair{375, 500},
                                      std::pair{500, 375},
                                      {333, 500},
                                      {750, 1000},
                                      {1200, 900},
                                      {903, 1201}}) {
    const auto bytes = encode_jpeg(picture(height, width, 7));
    const auto train_steps = train::ImagePipeline().random_resized_crop(224).horizontal_flip();
    const auto eval_steps = train::ImagePipeline().resize(256).center_crop(224);
    for (const auto* steps : {&train_steps, &eval_steps}) {
      double worst = 0;
      for (uint64_t seed = 0; seed < 40; ++seed) {
        train::Image fused, whole;
        bool flip_fused = false, flip_whole = false;
        Counter a(seed), b(seed);
        const auto sample = sample_of("x", {{"jpg", bytes}, {"cls", "1"}});
        steps->apply(sample, a, fused, flip_fused);
        train::ImagePipeline(*steps).fused(false).apply(sample, b, whole, flip_whole);
        REQUIRE(fused.height == 224);
        REQUIRE(fused.width == 224);
        CHECK(flip_fused == flip_whole);  // the same draws
        worst = std::max(worst, mean_difference(fused, whole));
      }
      const std::string what = steps == &train_steps ? "training" : "evaluation";
      INFO(width << "x" << height << " " << what << ": " << worst);
      // The same crops: a few levels apart where the two resample differently
      // (a crop taken elsewhere would differ by tens).
      CHECK(worst < 6.0);
      if (height >= 750) CHECK(worst > 0.0);  // the fused path did decode scaled
    }
  }
}

TEST_CASE("a crop of the wrong place differs by far more than the fused decode's error") {
  // The check above is only worth its bound if a misplaced window fails it.
  const auto bytes = encode_jpeg(picture(375, 500, 7));
  train::Image a, b;
  train::decode_resized(bytes, {40, 60, 300, 300}, 224, 224, a);
  train::decode_resized(bytes, {40, 80, 300, 300}, 224, 224, b);
  CHECK(mean_difference(a, b) > 10.0);
}

TEST_CASE("every JPEG and PNG colour type decodes to the RGB it was made of") {
  const auto original = picture(61, 77, 3);  // sizes that fill no whole block
  train::Image decoded;
  // JPEG: lossy (chroma at half resolution), within a few levels.
  train::decode_image(encode_jpeg(original, 95), decoded);
  CHECK(mean_difference(decoded, original) < 6.0);
  train::Image gray = original;
  for (size_t i = 0; i < gray.pixels.size(); i += 3)
    gray.pixels[i + 1] = gray.pixels[i + 2] = gray.pixels[i];
  train::decode_image(encode_jpeg(original, 95, JpegColor::kGray), decoded);
  CHECK(mean_difference(decoded, gray) < 2.0);
  train::decode_image(encode_jpeg(original, 95, JpegColor::kCmyk), decoded);
  CHECK(mean_difference(decoded, original) < 6.0);
  // With black: Pillow's (255 - ink) (255 - black) / 255.
  train::decode_image(encode_jpeg(original, 95, JpegColor::kCmyk, /*white=*/200), decoded);
  train::Image darker = original;
  for (auto& v : darker.pixels) v = static_cast<uint8_t>((v * 200 + 127) / 255);
  CHECK(mean_difference(decoded, darker) < 6.0);
  CHECK(mean_difference(decoded, original) > 20.0);

  train::decode_image(encode_png(original), decoded);
  CHECK(decoded.pixels == original.pixels);
  train::decode_image(encode_png(original, PngColor::kRgb16), decoded);
  CHECK(decoded.pixels == original.pixels);
  train::decode_image(encode_png(original, PngColor::kRgba), decoded);
  CHECK(decoded.pixels == original.pixels);  // alpha dropped, not blended
  train::decode_image(encode_png(original, PngColor::kGray), decoded);
  CHECK(decoded.pixels == gray.pixels);
  train::decode_image(encode_png(original, PngColor::kPalette), decoded);
  CHECK(mean_difference(decoded, original) < 26.0);  // 6 levels a channel
  CHECK(decoded.height == 61);
  CHECK(decoded.width == 77);
  const auto size = train::image_size(encode_png(original, PngColor::kPalette));
  CHECK(size.height == 61);
  CHECK(size.width == 77);
}

TEST_CASE("a corrupt, truncated or foreign image is refused in one line saying what is wrong") {
  const auto jpeg = encode_jpeg(picture(64, 64));
  const auto png = encode_png(picture(64, 64));
  train::Image out;
  CHECK_THROWS_WITH_AS(train::decode_image(jpeg.substr(0, jpeg.size() / 2), out),
                       doctest::Contains("JPEG: Premature end of JPEG file"), train::ImageError);
  // A crop of the top rows alone of a JPEG cut at 80%: refused too, whatever the crop.
  CHECK_THROWS_WITH_AS(
      train::decode_resized(jpeg.substr(0, jpeg.size() * 4 / 5), {0, 0, 8, 8}, 4, 4, out),
      doctest::Contains("JPEG: Premature end of JPEG file"), train::ImageError);
  CHECK_THROWS_WITH_AS(train::decode_image(png.substr(0, png.size() / 2), out),
                       doctest::Contains("PNG: "), train::ImageError);
  std::string flipped = png;
  flipped[40] = static_cast<char>(flipped[40] ^ 0x55);  // in the image data: a bad CRC
  CHECK_THROWS_AS(train::decode_image(flipped, out), train::ImageError);
  CHECK_THROWS_WITH_AS(train::decode_image("GIF89a....", out),
                       doctest::Contains("neither a JPEG nor a PNG"), train::ImageError);
  std::string garbage = jpeg.substr(0, 20) + std::string(200, '\x07');
  CHECK_THROWS_AS(train::decode_image(garbage, out), train::ImageError);
  // A header that asks for a huge image is refused before any allocation.
  std::string huge = png;
  huge[16] = huge[17] = '\x00', huge[18] = '\x7f', huge[19] = '\xff';  // width 32767
  huge[20] = huge[21] = '\x00', huge[22] = '\x7f', huge[23] = '\xff';  // height 32767
  CHECK_THROWS_AS(train::image_size(huge), train::ImageError);
}

TEST_CASE("a batch of images from shards: its shape, dtype, normalisation, flips and targets") {
  TempDir dir;
  const auto spec = write_picture_shards(dir.path, 20, /*png_every=*/5);
  const auto pipeline = train::ImagePipeline().resize(64).center_crop(48);
  train::ImageDataset uint8s(spec, pipeline);
  REQUIRE(uint8s.size() == size_t{20});
  const std::vector<size_t> indices = {3, 0, 17, 5};
  const auto batch = uint8s.get_batch(indices);
  CHECK(batch.data.sizes() == torch::IntArrayRef({4, 3, 48, 48}));
  CHECK(batch.data.dtype() == torch::kByte);
  CHECK(batch.target.dtype() == torch::kLong);
  CHECK(batch.target.equal(torch::tensor({3, 0, 17, 5}, torch::kLong)));
  // The same samples through the steps one by one, without a dataset.
  for (size_t k = 0; k < indices.size(); ++k) {
    const auto& image =
        picture(60 + static_cast<int>(indices[k]) % 3 * 10, 80, static_cast<uint32_t>(indices[k]));
    const bool png = indices[k] % 5 == 0;
    train::Image expected;
    bool flip = false;
    Counter unused(0);
    pipeline.apply(
        sample_of("x", {{png ? "png" : "jpg", png ? encode_png(image) : encode_jpeg(image)}}),
        unused, expected, flip);
    CHECK(to_image(batch.data[static_cast<int64_t>(k)]).pixels == expected.pixels);
  }
  // Normalised: (x / 255 - mean) / std, as normalize_images makes it of the uint8s.
  train::ImageDataset floats(spec, train::ImagePipeline(pipeline).normalize());
  const auto normalized = floats.get_batch(indices).data;
  CHECK(normalized.dtype() == torch::kFloat);
  CHECK(torch::allclose(normalized, train::normalize_images(batch.data), 1e-5, 1e-5));
  CHECK_THROWS_AS(train::normalize_images(batch.data[0]), std::invalid_argument);
  // Flipped every time: each image mirrored.
  train::ImageDataset flipped(spec, train::ImagePipeline(pipeline).horizontal_flip(1.0));
  CHECK(flipped.get_batch(indices).data.equal(batch.data.flip(3)));
}

TEST_CASE(
    "a sample's random numbers come from the seed, the epoch and its index, not the "
    "thread or the batch") {
  TempDir dir;
  const auto spec = write_picture_shards(dir.path, 12);
  train::ImageDataset data(spec, train::ImagePipeline().random_resized_crop(32).horizontal_flip());
  const auto together = data.get_batch(std::vector<size_t>{4, 7, 9}).data;
  torch::Tensor alone;
  std::thread([&] { alone = data.get_batch(std::vector<size_t>{9}).data; }).join();
  CHECK(alone[0].equal(together[2]));
  data.set_epoch(1);
  CHECK_FALSE(data.get_batch(std::vector<size_t>{4, 7, 9}).data.equal(together));
  data.set_epoch(0);
  CHECK(data.get_batch(std::vector<size_t>{4, 7, 9}).data.equal(together));
  train::ImageDataset reseeded(
      spec, train::ImagePipeline().random_resized_crop(32).horizontal_flip().seed(5));
  CHECK_FALSE(reseeded.get_batch(std::vector<size_t>{4, 7, 9}).data.equal(together));
}

TEST_CASE("a user's decoder, step and target run on the loader's thread with the built-in steps") {
  TempDir dir;
  train::ShardWriter writer((dir.path / "raw-%06d.tar").string());
  for (int i = 0; i < 6; ++i) {
    // A format of the user's: "<height> <width> <value>" text, and a caption.
    writer.write(key_of("r", i), {{"txt", key_of("30 40 ", i * 40)},
                                  {"caption", std::string(static_cast<size_t>(i), 'a')}});
  }
  writer.close();
  auto steps =
      train::ImagePipeline()
          .decoder([](const train::Sample& sample, train::Image& out) {
            std::istringstream in{std::string(sample.at("txt"))};
            int height = 0, width = 0, value = 0;
            in >> height >> width >> value;
            out.resize(height, width);
            for (int y = 0; y < height; ++y) {
              for (int x = 0; x < width; ++x) {
                out.row(y)[3 * x] = static_cast<uint8_t>(value);
                out.row(y)[3 * x + 1] = static_cast<uint8_t>(x);
                out.row(y)[3 * x + 2] = static_cast<uint8_t>(y);
              }
            }
          })
          .center_crop(20)
          .step([](train::Image& image, train::ImageRandom&) {
            for (auto& v : image.pixels) v = static_cast<uint8_t>(v + 1);
          })
          .horizontal_flip(1.0)
          .target([](const train::Sample& sample) {
            return torch::tensor({static_cast<int64_t>(sample.at("caption").size()), int64_t{7}});
          });
  train::ImageDataset data((dir.path / "raw-*.tar").string(), steps);
  const auto batch = data.get_batch(std::vector<size_t>{2, 5});
  CHECK(batch.data.sizes() == torch::IntArrayRef({2, 3, 20, 20}));
  CHECK(batch.target.equal(torch::tensor({{2, 7}, {5, 7}})));
  // Channel 0: the value, plus the step's 1; channel 1: x from the centre
  // crop's left edge (10), plus 1, mirrored; channel 2: y from its top (5), plus 1.
  CHECK(batch.data[1][0].eq(201).all().item<bool>());
  CHECK(batch.data[0][1][0][0].item<int>() == 10 + 19 + 1);
  CHECK(batch.data[0][1][0][19].item<int>() == 10 + 0 + 1);
  CHECK(batch.data[0][2][19][0].item<int>() == 5 + 19 + 1);
}

TEST_CASE(
    "a corrupt image in a shard ends the batch naming the shard and the sample, or is "
    "skipped and counted where asked") {
  TempDir dir;
  train::ShardWriterOptions options;
  options.max_samples = 4;
  train::ShardWriter writer((dir.path / "train-%06d.tar").string(), options);
  for (int i = 0; i < 8; ++i) {
    auto bytes = encode_jpeg(picture(40, 40, static_cast<uint32_t>(i)));
    if (i == 6) bytes = bytes.substr(0, bytes.size() * 3 / 4);  // within the scan
    writer.write(key_of("k", i), {{"jpg", bytes}, {"cls", "1"}});
  }
  writer.close();
  const auto spec = (dir.path / "train-*.tar").string();
  const auto steps = train::ImagePipeline().random_resized_crop(16);
  train::ImageDataset strict(spec, steps);
  try {
    strict.get_batch(std::vector<size_t>{5, 6, 7});
    FAIL("no error");
  } catch (const train::ShardError& error) {
    const std::string message = error.what();
    CHECK(message.find("train-000001.tar, sample 2 (k6): JPEG: Premature end of JPEG file") !=
          std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
  }
  train::ImageDataset lenient(spec, steps, train::ShardOptions().skip_bad_samples(true));
  const auto batch = lenient.get_batch(std::vector<size_t>{5, 6, 7});
  CHECK(batch.data.size(0) == 2);
  CHECK(lenient.skipped() == 1);
}

TEST_CASE(
    "an ImageFolder's classes are its folders in name order, as torchvision's, and one "
    "without images is refused") {
  TempDir dir;
  const auto write = [](const fs::path& path, uint32_t seed) {
    fs::create_directories(path.parent_path());
    const auto image = picture(30, 30, seed);
    std::ofstream(path, std::ios::binary)
        << (path.extension() == ".png" ? encode_png(image) : encode_jpeg(image));
  };
  write(dir.path / "zebra" / "b.JPG", 1);
  write(dir.path / "zebra" / "a.png", 2);
  write(dir.path / "ant" / "x.jpeg", 3);
  write(dir.path / "bee" / "deeper" / "y.jpg", 4);
  std::ofstream(dir.path / "bee" / "notes.txt") << "not an image";
  auto data =
      train::ImageDataset::folder(dir.path.string(), train::ImagePipeline().center_crop(30));
  REQUIRE(data.size() == size_t{4});
  CHECK(data.counts() == std::vector<uint64_t>{4});
  CHECK(data.sampler_options().chunk_samples() == 1);
  // ant/x.jpeg (0), bee/deeper/y.jpg (1), zebra/a.png (2), zebra/b.JPG (2)
  CHECK(data.get_batch(std::vector<size_t>{0, 1, 2, 3}).target.equal(torch::tensor({0, 1, 2, 2})));
  const auto png = data.get_batch(std::vector<size_t>{2}).data[0];
  CHECK(to_image(png).pixels == picture(30, 30, 2).pixels);
  // A class folder without images would shift every later label: refused, named.
  fs::create_directories(dir.path / "cat");
  std::ofstream(dir.path / "cat" / "c.webp") << "x";
  CHECK_THROWS_WITH_AS(train::ImageDataset::folder(dir.path.string(), {}),
                       doctest::Contains("class folder cat of"), train::ShardError);
  CHECK_THROWS_WITH_AS(train::ImageDataset::folder((dir.path / "ant").string(), {}),
                       doctest::Contains("holds no folder"), train::ShardError);
}

TEST_CASE(
    "a flip before a crop crops the mirrored image; a crop larger than the image is padded "
    "with zeros") {
  // Exact pixels from a decoder of the user's: column x holds x, row y holds y.
  const auto ramp = [](const train::Sample&, train::Image& out) {
    out.resize(10, 41);
    for (int y = 0; y < 10; ++y) {
      for (int x = 0; x < 41; ++x) {
        out.row(y)[3 * x] = static_cast<uint8_t>(x);
        out.row(y)[3 * x + 1] = static_cast<uint8_t>(y);
        out.row(y)[3 * x + 2] = 7;
      }
    }
  };
  const auto sample = sample_of("r", {{"raw", ""}});
  Counter random(0);
  train::Image out;
  bool flip = false;
  // centre_crop(20) of 41 columns starts at round(10.5) = 10 (half to even);
  // of the mirrored ones, at original column 41 - 10 - 20 = 11, mirrored.
  train::ImagePipeline().decoder(ramp).horizontal_flip(1.0).center_crop(8).apply(sample, random,
                                                                                 out, flip);
  // centre_crop(8) of the mirrored columns starts at round(16.5) = 16: original
  // columns 24 down to 17, handed back unmirrored (17..24) with the flip to make.
  CHECK(flip);
  REQUIRE(out.width == 8);
  for (int x = 0; x < 8; ++x) CHECK(out.row(0)[3 * x] == 17 + x);
  train::ImagePipeline().decoder(ramp).horizontal_flip(1.0).center_crop(20).apply(sample, random,
                                                                                  out, flip);
  REQUIRE(out.width == 20);  // and 20 high: 5 rows of zeros above the image's 10
  CHECK(out.row(5)[0] == 11);
  CHECK(out.row(5)[3 * 19] == 30);
  train::ImagePipeline().decoder(ramp).center_crop(20).apply(sample, random, out, flip);
  CHECK_FALSE(flip);
  CHECK(out.row(5)[0] == 10);
  // Larger than the image: padded, as torchvision pads, the image in the middle.
  train::ImagePipeline().decoder(ramp).center_crop(14).apply(sample, random, out, flip);
  REQUIRE(out.height == 14);
  CHECK(out.row(0)[3 * 5 + 2] == 0);  // padding rows above: (14 - 10) / 2 = 2
  CHECK(out.row(1)[3 * 5 + 2] == 0);
  CHECK(out.row(2)[3 * 5 + 2] == 7);  // the image
  CHECK(out.row(2)[3 * 5 + 1] == 0);
  CHECK(out.row(13)[3 * 5 + 2] == 0);  // and below
}

TEST_CASE("a batch's tensor is used again only once nothing holds it") {
  TempDir dir;
  const auto spec = write_picture_shards(dir.path, 8);
  train::ImageDataset data(spec, train::ImagePipeline().center_crop(32));
  auto first = data.get_batch(std::vector<size_t>{0, 1});
  const auto kept = first.data.clone();
  const auto second = data.get_batch(std::vector<size_t>{2, 3});
  CHECK(first.data.data_ptr() != second.data.data_ptr());
  CHECK(first.data.equal(kept));  // still the first batch's images
  const void* address = first.data.data_ptr();
  first = {};
  const auto third = data.get_batch(std::vector<size_t>{4, 5});
  CHECK(third.data.data_ptr() == address);  // its memory, free again, used again
  CHECK_FALSE(third.data.equal(kept));
}

TEST_CASE(
    "the loader's threads default from the cores: all but one beside a GPU, few beside a "
    "CPU step") {
  CHECK(train::ImageDataset::default_workers(torch::kCPU, 2) == 1);
  CHECK(train::ImageDataset::default_workers(torch::kCPU, 16) == 2);
  CHECK(train::ImageDataset::default_workers(torch::Device(torch::kCUDA, 0), 8) == 7);
  CHECK(train::ImageDataset::default_workers(torch::Device(torch::kCUDA, 0), 1) == 1);
}

TEST_CASE("a pipeline's steps are checked as they are added") {
  CHECK_THROWS_AS(train::ImagePipeline().random_resized_crop(0), std::invalid_argument);
  CHECK_THROWS_AS(train::ImagePipeline().random_resized_crop(224, {0.9, 0.1}),
                  std::invalid_argument);
  CHECK_THROWS_AS(train::ImagePipeline().horizontal_flip(1.5), std::invalid_argument);
  CHECK_THROWS_AS(train::ImagePipeline().normalize({0, 0, 0}, {1, 0, 1}), std::invalid_argument);
  CHECK_THROWS_AS(train::ImagePipeline().step(nullptr), std::invalid_argument);
  // A copy edited leaves the original as it was (datasets share theirs).
  const auto base = train::ImagePipeline().center_crop(8);
  const auto normalized = train::ImagePipeline(base).normalize();
  CHECK_FALSE(base.normalizes());
  CHECK(normalized.normalizes());
}

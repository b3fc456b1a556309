// Dataset "idx": small IDX files written here (plain and gzip), their
// values, normalisation and limit, the errors for broken files, and the real
// Fashion-MNIST files where they are installed.
#include <stdlib.h>
#include <tessera/dataset.h>
#include <zlib.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <thread>
#include <vector>

#include "support/fixture.hpp"
#include "support/temp_dir.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_idx {

namespace {

namespace fs = std::filesystem;
namespace sdk = tessera::sdk;
using tessera::test::Fixture;

using TempDir = tessera::test::TempDir;

void put_be32(std::vector<uint8_t> &out, uint32_t v) {
  out.push_back(static_cast<uint8_t>(v >> 24));
  out.push_back(static_cast<uint8_t>(v >> 16));
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

std::vector<uint8_t> idx_bytes(uint32_t magic, const std::vector<uint32_t> &dims,
                               const std::vector<uint8_t> &data) {
  std::vector<uint8_t> out;
  put_be32(out, magic);
  for (uint32_t d : dims) put_be32(out, d);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_file(const std::string &path, const std::vector<uint8_t> &bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    if (!bytes.empty())
      REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
              static_cast<int>(bytes.size()));
    REQUIRE(gzclose(f) == Z_OK);
  } else {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char *>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out.good());
  }
}

// 5 images of 2 x 3 pixels, labels up to 7.
constexpr uint32_t kCount = 5, kRows = 2, kCols = 3, kPixels = kRows * kCols;
const std::vector<uint8_t> kLabels = {3, 0, 7, 1, 2};

uint8_t pixel(uint32_t image, uint32_t j) {
  if (image == 0 && j == 0) return 0;
  if (image == 0 && j == 1) return 255;
  return static_cast<uint8_t>((image * 53 + j * 17 + 1) % 256);
}

std::vector<uint8_t> pixels() {
  std::vector<uint8_t> out;
  for (uint32_t i = 0; i < kCount; ++i)
    for (uint32_t j = 0; j < kPixels; ++j) out.push_back(pixel(i, j));
  return out;
}

std::vector<uint8_t> image_file() {
  return idx_bytes(0x803, {kCount, kRows, kCols}, pixels());
}
std::vector<uint8_t> label_file() {
  return idx_bytes(0x801, {kCount}, kLabels);
}

std::string toml_for(const std::string &images, const std::string &labels,
                     const std::string &extra = "") {
  return "images = '" + images + "'\nlabels = '" + labels + "'\n" + extra;
}

// One dataset instance, destroyed at scope exit.
struct Dataset {
  Dataset(Fixture &f, const std::string &toml) {
    vt = f.vtable<tsr_dataset_vtable>("dataset", "idx");
    REQUIRE(vt != nullptr);
    REQUIRE(vt->struct_size >= sizeof(tsr_dataset_vtable));
    tsr_config *cfg = f.config("dataset", "idx", toml);
    status = vt->create(f.host.table(), cfg, "train", &self);
    if (status == TSR_OK) REQUIRE(self != nullptr);
  }
  ~Dataset() {
    if (self) vt->destroy(self);
  }
  Dataset(const Dataset &) = delete;
  Dataset &operator=(const Dataset &) = delete;

  tsr_data_info info() const {
    auto d = sdk::make<tsr_data_info>();
    REQUIRE(vt->info(self, &d) == TSR_OK);
    return d;
  }

  const tsr_dataset_vtable *vt = nullptr;
  void *self = nullptr;
  tsr_status status = TSR_OK;
};

// A host batch of n samples of `features` floats.
struct Batch {
  Batch(int64_t n, int64_t features)
      : x(static_cast<size_t>(n * features), -99.f), y(static_cast<size_t>(n), -99) {
    in_shape[0] = n;
    in_shape[1] = features;
    tg_shape[0] = n;
    b = sdk::make<tsr_batch>();
    b.size = n;
    b.inputs = sdk::view(x.data(), DLDevice{kDLCPU, 0}, sdk::dtype_f32(), 2, in_shape);
    b.targets = sdk::view(y.data(), DLDevice{kDLCPU, 0}, sdk::dtype_i32(), 1, tg_shape);
  }
  std::vector<float> x;
  std::vector<int32_t> y;
  int64_t in_shape[2];
  int64_t tg_shape[1];
  tsr_batch b;
};

tsr_status read(Dataset &d, const std::vector<int64_t> &idx, Batch &batch) {
  return d.vt->read(d.self, idx.data(), &batch.b);
}

// Creates a dataset expected to fail; returns the host's message.
std::string create_error(Fixture &f, const std::string &toml, tsr_status expected) {
  Dataset d(f, toml);
  CHECK(d.status == expected);
  CHECK(d.self == nullptr);
  return f.host.last_error();
}

}  // namespace

TEST_CASE("idx reads plain and gzip files", "[idx]") {
  for (bool gzip : {false, true}) {
    INFO((gzip ? "gzip" : "plain"));
    TempDir dir;
    const std::string images = dir.file(gzip ? "img.gz" : "img"),
                      labels = dir.file(gzip ? "lab.gz" : "lab");
    write_file(images, image_file(), gzip);
    write_file(labels, label_file(), gzip);
    Fixture f;
    Dataset d(f, toml_for(images, labels));
    INFO(f.host.last_error());
    REQUIRE(d.status == TSR_OK);

    const tsr_data_info info = d.info();
    CHECK(info.length == kCount);
    CHECK(info.input_dtype.code == kDLFloat);
    CHECK(info.input_dtype.bits == 32);
    CHECK(info.input_dtype.lanes == 1);
    CHECK(info.input_ndim == 1);
    CHECK(info.input_shape[0] == kPixels);
    CHECK(info.target_dtype.code == kDLInt);
    CHECK(info.target_dtype.bits == 32);
    CHECK(info.target_ndim == 0);
    CHECK(info.num_classes == 8);

    const std::vector<int64_t> idx = {4, 0, 2, 0};
    Batch batch(4, kPixels);
    REQUIRE(read(d, idx, batch) == TSR_OK);
    for (size_t i = 0; i < idx.size(); ++i) {
      CHECK(batch.y[i] == kLabels[static_cast<size_t>(idx[i])]);
      for (uint32_t j = 0; j < kPixels; ++j)
        CHECK(batch.x[i * kPixels + j] ==
              Approx(pixel(static_cast<uint32_t>(idx[i]), j) / 255.0).epsilon(1e-6));
    }
    CHECK(batch.x[kPixels + 0] == 0.0f);  // image 0, pixel 0 = 0
    CHECK(batch.x[kPixels + 1] == 1.0f);  // image 0, pixel 1 = 255
  }
}

TEST_CASE("idx normalisation: mean, std, and raw pixels", "[idx]") {
  TempDir dir;
  const std::string images = dir.file("img"), labels = dir.file("lab");
  write_file(images, image_file(), false);
  write_file(labels, label_file(), false);
  Fixture f;
  const std::vector<int64_t> idx = {0, 1, 2, 3, 4};

  Dataset standard(f, toml_for(images, labels, "mean = 0.2860\nstd = 0.3530"));
  REQUIRE(standard.status == TSR_OK);
  Batch a(5, kPixels);
  REQUIRE(read(standard, idx, a) == TSR_OK);

  Dataset raw(f, toml_for(images, labels, "normalize = false"));
  REQUIRE(raw.status == TSR_OK);
  Batch b(5, kPixels);
  REQUIRE(read(raw, idx, b) == TSR_OK);

  for (uint32_t i = 0; i < kCount; ++i) {
    for (uint32_t j = 0; j < kPixels; ++j) {
      const double p = pixel(i, j);
      CHECK(a.x[i * kPixels + j] == Approx((p / 255.0 - 0.2860) / 0.3530).epsilon(1e-6));
      CHECK(b.x[i * kPixels + j] == static_cast<float>(p));
    }
  }
}

TEST_CASE("idx limit keeps the first samples", "[idx]") {
  TempDir dir;
  const std::string images = dir.file("img"), labels = dir.file("lab.gz");
  write_file(images, image_file(), false);
  write_file(labels, label_file(), true);
  Fixture f;
  Dataset d(f, toml_for(images, labels, "limit = 2"));
  REQUIRE(d.status == TSR_OK);
  const tsr_data_info info = d.info();
  CHECK(info.length == 2);
  CHECK(info.num_classes == 8);  // from the whole labels file, not the first two
  Batch ok(2, kPixels);
  REQUIRE(read(d, {1, 0}, ok) == TSR_OK);
  CHECK(ok.y[0] == 0);
  CHECK(ok.y[1] == 3);
  Batch bad(1, kPixels);
  CHECK(read(d, {2}, bad) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("index 2"));

  Dataset all(f, toml_for(images, labels, "limit = 100"));
  REQUIRE(all.status == TSR_OK);
  CHECK(all.info().length == kCount);
}

TEST_CASE("idx read checks indices and the batch", "[idx]") {
  TempDir dir;
  const std::string images = dir.file("img"), labels = dir.file("lab");
  write_file(images, image_file(), false);
  write_file(labels, label_file(), false);
  Fixture f;
  Dataset d(f, toml_for(images, labels));
  REQUIRE(d.status == TSR_OK);

  Batch one(1, kPixels);
  CHECK(read(d, {5}, one) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("index 5"));
  CHECK(read(d, {-1}, one) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("index -1"));

  Batch wrong_width(1, kPixels + 1);
  CHECK(read(d, {0}, wrong_width) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("inputs"));

  Batch wrong_dtype(1, kPixels);
  wrong_dtype.b.targets.dtype = sdk::dtype_f32();
  CHECK(read(d, {0}, wrong_dtype) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("targets"));

  Batch short_batch(2, kPixels);
  short_batch.b.size = 3;  // more samples than the tensors hold
  CHECK(read(d, {0, 1, 2}, short_batch) == TSR_ERR_INVALID);

  Batch empty(0, kPixels);
  CHECK(read(d, {}, empty) == TSR_OK);
}

TEST_CASE("idx reads concurrently", "[idx]") {
  TempDir dir;
  const std::string images = dir.file("img.gz"), labels = dir.file("lab.gz");
  write_file(images, image_file(), true);
  write_file(labels, label_file(), true);
  Fixture f;
  Dataset d(f, toml_for(images, labels));
  REQUIRE(d.status == TSR_OK);
  Batch expect(5, kPixels);
  REQUIRE(read(d, {0, 1, 2, 3, 4}, expect) == TSR_OK);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int k = 0; k < 200; ++k) {
        Batch b(5, kPixels);
        if (d.vt->read(d.self, std::vector<int64_t>{0, 1, 2, 3, 4}.data(), &b.b) != TSR_OK ||
            b.x != expect.x || b.y != expect.y)
          ++mismatches;
      }
    });
  }
  for (auto &t : threads) t.join();
  CHECK(mismatches == 0);
}

TEST_CASE("idx errors name the file", "[idx]") {
  TempDir dir;
  const std::string images = dir.file("img"), labels = dir.file("lab");
  write_file(images, image_file(), false);
  write_file(labels, label_file(), false);
  Fixture f;

  SECTION("missing file") {
    const std::string missing = dir.file("no-such-images.gz");
    const std::string msg = create_error(f, toml_for(missing, labels), TSR_ERR_IO);
    CHECK_THAT(msg, Catch::Contains(missing));
  }
  SECTION("truncated plain file") {
    auto bytes = image_file();
    bytes.pop_back();
    const std::string cut = dir.file("cut");
    write_file(cut, bytes, false);
    const std::string msg = create_error(f, toml_for(cut, labels), TSR_ERR_INVALID);
    CHECK_THAT(msg, Catch::Contains(cut) && Catch::Contains("truncated"));
  }
  SECTION("truncated gzip stream") {
    const std::string whole = dir.file("whole.gz"), cut = dir.file("cut.gz");
    std::vector<uint8_t> big(kCount * kPixels * 1000);
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7919 % 251);
    write_file(whole, idx_bytes(0x803, {kCount * 1000, kRows, kCols}, big), true);
    std::ifstream in(whole, std::ios::binary);
    std::vector<char> gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    gz.resize(gz.size() / 2);
    std::ofstream(cut, std::ios::binary).write(gz.data(), static_cast<std::streamsize>(gz.size()));
    const std::string msg = create_error(f, toml_for(cut, labels), TSR_ERR_INVALID);
    CHECK_THAT(msg, Catch::Contains(cut) && Catch::Contains("truncated"));
  }
  SECTION("header promises more than the file holds") {
    const std::string liar = dir.file("liar");
    write_file(liar, idx_bytes(0x803, {60000, 28, 28}, {1, 2, 3}), false);
    const std::string msg = create_error(f, toml_for(liar, labels), TSR_ERR_INVALID);
    CHECK_THAT(msg, Catch::Contains(liar) && Catch::Contains("truncated"));
  }
  SECTION("header over the size cap") {
    const std::string huge = dir.file("huge");
    write_file(huge, idx_bytes(0x803, {0xffffffffu, 0xffffffffu, 0xffffffffu}, {1}), false);
    const std::string msg = create_error(f, toml_for(huge, labels), TSR_ERR_INVALID);
    CHECK_THAT(msg, Catch::Contains(huge) && Catch::Contains("GiB"));
  }
  SECTION("trailing data") {
    auto bytes = image_file();
    bytes.push_back(0);
    const std::string longer = dir.file("longer");
    write_file(longer, bytes, false);
    const std::string msg = create_error(f, toml_for(longer, labels), TSR_ERR_INVALID);
    CHECK_THAT(msg, Catch::Contains(longer));
  }
  SECTION("wrong magic") {
    // Labels given as images, and a file that is not IDX at all.
    std::string msg = create_error(f, toml_for(labels, labels), TSR_ERR_INVALID);
    CHECK_THAT(msg, Catch::Contains(labels) && Catch::Contains("magic"));
    msg = create_error(f, toml_for(images, images), TSR_ERR_INVALID);
    CHECK_THAT(msg, Catch::Contains(images) && Catch::Contains("magic"));
    const std::string text = dir.file("text.gz");
    const std::string hello = "hello, this is not an IDX file";
    write_file(text, std::vector<uint8_t>(hello.begin(), hello.end()), true);
    msg = create_error(f, toml_for(text, labels), TSR_ERR_INVALID);
    CHECK_THAT(msg, Catch::Contains(text) && Catch::Contains("not an IDX file"));
    const std::string floats = dir.file("floats");
    write_file(floats, idx_bytes(0x0d03, {1, 1, 1}, {0, 0, 0, 0}), false);
    msg = create_error(f, toml_for(floats, labels), TSR_ERR_INVALID);
    CHECK_THAT(msg, Catch::Contains(floats) && Catch::Contains("unsigned byte"));
  }
  SECTION("empty file") {
    const std::string empty = dir.file("empty");
    write_file(empty, {}, false);
    const std::string msg = create_error(f, toml_for(images, empty), TSR_ERR_INVALID);
    CHECK_THAT(msg, Catch::Contains(empty));
  }
  SECTION("count mismatch") {
    const std::string four = dir.file("four");
    write_file(four, idx_bytes(0x801, {4}, {0, 1, 2, 3}), false);
    const std::string msg = create_error(f, toml_for(images, four), TSR_ERR_INVALID);
    CHECK_THAT(msg, Catch::Contains(images) && Catch::Contains(four));
    CHECK_THAT(msg, Catch::Contains("5 images") && Catch::Contains("4 labels"));
  }
  SECTION("std must be positive") {
    const std::string msg = create_error(f, toml_for(images, labels, "std = 0.0"), TSR_ERR_CONFIG);
    CHECK_THAT(msg, Catch::Contains("std"));
  }
}

TEST_CASE("idx loads Fashion-MNIST", "[idx]") {
  const std::string root = "/usr/share/datasets/fashion-mnist/";
  const std::string images = root + "train-images-idx3-ubyte.gz",
                    labels = root + "train-labels-idx1-ubyte.gz";
  if (!fs::exists(images) || !fs::exists(labels)) {
    WARN("Fashion-MNIST is not installed under " << root << "; skipped");
    return;
  }
  Fixture f;
  Dataset d(f, toml_for(images, labels));
  INFO(f.host.last_error());
  REQUIRE(d.status == TSR_OK);
  const tsr_data_info info = d.info();
  CHECK(info.length == 60000);
  CHECK(info.input_ndim == 1);
  CHECK(info.input_shape[0] == 784);
  CHECK(info.num_classes == 10);

  Batch b(3, 784);
  REQUIRE(read(d, {0, 1, 59999}, b) == TSR_OK);
  // The first training labels of Fashion-MNIST: ankle boot (9), T-shirt (0);
  // the last is 5 (sandal).
  CHECK(b.y[0] == 9);
  CHECK(b.y[1] == 0);
  CHECK(b.y[2] == 5);
  for (float v : b.x) {
    CHECK(v >= 0.0f);
    CHECK(v <= 1.0f);
  }

  const std::string t_images = root + "t10k-images-idx3-ubyte.gz",
                    t_labels = root + "t10k-labels-idx1-ubyte.gz";
  if (fs::exists(t_images) && fs::exists(t_labels)) {
    Dataset t(f, toml_for(t_images, t_labels, "limit = 1000"));
    REQUIRE(t.status == TSR_OK);
    CHECK(t.info().length == 1000);
    CHECK(t.info().num_classes == 10);
  }
}

}  // namespace unit_test_idx

// Host memory while a rank imports a checkpoint (`[model] init_from`):
// the loader maps the files and converts them tensor by tensor, dropping
// each tensor's pages once converted, and writes only the parameters the
// rank keeps into a buffer of untouched zero pages. Measured in a child
// process (its VmHWM, reset at its start): importing an F64 checkpoint
// twice the size of the fp32 parameters the rank keeps must peak under
// (what it keeps + one tensor of the file) + 10%. Reading the file whole
// (the loader before issue 51) peaks at three times what the rank keeps;
// keeping the pages mapped, at that plus the file; a full buffer at ZeRO
// stage 3, at twice the slice: each fails the bound. And the conversions:
// F32, F16, BF16 and F64 tensors load bit for bit where the value fits,
// only into the kept ranges.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <tessera/cpp/formats/safetensors.hpp>
#include <tessera/cpp/half.hpp>
#include <vector>

#include "plugin/layout.hpp"
#include "train/init_from.hpp"
#include "util/zeroed_pages.hpp"

namespace unit_test_init_from_memory {

namespace fs = std::filesystem;
namespace st = tessera::formats::safetensors;

namespace {

constexpr int kTensors = 8;
constexpr int64_t kRows = 256, kCols = 4096;  // 1 Mi elements: 4 MiB fp32, 8 MiB in F64
constexpr size_t kNumel = static_cast<size_t>(kRows * kCols);

double value_of(int tensor, size_t i) {
  return static_cast<double>(tensor) + static_cast<double>(i % 1000) * 1e-3;
}

std::string tensor_name(int k) {
  std::string name = "w";  // (not "w" + ...: GCC 12's -Wrestrict misfires on that)
  name += std::to_string(k);
  return name;
}

// kTensors parameters, one group each, laid out for 2 ranks.
tessera::Layout make_test_layout() {
  tessera::Layout l;
  l.world = 2;
  for (int k = 0; k < kTensors; ++k) {
    tessera::ParamSlot p;
    p.name = tensor_name(k);
    p.shape = {kRows, kCols};
    p.group = static_cast<uint32_t>(k);
    p.offset = l.total;
    p.numel = kNumel;
    p.init = TSR_INIT_NORMAL;
    p.init_b = 0.02f;
    l.params.push_back(p);
    l.group_offset.push_back(l.total);
    l.group_size.push_back(kNumel);
    l.total += kNumel;
  }
  l.numel = l.trainable_numel = l.total;
  return l;
}

// The checkpoint, F64 (twice the fp32 parameters), written one tensor at a
// time so that this process never holds it whole either.
void write_checkpoint(const std::string &path) {
  std::vector<st::Tensor> tensors;
  for (int k = 0; k < kTensors; ++k)
    tensors.push_back({tensor_name(k), "F64", {kRows, kCols}, nullptr, kNumel * 8});
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const std::string head = st::prefix(tensors, {{"format", "pt"}});
  out.write(head.data(), static_cast<std::streamsize>(head.size()));
  std::vector<double> buf(kNumel);
  for (int k = 0; k < kTensors; ++k) {
    for (size_t i = 0; i < kNumel; ++i) buf[i] = value_of(k, i);
    out.write(reinterpret_cast<const char *>(buf.data()),
              static_cast<std::streamsize>(buf.size() * 8));
  }
  REQUIRE(out.good());
}

// A field of /proc/self/status in bytes ("VmHWM", "VmRSS").
size_t status_bytes(const char *field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(key.size())) * 1024;
  return 0;
}

struct Measured {
  size_t base = 0, peak = 0, kept_bytes = 0, wrong = 0, touched_outside = 0;
};

// In the child: what a session does (a zero-page buffer, the kept parts
// initialised, then loaded from the file), and the peak it costs.
Measured import_in_child(const std::string &file, bool partitioned) {
  Measured m;
  {
    std::ofstream reset("/proc/self/clear_refs");
    reset << "5";  // the peak starts at the current RSS (Linux >= 4.0)
  }
  m.base = std::max(status_bytes("VmHWM"), status_bytes("VmRSS"));
  const tessera::Layout layout = make_test_layout();
  const std::vector<tessera::FlatRange> keep = tessera::kept_ranges(layout, partitioned, 1);
  for (const auto &r : keep) m.kept_bytes += r.count * sizeof(float);
  tessera::ZeroedPages<float> flat(layout.total);
  tessera::init_params(layout, flat.data(), 7, &keep);
  tessera::init_from_safetensors(file, layout, flat.data(), &keep);
  m.peak = status_bytes("VmHWM");
  for (int k = 0; k < kTensors; ++k) {
    const tessera::ParamSlot &p = layout.params[static_cast<size_t>(k)];
    for (const auto &[a, b] : tessera::kept_parts(&keep, p.offset, p.numel))
      for (size_t i = a; i < b; ++i)
        m.wrong += flat.data()[p.offset + i] != static_cast<float>(value_of(k, i));
  }
  for (size_t i = 0; i < layout.total; ++i) {
    bool kept = false;
    for (const auto &r : keep) kept = kept || (i >= r.begin && i < r.begin + r.count);
    if (!kept && flat.data()[i] != 0.f) ++m.touched_outside;
  }
  return m;
}

Measured measure(const std::string &file, bool partitioned) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    int code = 0;
    try {
      const Measured m = import_in_child(file, partitioned);
      code = ::write(fds[1], &m, sizeof m) == static_cast<ssize_t>(sizeof m) ? 0 : 2;
    } catch (const std::exception &e) {
      std::fprintf(stderr, "import failed: %s\n", e.what());
      code = 1;
    }
    ::_exit(code);
  }
  ::close(fds[1]);
  Measured m;
  const ssize_t got = ::read(fds[0], &m, sizeof m);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(got == static_cast<ssize_t>(sizeof m));
  return m;
}

}  // namespace

TEST_CASE("init_from's peak host memory: what the rank keeps + one tensor + 10%",
          "[init_from][memory]") {
  const fs::path dir =
      fs::temp_directory_path() / ("tessera-init-from-rss-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "model.safetensors").string();
  write_checkpoint(file);
  const size_t one_tensor = kNumel * 8, file_bytes = kTensors * one_tensor;
  for (const bool partitioned : {false, true}) {
    // Stages 0-2 keep every parameter; stage 3 (rank 1 of 2) half of each.
    const Measured m = measure(file, partitioned);
    const double bound = 1.1 * static_cast<double>(m.kept_bytes + one_tensor);
    const double used = static_cast<double>(m.peak) - static_cast<double>(m.base);
    INFO((partitioned ? "stage 3, rank 1 of 2" : "stages 0-2")
         << ": file " << file_bytes / 1048576.0 << " MiB, kept " << m.kept_bytes / 1048576.0
         << " MiB, peak over the start " << used / 1048576.0 << " MiB, bound " << bound / 1048576.0
         << " MiB");
    CHECK(file_bytes >= 2 * m.kept_bytes);
#if defined(__SANITIZE_ADDRESS__)
    // ASan's allocator, quarantine and shadow pages make the peak RSS say
    // nothing about the loader: the bound is held in the plain builds.
    (void)bound;
    (void)used;
#else
    CHECK(used <= bound);
    CHECK(used >= 0.9 * static_cast<double>(m.kept_bytes));  // the measure sees the kept part
#endif
    CHECK(m.wrong == 0);
    CHECK(m.touched_outside == 0);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST_CASE("init_from converts F32, F16, BF16 and F64, and writes only the kept ranges",
          "[init_from]") {
  // Values each dtype holds exactly (F16: its largest and smallest
  // subnormal; BF16: a large exponent), so each must come back bit for bit.
  const std::vector<float> values = {0.f,      -2.5f, 0.375f,  1024.f, 65504.f, -1.f,
                                     0x1p-24f, 3.f,   -0.125f, 7.f,    0.0625f, -96.f,
                                     1.5f,     2.f,   -4.f,    0.5f};
  // The BF16 tensor's: beyond F16's range.
  const std::vector<float> big = {0x1p126f, -3.f, 0.25f, 0x1.8p-120f};
  std::vector<float> f32 = values;
  std::vector<uint16_t> f16, bf16;
  for (float v : values) f16.push_back(tessera::sdk::float_to_f16(v));
  for (float v : big) bf16.push_back(tessera::sdk::float_to_bf16(v));
  std::vector<double> f64(values.begin(), values.end());
  const int64_t n = static_cast<int64_t>(values.size()), nb = static_cast<int64_t>(big.size());
  const std::vector<st::Tensor> tensors = {{"a", "F32", {2, n / 2}, f32.data(), f32.size() * 4},
                                           {"b", "F16", {2, n / 2}, f16.data(), f16.size() * 2},
                                           {"c", "BF16", {nb}, bf16.data(), bf16.size() * 2},
                                           {"d", "F64", {2, n / 2}, f64.data(), f64.size() * 8}};
  const fs::path dir =
      fs::temp_directory_path() / ("tessera-init-from-dtypes-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  st::write((dir / "model.safetensors").string(), tensors, {});
  tessera::Layout l;
  l.world = 2;
  for (const auto &t : tensors) {
    tessera::ParamSlot p;
    p.name = t.name;
    p.shape = t.shape;
    p.group = static_cast<uint32_t>(l.params.size());
    p.offset = l.total;
    p.numel = t.name == "c" ? big.size() : values.size();
    l.params.push_back(p);
    l.group_offset.push_back(l.total);
    l.group_size.push_back(p.numel);
    l.total += p.numel;
  }
  for (const bool partitioned : {false, true}) {
    INFO((partitioned ? "rank 1 of 2's slices" : "everything"));
    const std::vector<tessera::FlatRange> keep = tessera::kept_ranges(l, partitioned, 1);
    std::vector<float> flat(l.total, -7.f);
    tessera::init_from_safetensors(dir.string(), l, flat.data(), &keep);
    for (const tessera::ParamSlot &p : l.params) {
      const std::vector<float> &want = p.name == "c" ? big : values;
      const auto parts = tessera::kept_parts(&keep, p.offset, p.numel);
      for (size_t i = 0; i < p.numel; ++i) {
        INFO(p.name << "[" << i << "]");
        bool kept = false;
        for (const auto &[a, b] : parts) kept = kept || (i >= a && i < b);
        CHECK(flat[p.offset + i] == (kept ? want[i] : -7.f));
      }
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace unit_test_init_from_memory

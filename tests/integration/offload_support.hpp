// What the offload tests share (test_offload.cpp, test_offload_clip.cpp):
// a run's final parameters through `tessera ckpt export`, their comparison
// bit for bit, and the [offload] section of a test config.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "harness.hpp"

namespace tessera::itest::offload_support {

inline std::map<std::string, F32Tensor> exported(const fs::path &run_dir, const std::string &name) {
  const fs::path out = scratch() / (name + ".safetensors");
  RunResult r = run_cli({"ckpt", "export", (run_dir / "ckpt").string(), "-o", out.string()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  return read_safetensors_f32(out);
}

// Largest |a - b| / |b| over every parameter (|b| floored at 1e-30), and
// whether every value is bitwise equal.
struct Diff {
  double rel = 0;
  bool bitwise = true;
};
inline Diff compare(const std::map<std::string, F32Tensor> &a,
                    const std::map<std::string, F32Tensor> &b) {
  REQUIRE(a.size() == b.size());
  Diff d;
  for (const auto &[name, t] : b) {
    auto it = a.find(name);
    REQUIRE(it != a.end());
    REQUIRE(it->second.data.size() == t.data.size());
    for (size_t i = 0; i < t.data.size(); ++i) {
      const float x = it->second.data[i], y = t.data[i];
      if (std::memcmp(&x, &y, sizeof x) != 0) d.bitwise = false;
      d.rel = std::max(d.rel, std::fabs(double(x) - y) / std::max(std::fabs(double(y)), 1e-30));
    }
  }
  return d;
}

// The [offload] section for `plugin` (4 threads; nvme's path and small
// blocks; a GPU share where `ratio` is given).
inline std::string offload_section(const std::string &plugin, const fs::path &nvme_dir = {},
                                   const std::string &ratio = "") {
  std::string s = "\n[offload]\nplugin = \"" + plugin + "\"\nthreads = 4\n";
  if (plugin == "nvme") s += "path = \"" + nvme_dir.string() + "\"\nsub_group_size = 4096\n";
  if (!ratio.empty()) s += "ratio = \"" + ratio + "\"\n";
  return s;
}

}  // namespace tessera::itest::offload_support

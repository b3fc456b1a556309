#include "support/safetensors_read.hpp"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace tessera::test {

std::map<std::string, RefTensor> read_safetensors(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  uint64_t hlen = 0;
  in.read(reinterpret_cast<char *>(&hlen), 8);
  std::string header(hlen, '\0');
  in.read(header.data(), static_cast<std::streamsize>(hlen));
  std::vector<char> body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto j = nlohmann::json::parse(header);
  std::map<std::string, RefTensor> out;
  for (auto &[name, t] : j.items()) {
    if (name == "__metadata__") continue;
    RefTensor r;
    for (auto d : t["shape"]) r.shape.push_back(d.get<int64_t>());
    size_t b = t["data_offsets"][0], e = t["data_offsets"][1];
    std::string dt = t["dtype"];
    const char *p = body.data() + b;
    auto take = [&](auto tag) {
      using T = decltype(tag);
      size_t n = (e - b) / sizeof(T);
      for (size_t i = 0; i < n; ++i) {
        T v;
        std::memcpy(&v, p + i * sizeof(T), sizeof(T));
        r.data.push_back(static_cast<double>(v));
      }
    };
    if (dt == "F64")
      take(double{});
    else if (dt == "F32")
      take(float{});
    else if (dt == "I64")
      take(int64_t{});
    else if (dt == "I32")
      take(int32_t{});
    else
      throw std::runtime_error(path + ": unsupported dtype " + dt);
    out[name] = std::move(r);
  }
  return out;
}

}  // namespace tessera::test

#include "train/model_file.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.hpp"
#include "util/safetensors.hpp"

namespace fs = std::filesystem;

namespace tessera {

namespace {

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

void write_text_atomic(const fs::path &path, const std::string &text) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw Error(TSR_ERR_IO, tmp.string() + ": write failed");
  }
  fs::rename(tmp, path);
}

}  // namespace

std::string save_model_checkpoint(const std::string &ckpt_dir, int64_t step, const Layout &layout,
                                  const float *flat, const std::string &config_toml, int64_t keep) {
  fs::path root(ckpt_dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec)
    throw Error(TSR_ERR_IO, ckpt_dir + ": cannot create checkpoint directory: " + ec.message());
  fs::path dir = root / step_name(step);
  fs::create_directories(dir, ec);
  if (ec) throw Error(TSR_ERR_IO, dir.string() + ": cannot create: " + ec.message());
  std::vector<StTensor> tensors;
  nlohmann::json params = nlohmann::json::array();
  for (const auto &p : layout.params) {
    tensors.push_back(StTensor{p.name, "F32", p.shape, flat + p.offset, p.numel * sizeof(float)});
    params.push_back(
        {{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"group", p.group}});
  }
  safetensors_write((dir / "model.safetensors").string(), tensors, {{"format", "tessera"}});
  nlohmann::json manifest = {
      {"format", "tessera-checkpoint"}, {"version", 1},     {"step", step},
      {"world_size", layout.world},     {"params", params}, {"config", config_toml},
      {"files", {"model.safetensors"}}};
  write_text_atomic(dir / "manifest.json", manifest.dump(2) + "\n");
  write_text_atomic(root / "latest", step_name(step) + "\n");
  // Older checkpoints beyond `keep` go only after the new one is complete.
  std::vector<fs::path> steps;
  for (const auto &e : fs::directory_iterator(root, ec))
    if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0)
      steps.push_back(e.path());
  std::sort(steps.begin(), steps.end());
  while (keep > 0 && static_cast<int64_t>(steps.size()) > keep) {
    fs::remove_all(steps.front(), ec);
    steps.erase(steps.begin());
  }
  return dir.string();
}

std::string load_model_params(const std::string &path, const Layout &layout, float *flat) {
  fs::path p(path);
  if (fs::is_directory(p) && fs::exists(p / "latest")) {
    std::ifstream in(p / "latest");
    std::string name;
    std::getline(in, name);
    if (name.empty() || name.find('/') != std::string::npos)
      throw Error(TSR_ERR_INVALID, (p / "latest").string() + ": does not name a checkpoint");
    p /= name;
  }
  if (fs::is_directory(p)) p /= "model.safetensors";
  if (!fs::exists(p))
    throw Error(TSR_ERR_IO, path +
                                ": no checkpoint here (expected a step_ directory, a checkpoint "
                                "root with 'latest', or a .safetensors file)");
  SafetensorsFile f(p.string());
  for (const auto &slot : layout.params) {
    auto it = f.tensors().find(slot.name);
    if (it == f.tensors().end())
      throw Error(TSR_ERR_INVALID, p.string() + ": missing parameter '" + slot.name + "'");
    const StTensor &t = it->second;
    if (t.shape != slot.shape)
      throw Error(TSR_ERR_INVALID, p.string() + ": parameter '" + slot.name +
                                       "' has another shape than the model declares");
    if (t.dtype == "F32") {
      std::memcpy(flat + slot.offset, t.data, slot.numel * sizeof(float));
    } else if (t.dtype == "F64") {
      const auto *d = static_cast<const char *>(t.data);
      for (size_t i = 0; i < slot.numel; ++i) {
        double v;
        std::memcpy(&v, d + i * 8, 8);
        flat[slot.offset + i] = static_cast<float>(v);
      }
    } else {
      throw Error(TSR_ERR_UNSUPPORTED, p.string() + ": parameter '" + slot.name + "' has dtype " +
                                           t.dtype + " (F32 or F64 expected)");
    }
  }
  return p.string();
}

}  // namespace tessera

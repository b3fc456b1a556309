// A shard's own safetensors header against the manifest (shard_reader.hpp):
// the manifest says where each tensor's bytes lie and which elements of
// which slot they are, the header says the same in the shard itself. The
// manifest's checksum only shows the manifest is as its writer left it, and
// anyone who edits it can recompute that; the header is covered by the
// file's CRC, and agreeing with it binds each tensor's bytes to its name.
#include <cstring>
#include <nlohmann/json.hpp>

#include "ckpt/shard_reader.hpp"

namespace tessera {

std::vector<StoredTensor> stored_tensors(const nlohmann::json &m) {
  std::vector<StoredTensor> out;
  for (const auto &f : m.at("files")) {
    for (const auto &t : f.at("tensors")) {
      StoredTensor p;
      p.file = f.at("name").get<std::string>();
      p.name = t.at("name").get<std::string>();
      p.slot = t.at("slot").get<std::string>();
      p.start = t.at("start").get<size_t>();
      p.count = t.at("count").get<size_t>();
      p.offset = t.at("offset").get<size_t>();
      p.blocks = t.at("block_crc32").get<std::vector<uint32_t>>();
      out.push_back(std::move(p));
    }
  }
  return out;
}

namespace {

// Why header entry `e` is not tensor `t` of a file whose data starts at
// `data_start`, or "".
std::string entry_mismatch(const nlohmann::json &e, const StoredTensor &t, size_t data_start) {
  if (!e.is_object() || e.value("dtype", nlohmann::json()) != "F32")
    return "is not an F32 tensor there";
  if (e.value("shape", nlohmann::json()) != nlohmann::json::array({t.count}))
    return "has shape " + e.value("shape", nlohmann::json()).dump() + " there, the manifest [" +
           std::to_string(t.count) + "]";
  const nlohmann::json want =
      nlohmann::json::array({t.offset - data_start, t.offset - data_start + t.count * 4});
  if (e.value("data_offsets", nlohmann::json()) != want)
    return "lies at data bytes " + e.value("data_offsets", nlohmann::json()).dump() +
           " there, the manifest says " + want.dump();
  return "";
}

}  // namespace

std::string shard_header_mismatch(const std::string &prefix, uint64_t file_bytes,
                                  const std::vector<const StoredTensor *> &tensors) {
  if (prefix.size() < 8) return "too short for a safetensors header";
  uint64_t hlen = 0;
  std::memcpy(&hlen, prefix.data(), 8);
  // The data starts right after the header: where the manifest's first
  // tensor starts (the caller read exactly that much), or the file's end.
  if (hlen != prefix.size() - 8)
    return "its safetensors header ends at byte " + std::to_string(hlen + 8) +
           ", the manifest's tensors start at " + std::to_string(prefix.size());
  nlohmann::json h = nlohmann::json::parse(prefix.begin() + 8, prefix.end(), nullptr, false);
  if (!h.is_object()) return "its safetensors header is not a JSON object";
  const size_t data_start = prefix.size();
  size_t listed = 0;
  for (const auto &item : h.items())
    if (item.key() != "__metadata__") ++listed;
  if (listed != tensors.size())
    return "its header lists " + std::to_string(listed) + " tensor(s), the manifest " +
           std::to_string(tensors.size());
  if (data_start > file_bytes) return "its header runs past the file";
  for (const StoredTensor *t : tensors) {
    // The name the writer gives the piece of slot S from element N.
    const std::string named = t->slot + "@" + std::to_string(t->start);
    if (t->name != named)
      return "the manifest lists tensor '" + t->name + "' as slot '" + t->slot + "' from element " +
             std::to_string(t->start) + ", which would be named '" + named + "'";
    const auto it = h.find(t->name);
    if (it == h.end()) return "its header has no tensor '" + t->name + "'";
    if (std::string why = entry_mismatch(*it, *t, data_start); !why.empty())
      return "tensor '" + t->name + "' " + why;
  }
  return "";
}

}  // namespace tessera

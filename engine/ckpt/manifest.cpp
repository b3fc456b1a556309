#include "ckpt/manifest.hpp"

#include <limits>

#include "util/error.hpp"

namespace tessera {

namespace {

// Bounds that no real checkpoint comes near and that keep every product and
// sum below 2^63.
constexpr uint64_t kMaxElements = uint64_t{1} << 50;
constexpr uint64_t kMaxFileBytes = uint64_t{1} << 60;

struct Check {
  std::string where;
  [[noreturn]] void fail(const std::string &what) const {
    throw Error(TSR_ERR_INVALID, where + ": " + what + " (damaged or not a tessera checkpoint)");
  }
  const nlohmann::json &field(const nlohmann::json &obj, const char *key,
                              const std::string &ctx) const {
    if (!obj.is_object() || !obj.contains(key)) fail(ctx + " has no '" + key + "'");
    return obj[key];
  }
  uint64_t uint(const nlohmann::json &obj, const char *key, const std::string &ctx,
                uint64_t max) const {
    const auto &v = field(obj, key, ctx);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      fail(ctx + ": '" + key + "' is not a non-negative integer");
    const uint64_t u = v.get<uint64_t>();
    if (u > max) fail(ctx + ": '" + key + "' = " + std::to_string(u) + " is out of range");
    return u;
  }
  const std::string &str(const nlohmann::json &obj, const char *key, const std::string &ctx) const {
    const auto &v = field(obj, key, ctx);
    if (!v.is_string()) fail(ctx + ": '" + key + "' is not a string");
    return v.get_ref<const std::string &>();
  }
};

}  // namespace

void check_manifest(const nlohmann::json &m, const std::string &where) {
  Check c{where};
  if (!m.is_object()) c.fail("the manifest is not a JSON object");
  for (const char *k : {"step", "epoch", "batch_in_epoch", "samples", "global_batch"})
    if (!c.field(m, k, "the manifest").is_number_integer())
      c.fail(std::string("'") + k + "' is not an integer");
  c.uint(m, "seed", "the manifest", std::numeric_limits<uint64_t>::max());

  // The parameter table: the canonical index space every tensor lies in.
  const auto &params = c.field(m, "params", "the manifest");
  if (!params.is_array()) c.fail("'params' is not an array");
  uint64_t canonical = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string ctx = "params[" + std::to_string(i) + "]";
    c.str(params[i], "name", ctx);
    const auto &shape = c.field(params[i], "shape", ctx);
    if (!shape.is_array() || shape.size() > 16) c.fail(ctx + ": 'shape' is not a list of dims");
    uint64_t n = 1;
    for (const auto &d : shape) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        c.fail(ctx + ": a dimension is not a non-negative integer");
      const uint64_t v = d.get<uint64_t>();
      if (v > kMaxElements || (v > 0 && n > kMaxElements / v))
        c.fail(ctx + ": its shape holds more than 2^50 elements");
      n *= v;
    }
    canonical += n;
    if (canonical > kMaxElements) c.fail("the parameters hold more than 2^50 elements");
  }

  const auto &slots = c.field(m, "slots", "the manifest");
  if (!slots.is_array()) c.fail("'slots' is not an array");
  for (const auto &s : slots)
    if (!s.is_string()) c.fail("'slots' holds a non-string");

  const auto &files = c.field(m, "files", "the manifest");
  if (!files.is_array()) c.fail("'files' is not an array");
  for (size_t i = 0; i < files.size(); ++i) {
    const auto &f = files[i];
    const std::string &name = c.str(f, "name", "files[" + std::to_string(i) + "]");
    const std::string ctx = "file '" + name + "'";
    // Inside the checkpoint directory: a plain name, never a path.
    if (name.empty() || name == "." || name == ".." ||
        name.find_first_of(std::string("/\\0", 2)) != std::string::npos)
      c.fail("files[" + std::to_string(i) + "]: '" + name + "' is not a plain file name");
    const uint64_t bytes = c.uint(f, "bytes", ctx, kMaxFileBytes);
    c.uint(f, "crc32", ctx, 0xFFFFFFFFu);
    const auto &tensors = c.field(f, "tensors", ctx);
    if (!tensors.is_array()) c.fail(ctx + ": 'tensors' is not an array");
    for (size_t k = 0; k < tensors.size(); ++k) {
      const auto &t = tensors[k];
      const std::string tctx = ctx + " tensor #" + std::to_string(k);
      c.str(t, "name", tctx);
      c.str(t, "slot", tctx);
      const uint64_t start = c.uint(t, "start", tctx, kMaxElements);
      const uint64_t count = c.uint(t, "count", tctx, kMaxElements);
      const uint64_t offset = c.uint(t, "offset", tctx, kMaxFileBytes);
      if (start + count > canonical)
        c.fail(tctx + ": elements [" + std::to_string(start) + ", " +
               std::to_string(start + count) + ") lie outside the " + std::to_string(canonical) +
               " parameter elements");
      if (offset > bytes || count * 4 > bytes - offset)
        c.fail(tctx + ": bytes [" + std::to_string(offset) + ", " +
               std::to_string(offset + count * 4) + ") lie outside the file's " +
               std::to_string(bytes));
      const auto &blocks = c.field(t, "block_crc32", tctx);
      const uint64_t want = (count * 4 + kCheckpointBlock - 1) / kCheckpointBlock;
      if (!blocks.is_array() || blocks.size() != want)
        c.fail(tctx + ": 'block_crc32' does not hold one checksum per MiB (" +
               std::to_string(want) + ")");
      for (const auto &b : blocks)
        if (!b.is_number_unsigned() || b.get<uint64_t>() > 0xFFFFFFFFu)
          c.fail(tctx + ": a block checksum is not a 32-bit unsigned integer");
    }
  }
}

nlohmann::json parse_manifest(const std::string &text, const std::string &where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception &e) {
    throw Error(TSR_ERR_INVALID, where + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j["format"].is_string() || !j["version"].is_number_integer() ||
      j["format"] != "tessera-checkpoint" || j["version"] != 2)
    throw Error(TSR_ERR_INVALID, where + ": not a tessera checkpoint manifest (format version 2)");
  check_manifest(j, where);
  return j;
}

}  // namespace tessera

#include "ckpt/manifest.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <vector>

#include "util/crypto.hpp"
#include "util/error.hpp"

namespace tessera {

namespace {

// Bounds that no real checkpoint comes near and that keep every product and
// sum below 2^63.
constexpr uint64_t kMaxElements = uint64_t{1} << 50;
constexpr uint64_t kMaxFileBytes = uint64_t{1} << 60;
// Where training stands, bounded so that every product the trainer forms
// (steps into an epoch x global batch) stays below 2^63, and far beyond
// any real run: 2^40 steps, 2^22 samples per step.
constexpr uint64_t kMaxSteps = uint64_t{1} << 40;
constexpr uint64_t kMaxGlobalBatch = uint64_t{1} << 22;
constexpr uint64_t kMaxWorld = uint64_t{1} << 20;

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

// Where training stands: each number inside what a run can reach, and
// consistent with the others (an epoch takes at least one step, a step at
// least one sample).
void check_position(const Check &c, const nlohmann::json &m) {
  const uint64_t step = c.uint(m, "step", "the manifest", kMaxSteps);
  const uint64_t global_batch = c.uint(m, "global_batch", "the manifest", kMaxGlobalBatch);
  if (global_batch == 0) c.fail("'global_batch' is 0");
  const uint64_t epoch = c.uint(m, "epoch", "the manifest", kMaxSteps);
  if (epoch > step)
    c.fail("'epoch' = " + std::to_string(epoch) + " is more than the " + std::to_string(step) +
           " steps taken (an epoch takes at least one)");
  const uint64_t in_epoch = c.uint(m, "batch_in_epoch", "the manifest", kMaxSteps);
  if (in_epoch > step)
    c.fail("'batch_in_epoch' = " + std::to_string(in_epoch) + " is more than the " +
           std::to_string(step) + " steps taken");
  const uint64_t samples = c.uint(m, "samples", "the manifest", kMaxSteps * kMaxGlobalBatch);
  if (samples < step || samples / kMaxGlobalBatch > step)
    c.fail("'samples' = " + std::to_string(samples) + " does not fit " + std::to_string(step) +
           " steps of 1 to 2^22 samples");
  c.uint(m, "seed", "the manifest", std::numeric_limits<uint64_t>::max());
  if (m.contains("world_size") && c.uint(m, "world_size", "the manifest", kMaxWorld) == 0)
    c.fail("'world_size' is 0");
  if (m.contains("loss_scaler") && !m["loss_scaler"].is_null()) {
    const auto &ls = m["loss_scaler"];
    const auto &scale = c.field(ls, "cur_scale", "'loss_scaler'");
    if (!scale.is_number() || !(scale.get<double>() > 0) || !(scale.get<double>() <= 1e38))
      c.fail("'loss_scaler': 'cur_scale' is not a positive finite number");
    for (const char *k : {"good_steps", "cur_hysteresis", "skipped_steps"})
      if (ls.contains(k)) c.uint(ls, k, "'loss_scaler'", kMaxSteps);
  }
}

// The parameter table: the canonical index space every tensor lies in.
// Returns its size in elements.
// A range [begin, begin + count) of elements or bytes, and what holds it.
struct Extent {
  uint64_t begin, count;
  std::string what;
};

// The parameters' canonical size; `frozen` gets the canonical ranges of
// those saved frozen ("trainable": false), which have weights but no
// optimizer state.
uint64_t check_params(const Check &c, const nlohmann::json &m, std::vector<Extent> *frozen) {
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
    if (params[i].contains("trainable")) {
      if (!params[i]["trainable"].is_boolean()) c.fail(ctx + ": 'trainable' is not a boolean");
      if (!params[i]["trainable"].get<bool>() && n > 0) frozen->push_back({canonical, n, ctx});
    }
    canonical += n;
    if (canonical > kMaxElements) c.fail("the parameters hold more than 2^50 elements");
  }
  return canonical;
}

// The slot names: strings, each once.
const nlohmann::json &check_slots(const Check &c, const nlohmann::json &m) {
  const auto &slots = c.field(m, "slots", "the manifest");
  if (!slots.is_array()) c.fail("'slots' is not an array");
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i].is_string()) c.fail("'slots' holds a non-string");
    for (size_t k = 0; k < i; ++k)
      if (slots[k] == slots[i]) c.fail("'slots' names '" + slots[i].get<std::string>() + "' twice");
  }
  return slots;
}

using SlotPieces = std::map<std::string, std::vector<Extent>>;  // per slot, in elements

// One tensor of a file of `bytes` bytes: its elements inside the parameter
// table, its bytes inside the file, one checksum per block, a known slot.
// Adds its elements to `pieces` and its bytes to `layout`.
void check_tensor(const Check &c, const nlohmann::json &t, const std::string &tctx, uint64_t bytes,
                  uint64_t canonical, const nlohmann::json &slots, SlotPieces &pieces,
                  std::vector<Extent> &layout) {
  c.str(t, "name", tctx);
  c.str(t, "slot", tctx);
  const uint64_t start = c.uint(t, "start", tctx, kMaxElements);
  const uint64_t count = c.uint(t, "count", tctx, kMaxElements);
  const uint64_t offset = c.uint(t, "offset", tctx, kMaxFileBytes);
  if (start + count > canonical)
    c.fail(tctx + ": elements [" + std::to_string(start) + ", " + std::to_string(start + count) +
           ") lie outside the " + std::to_string(canonical) + " parameter elements");
  if (offset > bytes || count * 4 > bytes - offset)
    c.fail(tctx + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + count * 4) +
           ") lie outside the file's " + std::to_string(bytes));
  const auto &blocks = c.field(t, "block_crc32", tctx);
  const uint64_t want = (count * 4 + kCheckpointBlock - 1) / kCheckpointBlock;
  if (!blocks.is_array() || blocks.size() != want)
    c.fail(tctx + ": 'block_crc32' does not hold one checksum per MiB (" + std::to_string(want) +
           ")");
  for (const auto &b : blocks)
    if (!b.is_number_unsigned() || b.get<uint64_t>() > 0xFFFFFFFFu)
      c.fail(tctx + ": a block checksum is not a 32-bit unsigned integer");
  if (std::find(slots.begin(), slots.end(), t["slot"]) == slots.end())
    c.fail(tctx + ": slot '" + t["slot"].get<std::string>() + "' is not in 'slots'");
  pieces[t["slot"].get<std::string>()].push_back({start, count, tctx});
  layout.push_back({offset, count * 4, tctx});
}

// The writer puts a file's tensors one after another up to its end: a byte
// read for two tensors, or one read for none, is an edit.
void check_file_layout(const Check &c, std::vector<Extent> &layout, const std::string &ctx,
                       uint64_t bytes) {
  std::sort(layout.begin(), layout.end(),
            [](const Extent &a, const Extent &b) { return a.begin < b.begin; });
  for (size_t k = 1; k < layout.size(); ++k)
    if (layout[k].begin != layout[k - 1].begin + layout[k - 1].count)
      c.fail(layout[k].what + ": its bytes start at " + std::to_string(layout[k].begin) +
             ", not where " + layout[k - 1].what + "'s end (" +
             std::to_string(layout[k - 1].begin + layout[k - 1].count) + ")");
  if (!layout.empty() && layout.back().begin + layout.back().count != bytes)
    c.fail(ctx + ": its tensors end at byte " +
           std::to_string(layout.back().begin + layout.back().count) + ", the file at " +
           std::to_string(bytes));
}

// files[i]: a plain name inside the checkpoint directory, its size and
// checksum, its tensors laid end to end. Adds its tensors to `pieces`.
void check_file(const Check &c, const nlohmann::json &f, size_t i, uint64_t canonical,
                const nlohmann::json &slots, SlotPieces &pieces) {
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
  std::vector<Extent> layout;  // in bytes
  for (size_t k = 0; k < tensors.size(); ++k)
    check_tensor(c, tensors[k], ctx + " tensor #" + std::to_string(k), bytes, canonical, slots,
                 pieces, layout);
  check_file_layout(c, layout, ctx, bytes);
}

// Coverage, per slot: the pieces tile [0, parameters) exactly, but for the
// optimizer state slots (all but the first, the weights), which leave out
// the parameters saved frozen. An overlap would count elements twice and
// leave others at their initial values.
void check_coverage(const Check &c, const nlohmann::json &slots, SlotPieces &pieces,
                    uint64_t canonical, const std::vector<Extent> &frozen) {
  for (size_t k = 0; k < slots.size(); ++k) {
    const nlohmann::json &s = slots[k];
    const bool weights = k == 0;
    // Past the frozen parameters that start at `at` (ascending, so a run
    // of neighbours is skipped in one pass).
    auto skip = [&](uint64_t at) {
      if (!weights)
        for (const auto &f : frozen)
          if (f.begin <= at && at < f.begin + f.count) at = f.begin + f.count;
      return at;
    };
    auto &runs = pieces[s.get<std::string>()];
    std::sort(runs.begin(), runs.end(),
              [](const Extent &a, const Extent &b) { return a.begin < b.begin; });
    uint64_t covered = skip(0);
    for (const auto &r : runs) {
      if (!weights)
        for (const auto &f : frozen)
          if (r.begin < f.begin + f.count && f.begin < r.begin + r.count)
            c.fail("slot '" + s.get<std::string>() + "': " + r.what + " holds state for " + f.what +
                   ", which was saved frozen");
      if (r.begin < covered)
        c.fail("slot '" + s.get<std::string>() + "': " + r.what + " (elements [" +
               std::to_string(r.begin) + ", " + std::to_string(r.begin + r.count) +
               ")) overlaps the piece before it, which ends at " + std::to_string(covered));
      if (r.begin > covered)
        c.fail("slot '" + s.get<std::string>() + "': elements [" + std::to_string(covered) + ", " +
               std::to_string(r.begin) + ") are in no tensor");
      covered = skip(r.begin + r.count);
    }
    if (covered != canonical)
      c.fail("slot '" + s.get<std::string>() + "': elements [" + std::to_string(covered) + ", " +
             std::to_string(canonical) + ") are in no tensor");
  }
}

}  // namespace

void check_manifest(const nlohmann::json &m, const std::string &where) {
  Check c{where};
  if (!m.is_object()) c.fail("the manifest is not a JSON object");
  check_position(c, m);
  std::vector<Extent> frozen;
  const uint64_t canonical = check_params(c, m, &frozen);
  const nlohmann::json &slots = check_slots(c, m);
  const auto &files = c.field(m, "files", "the manifest");
  if (!files.is_array()) c.fail("'files' is not an array");
  SlotPieces pieces;
  for (size_t i = 0; i < files.size(); ++i) check_file(c, files[i], i, canonical, slots, pieces);
  check_coverage(c, slots, pieces, canonical, frozen);
}

std::string manifest_checksum(const nlohmann::json &m) {
  nlohmann::json body = m;
  if (body.is_object()) body.erase("checksum");
  // nlohmann::json keeps object keys sorted: the dump is canonical, however
  // the file was indented.
  return "sha256:" + to_hex(sha256(body.dump()));
}

nlohmann::json parse_manifest(const std::string &text, const std::string &where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception &e) {
    throw Error(TSR_ERR_INVALID, where + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j["format"].is_string() || j["format"] != "tessera-checkpoint")
    throw Error(TSR_ERR_INVALID, where + ": not a tessera checkpoint manifest");
  // Only version 3, which carries its own checksum. Version 2 (from before
  // manifests had one) is refused too: anyone could turn an edited version 3
  // manifest into a "version 2" one by changing the number and dropping the
  // checksum, and so skip the check.
  if (!j["version"].is_number_integer() || j["version"] != 3)
    throw Error(TSR_ERR_INVALID,
                where + ": manifest format version " +
                    (j["version"].is_number_integer() ? j["version"].dump() : "(not an integer)") +
                    " is not one this tessera reads (version 3; version 2, from before "
                    "manifests carried a checksum, is no longer read): refusing the checkpoint");
  if (!j.contains("checksum") || !j["checksum"].is_string())
    throw Error(TSR_ERR_INVALID, where +
                                     ": has no 'checksum' (a version 3 manifest carries "
                                     "one; edited, or damaged)");
  // The message names neither checksum: printing the content's would hand
  // whoever edited the manifest the value that makes the edit pass.
  if (j["checksum"].get<std::string>() != manifest_checksum(j))
    throw Error(TSR_ERR_INVALID,
                where +
                    ": fails its checksum: the manifest was edited or damaged since it was "
                    "written; refusing the checkpoint");
  check_manifest(j, where);
  return j;
}

}  // namespace tessera

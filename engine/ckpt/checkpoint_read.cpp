// The reading side of checkpoints: finding one (`latest`), its manifest,
// its tensors (ShardReader), the full parameters, and `ckpt verify`. What
// is refused here is refused the same on resume and by verify: a manifest
// that fails its checksum or its structure, a shard whose size, header or
// blocks changed, a path that is not a regular file.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "ckpt/checkpoint.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/shard_reader.hpp"
#include "ckpt/shard_writer.hpp"
#include "util/error.hpp"
#include "util/finite.hpp"
#include "util/regular_file.hpp"

namespace fs = std::filesystem;

namespace tessera {

namespace {

constexpr size_t kBlock = kCheckpointBlock;
// A manifest lists one checksum per MiB of every tensor: 256 MiB covers far
// more than any model this engine trains, and bounds what a bad one costs.
constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;
// A shard's safetensors header: at most 100 MiB of JSON (the reader's
// limit), its length and the padding to 4 KiB.
constexpr uint64_t kMaxShardHeader = (uint64_t{100} << 20) + 8 + 4096;

bool pread_all(int fd, char *dst, size_t n, uint64_t offset) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, dst + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

[[noreturn]] void unfinished(const fs::path &p) {
  throw Error(TSR_ERR_INVALID, p.string() +
                                   " is an unfinished checkpoint (.tmp: its save never "
                                   "completed); resume from a step_ directory without .tmp, or "
                                   "from the checkpoint root (its 'latest')");
}

}  // namespace

ShardReader::ShardReader(std::string dir, const nlohmann::json &m)
    : dir_(std::move(dir)), pieces_(stored_tensors(m)) {
  for (const auto &f : m.at("files")) {
    File &file = files_[f.at("name").get<std::string>()];
    file.bytes = f.at("bytes").get<uint64_t>();
    file.crc = f.at("crc32").get<uint32_t>();
  }
  std::sort(pieces_.begin(), pieces_.end(), [](const Piece &a, const Piece &b) {
    return a.slot != b.slot ? a.slot < b.slot : a.start < b.start;
  });
}

ShardReader::~ShardReader() {
  for (auto &[name, f] : files_)
    if (f.fd >= 0) ::close(f.fd);
}

int ShardReader::open(const std::string &name) {
  File &f = files_.at(name);
  if (f.fd >= 0) return f.fd;
  const std::string path = (fs::path(dir_) / name).string();
  RegularFile in = open_regular(path, "checkpoint shard");
  const std::string refuse =
      "; refusing the checkpoint (tessera ckpt verify " + dir_ + " lists every problem)";
  if (in.size != f.bytes)
    throw Error(TSR_ERR_INVALID, path + ": " + std::to_string(in.size) +
                                     " bytes, the manifest says " + std::to_string(f.bytes) +
                                     " (appended to or cut short since it was written)" + refuse);
  // The file is its header, then its tensors end to end (check_manifest
  // holds the manifest to that): its CRC-32 follows from the header's and
  // the blocks', without reading the data.
  std::vector<const Piece *> mine;
  for (const auto &p : pieces_)
    if (p.file == name) mine.push_back(&p);
  std::sort(mine.begin(), mine.end(),
            [](const Piece *a, const Piece *b) { return a->offset < b->offset; });
  const uint64_t header = mine.empty() ? f.bytes : mine.front()->offset;
  if (header > kMaxShardHeader)
    throw Error(TSR_ERR_INVALID, path + ": its first tensor starts at byte " +
                                     std::to_string(header) + ", past any safetensors header" +
                                     refuse);
  std::string prefix(static_cast<size_t>(header), '\0');
  if (!pread_all(in.fd, prefix.data(), prefix.size(), 0))
    throw Error(TSR_ERR_IO, path + ": short read of its header");
  uLong c = crc32_of(prefix.data(), prefix.size());
  for (const Piece *p : mine) {
    const size_t bytes = p->count * 4;
    uLong t = crc32(0L, Z_NULL, 0);
    for (size_t k = 0; k < p->blocks.size(); ++k)
      t = crc32_combine(t, p->blocks[k],
                        static_cast<z_off_t>(std::min(kBlock, bytes - k * kBlock)));
    c = crc32_combine(c, t, static_cast<z_off_t>(bytes));
  }
  if (static_cast<uint32_t>(c) != f.crc)
    throw Error(TSR_ERR_INVALID, path +
                                     ": fails its file checksum: its header, or the manifest's "
                                     "block checksums for it, changed since it was written" +
                                     refuse);
  // The manifest's tensors must be where the file's own header puts them
  // (and named for the slot and elements the manifest gives them).
  if (std::string why = shard_header_mismatch(prefix, f.bytes, mine); !why.empty())
    throw Error(
        TSR_ERR_INVALID,
        path + ": " + why + ": the manifest does not describe this shard (edited?)" + refuse);
  f.fd = in.release();
  return f.fd;
}

void ShardReader::read(const std::string &slot, size_t c0, size_t n, float *dst) {
  size_t done = 0;
  std::vector<char> buf;
  for (const auto &p : pieces_) {
    if (p.slot != slot || p.start + p.count <= c0 || p.start >= c0 + n) continue;
    const size_t b = std::max(c0, p.start), e = std::min(c0 + n, p.start + p.count);
    // Byte range inside the tensor, widened to whole blocks for checking.
    const size_t lo = (b - p.start) * 4, hi = (e - p.start) * 4;
    const size_t blo = lo / kBlock, bhi = (hi + kBlock - 1) / kBlock;
    const size_t tensor_bytes = p.count * 4;
    const int fd = open(p.file);
    const std::string path = (fs::path(dir_) / p.file).string();
    for (size_t k = blo; k < bhi; ++k) {
      const size_t off = k * kBlock, len = std::min(kBlock, tensor_bytes - off);
      buf.resize(len);
      if (!pread_all(fd, buf.data(), len, p.offset + off))
        throw Error(TSR_ERR_IO, path + ": tensor '" + p.name + "' is truncated (short read)");
      if (k >= p.blocks.size() || crc32_of(buf.data(), len) != p.blocks[k])
        throw Error(TSR_ERR_INVALID, path + ": tensor '" + p.name + "' fails its checksum (block " +
                                         std::to_string(k) +
                                         "); the checkpoint is damaged, refusing to load it");
      // Copy the part of this block inside [lo, hi): dst holds canonical
      // [c0, c0 + n), and this block's bytes start at canonical element
      // p.start + from / 4 (>= c0 by construction).
      const size_t from = std::max(lo, off), to = std::min(hi, off + len);
      if (from < to)
        std::memcpy(reinterpret_cast<char *>(dst) + (p.start * 4 + from - c0 * 4),
                    buf.data() + (from - off), to - from);
    }
    done += e - b;
  }
  if (done != n)
    throw Error(TSR_ERR_INVALID, dir_ + ": checkpoint holds " + std::to_string(done) + " of the " +
                                     std::to_string(n) + " '" + slot +
                                     "' elements needed at canonical offset " + std::to_string(c0));
}

std::string param_element(const nlohmann::json &m, size_t canonical) {
  size_t at = 0;  // canonical start of each parameter
  for (const auto &p : m.at("params")) {
    size_t count = 1;
    for (const auto &d : p.at("shape")) count *= d.get<size_t>();
    if (canonical < at + count)
      return "parameter '" + p.at("name").get<std::string>() + "' element " +
             std::to_string(canonical - at);
    at += count;
  }
  return "element " + std::to_string(canonical) + " (past the parameters)";
}

void require_finite_params(const nlohmann::json &m, const std::string &dir, const std::string &slot,
                           size_t c0, const float *values, size_t n) {
  const size_t bad = first_nonfinite(values, n);
  if (bad == n) return;
  const std::string what = slot == "master" ? "the weights" : "optimizer state '" + slot + "'";
  throw Error(TSR_ERR_INVALID,
              dir + ": " + what + " at " + param_element(m, c0 + bad) + " is " +
                  nonfinite_name(values[bad]) +
                  "; refusing to load a checkpoint whose values are not numbers (a diverged "
                  "run's save, or a damaged or edited file); to resume from it deliberately, set "
                  "checkpoint.allow_nonfinite = true");
}

nlohmann::json read_manifest(const std::string &path) {
  fs::path m = fs::path(path) / "manifest.json";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(m, ec)))
    throw Error(TSR_ERR_IO, m.string() + ": no manifest (not a checkpoint directory?)");
  const std::string text = read_regular(m.string(), "checkpoint manifest", kMaxManifestBytes);
  // Every size, offset and name in it is checked before it is used.
  return parse_manifest(text, m.string());
}

std::string resolve_checkpoint(const std::string &spec, const std::string &dir) {
  fs::path p = spec == "auto" ? fs::path(dir) : fs::path(spec);
  std::error_code ec;
  if (p.lexically_normal().string().ends_with(".tmp") ||
      p.lexically_normal().string().ends_with(".tmp/"))
    unfinished(p);
  if (fs::exists(fs::symlink_status(p / "latest", ec))) {
    // One line, a directory name: a few hundred bytes at most.
    const std::string text = read_regular((p / "latest").string(), "checkpoint pointer", 4096);
    const std::string name = text.substr(0, text.find('\n'));
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
      throw Error(TSR_ERR_INVALID, (p / "latest").string() + ": does not name a checkpoint");
    if (name.ends_with(".tmp")) unfinished(p / name);
    // A step directory is the checkpoint root's own: a link to somewhere
    // else would load weights that this run never saved.
    const fs::path step = p / name;
    if (fs::is_symlink(step, ec)) {
      const fs::path root = fs::canonical(p, ec), target = fs::canonical(step, ec);
      const auto rel = target.lexically_relative(root);
      if (ec || rel.empty() || *rel.begin() == ".." || rel == ".")
        throw Error(TSR_ERR_INVALID,
                    step.string() + " is a symbolic link out of the checkpoint root " + p.string() +
                        " (to " + target.string() +
                        "): refusing it; give that checkpoint's path itself to resume from it");
    }
    return step.string();
  }
  if (fs::exists(p / "manifest.json")) return p.string();
  if (spec == "auto") return "";  // nothing saved yet: start fresh
  throw Error(TSR_ERR_IO,
              spec +
                  ": no checkpoint here (expected a step_ directory with manifest.json, or a "
                  "checkpoint root holding 'latest')");
}

void read_canonical_params(const std::string &path, std::vector<float> *canonical,
                           nlohmann::json *manifest) {
  nlohmann::json m = read_manifest(path);
  size_t total = 0;
  for (const auto &p : m.at("params")) {
    size_t n = 1;
    for (auto d : p.at("shape")) n *= d.get<size_t>();
    total += n;
  }
  // The allocation is bounded by what the files really hold.
  // (Each must be a regular file: one that is not is refused here, named.)
  uint64_t stored = 0;
  for (const auto &f : m.at("files"))
    stored += open_regular((fs::path(path) / f.at("name").get<std::string>()).string(),
                           "checkpoint shard")
                  .size;
  if (uint64_t{total} * 4 > stored)
    throw Error(TSR_ERR_INVALID, path + ": the manifest's parameters need " +
                                     std::to_string(uint64_t{total} * 4) +
                                     " bytes, its files hold " + std::to_string(stored));
  canonical->assign(total, 0.f);
  ShardReader(path, m).read("master", 0, total, canonical->data());
  require_finite_params(m, path, "master", 0, canonical->data(), total);
  if (manifest) *manifest = std::move(m);
}

namespace {

// The whole file against its size and CRC-32, read up to the declared size
// only. Adds what is wrong to `problems`.
void verify_file(const RegularFile &in, const std::string &file, const nlohmann::json &f,
                 std::vector<char> &buf, std::vector<std::string> &problems) {
  const uint64_t declared = f.at("bytes").get<uint64_t>();
  if (in.size != declared) {
    problems.push_back(file + ": " + std::to_string(in.size) + " bytes, manifest says " +
                       std::to_string(declared));
    return;
  }
  uLong c = crc32(0L, Z_NULL, 0);
  for (uint64_t off = 0; off < declared; off += kBlock) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kBlock, declared - off));
    if (!pread_all(in.fd, buf.data(), len, off)) {
      problems.push_back(file + ": short read (the file shrank while it was checked?)");
      return;
    }
    c = crc32(c, reinterpret_cast<const Bytef *>(buf.data()), static_cast<uInt>(len));
  }
  if (static_cast<uint32_t>(c) != f.at("crc32").get<uint32_t>())
    problems.push_back(file + ": file checksum mismatch");
}

// The file's own safetensors header against the manifest's tensors of it.
void verify_header(const RegularFile &in, const std::string &file, uint64_t declared,
                   const std::vector<const StoredTensor *> &mine,
                   std::vector<std::string> &problems) {
  uint64_t header = declared;
  for (const StoredTensor *t : mine) header = std::min<uint64_t>(header, t->offset);
  if (header > kMaxShardHeader || header > in.size) {
    problems.push_back(file + ": its first tensor starts at byte " + std::to_string(header) +
                       ", past any safetensors header");
    return;
  }
  std::string prefix(static_cast<size_t>(header), '\0');
  if (!pread_all(in.fd, prefix.data(), prefix.size(), 0)) {
    problems.push_back(file + ": short read of its header");
    return;
  }
  if (std::string why = shard_header_mismatch(prefix, declared, mine); !why.empty())
    problems.push_back(file + ": " + why + ": the manifest does not describe this shard");
}

// Each tensor's blocks against their checksums and, unless allowed, its
// values against NaN and infinity (named by slot and parameter).
void verify_tensor(const RegularFile &in, const std::string &file, const StoredTensor &t,
                   const nlohmann::json &m, bool allow_nonfinite, std::vector<char> &buf,
                   std::vector<std::string> &problems) {
  const uint64_t nbytes = uint64_t{t.count} * 4;
  for (uint64_t k = 0; k * kBlock < nbytes; ++k) {
    const uint64_t b = t.offset + k * kBlock;
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kBlock, nbytes - k * kBlock));
    if (b > in.size || len > in.size - b || k >= t.blocks.size() ||
        !pread_all(in.fd, buf.data(), len, b) || crc32_of(buf.data(), len) != t.blocks[k]) {
      problems.push_back(file + ": tensor '" + t.name + "' block " + std::to_string(k) +
                         " fails its checksum");
      return;
    }
    if (allow_nonfinite) continue;
    std::vector<float> values(len / 4);
    std::memcpy(values.data(), buf.data(), values.size() * 4);
    const size_t bad = first_nonfinite(values.data(), values.size());
    if (bad < values.size()) {
      const size_t at = t.start + static_cast<size_t>(k * kBlock / 4) + bad;
      problems.push_back(file + ": tensor '" + t.name + "' (slot '" + t.slot + "', " +
                         param_element(m, at) + ") is " + nonfinite_name(values[bad]) +
                         " (a diverged run's save, or a damaged or edited file; "
                         "--allow-nonfinite accepts it)");
      return;
    }
  }
}

}  // namespace

std::vector<std::string> verify_checkpoint(const std::string &path, bool allow_nonfinite) {
  std::vector<std::string> problems;
  nlohmann::json m;
  try {
    m = read_manifest(path);
  } catch (const std::exception &e) {
    return {e.what()};
  }
  const std::vector<StoredTensor> tensors = stored_tensors(m);
  std::vector<char> buf(kBlock);
  for (const auto &f : m.at("files")) {
    const std::string name = f.at("name").get<std::string>();
    const std::string file = (fs::path(path) / name).string();
    // The manifest's size bounds every read: a shard replaced by a FIFO or
    // a link to /dev/zero is refused by type, one that grew is read only up
    // to what was written.
    RegularFile in = sdk::open_regular_file(file);
    if (!in) {
      problems.push_back(file + (in.refused           ? " " + in.why
                                 : in.error == ENOENT ? std::string(": missing")
                                                      : ": cannot open: " + in.why));
      continue;
    }
    verify_file(in, file, f, buf, problems);
    std::vector<const StoredTensor *> mine;
    for (const auto &t : tensors)
      if (t.file == name) mine.push_back(&t);
    verify_header(in, file, f.at("bytes").get<uint64_t>(), mine, problems);
    for (const StoredTensor *t : mine)
      verify_tensor(in, file, *t, m, allow_nonfinite, buf, problems);
  }
  return problems;
}

}  // namespace tessera

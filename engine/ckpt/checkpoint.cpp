#include "ckpt/checkpoint.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

#include "ckpt/manifest.hpp"
#include "ckpt/shard_reader.hpp"
#include "ckpt/shard_writer.hpp"
#include "debug/fault.hpp"
#include "host/zero_update.hpp"
#include "util/error.hpp"
#include "util/regular_file.hpp"
#include "util/safetensors.hpp"
#include "util/synced_file.hpp"

namespace fs = std::filesystem;

namespace tessera {

namespace {

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string rank_file(uint32_t rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank_%05u.safetensors", rank);
  return buf;
}

// The slots a checkpoint holds: the fp32 master copy, then each optimizer
// state array by the optimizer's own name for it.
std::vector<std::string> slot_names(const CheckpointParts &s) {
  std::vector<std::string> names = {"master"};
  for (uint32_t i = 0; i < s.state_count; ++i) {
    const char *n = s.optimizer.vt->state_name(s.optimizer.self, i);
    names.push_back(n && *n ? n : "state" + std::to_string(i));
  }
  return names;
}

struct OwnedRange {
  size_t owned_offset, flat_offset, count;
};

ZeroCalls zero_calls(const CheckpointParts &s) {
  return {s.host, s.zero.vt, s.zero.self, s.zero.name};
}

// What this rank writes: its owned ranges; when every rank owns everything
// (stage 0) the copies are identical, so rank r writes slice r of each group
// and the writes share the work instead of repeating it.
std::vector<OwnedRange> write_share(const CheckpointParts &s) {
  const std::vector<tsr_owned_range> owned = zero_owned_ranges(zero_calls(s));
  const auto &f = s.host.facts();
  std::vector<OwnedRange> out;
  if (s.partition_optimizer || f.world_size == 1) {
    for (const auto &r : owned) out.push_back({r.owned_offset, r.flat_offset, r.count});
    return out;
  }
  for (const auto &r : owned) {
    size_t per = r.count / f.world_size;  // groups are padded to a multiple of the world
    out.push_back({r.owned_offset + f.rank * per, r.flat_offset + f.rank * per, per});
  }
  return out;
}

void barrier(const CheckpointParts &s, const char *what) {
  plugin_ok(s.host, s.host.table()->comm->barrier(s.host.ctx()), what);
}

nlohmann::json param_table(const Layout &L) {
  nlohmann::json t = nlohmann::json::array();
  size_t canon = 0;
  for (const auto &p : L.params) {
    t.push_back(
        {{"name", p.name}, {"shape", p.shape}, {"group", p.group}, {"canonical_offset", canon}});
    // Frozen: weights only, no optimizer state (the manifest's coverage check).
    if (!p.trainable) t.back()["trainable"] = false;
    canon += p.numel;
  }
  return t;
}

// What this rank writes of the frozen ranges it keeps: all of each where
// ranks keep disjoint slices (stage 3) or there is one rank; otherwise
// every rank keeps every frozen group whole and writes slice `rank`.
struct FrozenShare {
  const void *params;  // the range's compute parameters
  size_t first, flat_offset, count;
};
std::vector<FrozenShare> frozen_share(const CheckpointParts &s) {
  const auto &f = s.host.facts();
  std::vector<FrozenShare> out;
  for (const auto &r : s.frozen) {
    if (s.partition_params || f.world_size == 1) {
      out.push_back({r.params, 0, r.flat_offset, r.count});
      continue;
    }
    const size_t per = r.count / f.world_size;  // groups are padded to a multiple of the world
    out.push_back({r.params, f.rank * per, r.flat_offset + f.rank * per, per});
  }
  return out;
}

// This rank's pieces of a checkpoint: its owned ranges, in canonical
// coordinates, one tensor per slot and canonical piece, with where each
// reads its bytes from the offload backend and its entry in the shard's
// index; then the frozen parameters it writes, "master" only, read from
// their compute parameters.
struct RankShard {
  struct Source {
    uint32_t slot;
    size_t owned_offset;
    const void *frozen = nullptr;  // else compute parameters, from element owned_offset
  };
  std::vector<Source> sources;
  std::vector<StTensor> tensors;
  nlohmann::json index = nlohmann::json::array();
  void add(const std::string &slot, size_t c0, size_t n, Source src) {
    std::string name = slot + "@" + std::to_string(c0);
    sources.push_back(src);
    tensors.push_back(StTensor{name, "F32", {static_cast<int64_t>(n)}, nullptr, n * 4});
    index.push_back({{"name", name}, {"slot", slot}, {"start", c0}, {"count", n}});
  }
};

RankShard rank_shard(const CheckpointParts &s, const std::vector<std::string> &slots) {
  RankShard out;
  for (const auto &r : write_share(s))
    for (const auto &piece : s.layout.to_canonical(r.flat_offset, r.count))
      for (uint32_t slot = 0; slot < slots.size(); ++slot)
        out.add(slots[slot], piece.canonical, piece.count,
                {slot, r.owned_offset + (piece.flat - r.flat_offset)});
  for (const auto &r : frozen_share(s))
    for (const auto &piece : s.layout.to_canonical(r.flat_offset, r.count))
      out.add(slots[0], piece.canonical, piece.count,
              {0, r.first + (piece.flat - r.flat_offset), r.params});
  return out;
}

// How the shard is written: 1 MiB checksum blocks, and in CUDA runs pinned
// buffers, so the device-to-host copies run at full speed.
ShardWriteOptions shard_options(const CheckpointParts &s) {
  ShardWriteOptions wo;
  wo.block = kCheckpointBlock;
  if (s.host.facts().device.device_type == kDLCUDA) {
    const tsr_host *h = s.host.table();
    tsr_host_ctx *ctx = s.host.ctx();
    wo.memory.alloc = [h, ctx](size_t bytes) -> void * {
      void *p = nullptr;
      if (h->alloc(ctx, DLDevice{kDLCUDAHost, 0}, bytes, TSR_MEM_OTHER, &p) != TSR_OK)
        return nullptr;
      return p;
    };
    wo.memory.release = [h, ctx](void *p) { h->free(ctx, p); };
  }
  return wo;
}

// Writes this rank's shard into tmp_dir and, beside it, its index (the
// manifest's entry for the file). The shard writer pulls the bytes from
// the offload backend chunk by chunk (read_state), so no copy of the whole
// state is ever held in host memory.
void write_rank_shard(const CheckpointParts &s, RankShard &shard, const fs::path &tmp_dir) {
  const std::string file = rank_file(s.host.facts().rank);
  const ShardWritten written = write_shard(
      (tmp_dir / file).string(), shard.tensors, {{"format", "tessera-shard"}},
      [&](size_t t, size_t offset, size_t bytes, void *dst) {
        const auto &src = shard.sources[t];
        if (src.frozen) {
          s.get_compute(src.frozen, src.owned_offset + offset / 4, bytes / 4,
                        static_cast<float *>(dst));
          return;
        }
        plugin_ok(s.host,
                  s.offload.vt->read_state(s.offload.self, src.slot, src.owned_offset + offset / 4,
                                           bytes / 4, static_cast<float *>(dst)),
                  "offload", s.offload.name, "read_state for a checkpoint");
      },
      shard_options(s));
  size_t off = written.data_start;
  for (size_t i = 0; i < shard.tensors.size(); ++i) {
    shard.index[i]["offset"] = off;
    shard.index[i]["block_crc32"] = written.blocks[i];
    off += shard.tensors[i].bytes;
  }
  nlohmann::json meta = {{"name", file},
                         {"rank", s.host.facts().rank},
                         {"bytes", written.bytes},
                         {"crc32", written.crc},
                         {"tensors", shard.index}};
  write_file_synced(tmp_dir / (file + ".json"), meta.dump());
}

// Every rank's shard index, read (and removed) from tmp_dir: the
// manifest's "files".
nlohmann::json gather_shard_indexes(const fs::path &tmp_dir, uint32_t world) {
  std::error_code ec;
  nlohmann::json files = nlohmann::json::array();
  for (uint32_t r = 0; r < world; ++r) {
    fs::path mp = tmp_dir / (rank_file(r) + ".json");
    files.push_back(nlohmann::json::parse(read_regular(mp.string(), "checkpoint shard index")));
    fs::remove(mp, ec);
  }
  return files;
}

nlohmann::json checkpoint_manifest(const CheckpointParts &s, const RunPosition &st,
                                   const std::vector<std::string> &slots,
                                   const std::string &config_toml, nlohmann::json files) {
  nlohmann::json manifest = {
      {"format", "tessera-checkpoint"},
      {"version", 3},
      {"step", st.step},
      {"epoch", st.epoch},
      {"batch_in_epoch", st.batch_in_epoch},
      {"samples", st.samples},
      {"global_batch", st.global_batch},
      {"seed", st.seed},
      {"world_size", s.host.facts().world_size},
      {"zero", s.zero.name},
      {"optimizer", s.optimizer.name},
      {"slots", slots},
      {"model", s.model_name},
      {"params", param_table(s.layout)},
      {"partition_rule",
       "canonical: parameters in declaration order, unpadded; each rank stores its owned ranges"},
      {"loss_scaler", st.loss_scale < 0 ? nlohmann::json(nullptr)
                                        : nlohmann::json{{"cur_scale", st.loss_scale},
                                                         {"good_steps", st.scale_good_steps},
                                                         {"cur_hysteresis", st.scale_hysteresis},
                                                         {"skipped_steps", st.scale_skipped}}},
      {"config", config_toml},
      {"files", std::move(files)},
  };
  // Its own checksum last: an edited manifest is refused on resume and
  // by `ckpt verify`, as an edited shard is.
  manifest["checksum"] = manifest_checksum(manifest);
  return manifest;
}

// Commit: the directory gets its final name, then `latest` moves.
void commit_checkpoint(const fs::path &root, const fs::path &tmp_dir, const fs::path &final_dir,
                       int64_t step) {
  std::error_code ec;
  fsync_path(tmp_dir, true);
  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir);
  fsync_path(root, true);
  write_file_synced(root / "latest", step_name(step) + "\n");
  fsync_path(root, true);
}

// Older checkpoints beyond `keep` (0: all kept), removed only once the new
// one is complete.
void prune_checkpoints(const fs::path &root, int64_t keep) {
  std::error_code ec;
  std::vector<fs::path> steps;
  for (const auto &e : fs::directory_iterator(root, ec)) {
    std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step_", 0) == 0 && n.find(".tmp") == std::string::npos)
      steps.push_back(e.path());
  }
  std::sort(steps.begin(), steps.end());
  while (keep > 0 && static_cast<int64_t>(steps.size()) > keep) {
    fs::remove_all(steps.front(), ec);
    steps.erase(steps.begin());
  }
}

}  // namespace

std::string save_checkpoint(const CheckpointParts &s, const RunPosition &st, const std::string &dir,
                            int64_t keep, const std::string &config_toml) {
  s.settle_update();  // the state read below is the last update's
  const auto &f = s.host.facts();
  fs::path root(dir), final_dir = root / step_name(st.step),
                      tmp_dir = root / (step_name(st.step) + ".tmp");
  std::error_code ec;
  if (f.rank == 0) {
    fs::create_directories(root, ec);
    if (ec) throw Error(TSR_ERR_IO, dir + ": cannot create checkpoint directory: " + ec.message());
    fs::remove_all(tmp_dir, ec);
    fs::create_directories(tmp_dir, ec);
    if (ec) throw Error(TSR_ERR_IO, tmp_dir.string() + ": cannot create: " + ec.message());
  }
  barrier(s, "checkpoint: directory ready");

  const std::vector<std::string> slots = slot_names(s);
  RankShard shard = rank_shard(s, slots);
  write_rank_shard(s, shard, tmp_dir);
  maybe_crash(f.rank, st.step, FaultPoint::shard_written);
  barrier(s, "checkpoint: every rank written");

  if (f.rank == 0) {
    const nlohmann::json manifest =
        checkpoint_manifest(s, st, slots, config_toml, gather_shard_indexes(tmp_dir, f.world_size));
    write_file_synced(tmp_dir / "manifest.json", manifest.dump(1));
    commit_checkpoint(root, tmp_dir, final_dir, st.step);
    prune_checkpoints(root, keep);
  }
  barrier(s, "checkpoint: committed");
  return final_dir.string();
}

std::string shape_text(const std::vector<int64_t> &shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string params_mismatch(const nlohmann::json &table, const Layout &layout) {
  const std::string hint =
      "; the config describes another model than the one saved (compare [model] with the "
      "checkpoint's, shown by tessera ckpt inspect)";
  for (size_t i = 0; i < std::min(table.size(), layout.params.size()); ++i) {
    const ParamSlot &p = layout.params[i];
    const std::string name = table[i].at("name").get<std::string>();
    const auto shape = table[i].at("shape").get<std::vector<int64_t>>();
    if (name != p.name)
      return "parameter " + std::to_string(i) + " is '" + name + "' in the checkpoint, '" + p.name +
             "' in the model" + hint;
    if (shape != p.shape)
      return p.name + ": checkpoint " + shape_text(shape) + ", model " + shape_text(p.shape) + hint;
  }
  if (table.size() != layout.params.size())
    return "the checkpoint has " + std::to_string(table.size()) + " parameters, the model " +
           std::to_string(layout.params.size()) + hint;
  return "";
}

namespace {

// The owned masters and optimizer state, from the checkpoint into the
// offload backend, every slot of each owned range.
void load_state(const CheckpointParts &s, const nlohmann::json &m, const std::string &path,
                const std::vector<std::string> &slots, const std::vector<tsr_owned_range> &ranges,
                bool allow_nonfinite) {
  ShardReader reader(path, m);
  std::vector<float> buf;
  for (const auto &r : ranges)
    for (const auto &piece : s.layout.to_canonical(r.flat_offset, r.count)) {
      const size_t c0 = piece.canonical, n = piece.count;
      buf.resize(n);
      for (uint32_t slot = 0; slot < slots.size(); ++slot) {
        reader.read(slots[slot], c0, n, buf.data());
        // Weights and optimizer state alike: a NaN moment turns the weights
        // NaN at the first step, far from the file it came from.
        if (!allow_nonfinite) require_finite_params(m, path, slots[slot], c0, buf.data(), n);
        plugin_ok(
            s.host,
            s.offload.vt->write_state(s.offload.self, slot,
                                      r.owned_offset + (piece.flat - r.flat_offset), n, buf.data()),
            "offload", s.offload.name, "write_state from a checkpoint");
      }
    }
}

// The frozen ranges this rank keeps, from the checkpoint's weights straight
// into their compute parameters (padding stays zero).
void load_frozen(const CheckpointParts &s, const nlohmann::json &m, const std::string &path,
                 bool allow_nonfinite) {
  if (s.frozen.empty()) return;
  ShardReader reader(path, m);
  std::vector<float> buf;
  for (const auto &r : s.frozen) {
    buf.assign(r.count, 0.f);
    for (const auto &piece : s.layout.to_canonical(r.flat_offset, r.count)) {
      float *dst = buf.data() + (piece.flat - r.flat_offset);
      reader.read("master", piece.canonical, piece.count, dst);
      if (!allow_nonfinite)
        require_finite_params(m, path, "master", piece.canonical, dst, piece.count);
    }
    s.put_compute(buf.data(), r.count, r.params);
  }
}

// Compute parameters from the loaded masters: an update that copies instead
// of stepping, walked as the step walks one (host/zero_update.hpp), so the
// parameters (re-shared as the stage needs) are those the run had.
void compute_from_masters(const CheckpointParts &s, const std::vector<tsr_owned_range> &ranges) {
  RangeWalk w;
  w.each = [&s](size_t, const tsr_owned_range &r) -> tsr_status {
    // Parameters the offload backend keeps: write_state of the masters set them.
    if (!r.params) return TSR_OK;
    std::vector<float> master(r.count);
    tsr_status st =
        s.offload.vt->read_state(s.offload.self, 0, r.owned_offset, r.count, master.data());
    if (st != TSR_OK) return st;
    return guarded(s.host.ctx(), [&] { s.put_compute(master.data(), r.count, r.params); });
  };
  w.each_what = "[offload] plugin '" + s.offload.name + "' masters to compute parameters";
  w.handed_over = [] {};  // each copy is complete when `each` returns
  w.settle = s.settle_update;
  w.reshare = s.needs_reshare;
  walk_owned_ranges(zero_calls(s), ranges, w);
}

// Where training stood when the checkpoint was written, from its manifest.
RunPosition position_of(const nlohmann::json &m) {
  RunPosition st;
  st.step = m.at("step").get<int64_t>();
  st.epoch = m.at("epoch").get<int64_t>();
  st.batch_in_epoch = m.at("batch_in_epoch").get<int64_t>();
  st.samples = m.at("samples").get<int64_t>();
  st.global_batch = m.at("global_batch").get<int64_t>();
  st.seed = m.at("seed").get<uint64_t>();
  if (m.contains("loss_scaler") && m["loss_scaler"].is_object()) {
    const auto &ls = m["loss_scaler"];
    st.loss_scale = ls.value("cur_scale", -1.0);
    st.scale_good_steps = ls.value("good_steps", int64_t{0});
    st.scale_hysteresis = ls.value("cur_hysteresis", int64_t{0});
    st.scale_skipped = ls.value("skipped_steps", int64_t{0});
  }
  return st;
}

}  // namespace

RunPosition load_checkpoint(const CheckpointParts &s, const std::string &path,
                            bool allow_nonfinite) {
  s.settle_update();  // no update may land over what is loaded
  nlohmann::json m = read_manifest(path);
  // The model must be the one saved: same parameters, same shapes.
  if (std::string why = params_mismatch(m.at("params"), s.layout); !why.empty())
    throw Error(TSR_ERR_INVALID, path + ": " + why);
  for (size_t i = 0; i < s.layout.params.size(); ++i)
    if (s.layout.params[i].trainable && !m.at("params")[i].value("trainable", true))
      throw Error(TSR_ERR_INVALID,
                  path + ": parameter '" + s.layout.params[i].name +
                      "' was frozen when the checkpoint was saved, so it has no optimizer state "
                      "to resume from; freeze it again (or start a new run from the exported "
                      "weights with init_from)");
  std::vector<std::string> slots = slot_names(s);
  std::vector<std::string> saved = m.at("slots").get<std::vector<std::string>>();
  for (const auto &sl : slots)
    if (std::find(saved.begin(), saved.end(), sl) == saved.end())
      throw Error(TSR_ERR_INVALID, path + ": checkpoint has no optimizer state '" + sl +
                                       "' (saved with optimizer '" + m.value("optimizer", "?") +
                                       "')");
  // Where training stands, against this run's data: an epoch cannot be
  // further in than the data goes (padding to whole steps aside).
  const auto in_epoch = m.at("batch_in_epoch").get<uint64_t>(),
             global = m.at("global_batch").get<uint64_t>();
  if (s.data_length > 0 && in_epoch * global > static_cast<uint64_t>(s.data_length) + global)
    throw Error(TSR_ERR_INVALID,
                path + ": the manifest says " + std::to_string(in_epoch) + " steps of " +
                    std::to_string(global) + " samples into the epoch, past the " +
                    std::to_string(s.data_length) +
                    " samples of the training data: another dataset, or an edited manifest");
  const std::vector<tsr_owned_range> ranges = zero_owned_ranges(zero_calls(s));
  load_state(s, m, path, slots, ranges, allow_nonfinite);
  load_frozen(s, m, path, allow_nonfinite);
  compute_from_masters(s, ranges);
  return position_of(m);
}

}  // namespace tessera

// The nvme backend's extensions (nvme.hpp): parameter offload (its fetches
// from the state file or the host home) and the gradient sink.
#include <tessera/cpp/extension.hpp>

#include "nvme.hpp"

namespace tessera::offload::nvme {

namespace {

// ---- parameter offload (TSR_EXT_OFFLOAD_PARAMS) ----

// params = "nvme": owned [offset, offset + count) from the blocks' parameter
// regions into dst, once the walk has written the blocks back (it may be
// updating later blocks meanwhile). Blocks the cache of recent blocks holds
// (param_cache.hpp) are copied from there; the rest are read through the
// fetches' own ring and buffers, the next block's read in flight while the
// last one is copied out. Copies to the GPU go on the copy stream, after
// the compute stream's queued work, since dst may be a buffer the last
// group was computing from. Each read takes only the part of a block's
// region the range covers, widened to O_DIRECT's 4096-byte alignment, at
// the same place in the buffer.
uint64_t fetch_from_disk(Nvme *s, size_t offset, size_t count, void *dst) {
  const size_t cb = dtype_bytes(s->compute_dtype), region = s->params_region();
  const size_t b0 = offset / s->block, b1 = (offset + count - 1) / s->block;
  walk_wait(s, offset, count);
  void *stream = nullptr;
#if TSR_PLUGIN_CUDA
  if (s->cuda) {
    s->copies.after_compute(s->host->compute_stream);
    stream = s->copies.h2d;
  }
#endif
  // Block b's part of the range, [*lo, *hi) in owned elements.
  auto part = [&](size_t b, size_t *lo, size_t *hi) {
    *lo = std::max(offset, b * s->block);
    *hi = std::min(offset + count, (b + 1) * s->block);
  };
  std::vector<size_t> misses;
  for (size_t b = b0; b <= b1; ++b) {
    size_t lo = 0, hi = 0;
    part(b, &lo, &hi);
    char *out = static_cast<char *>(dst) + (lo - offset) * cb;
    if (s->cache.take(b, (lo - b * s->block) * cb, (hi - lo) * cb, out, stream))
      s->fetch_bytes_cached += (hi - lo) * cb;
    else
      misses.push_back(b);
  }
  // Block b's covered bytes [*from, *from + *len) within its region, aligned.
  auto covered = [&](size_t b, size_t *from, size_t *len) {
    size_t lo = 0, hi = 0;
    part(b, &lo, &hi);
    const size_t lo_b = b * s->block;
    *from = (lo - lo_b) * cb / kDirectAlign * kDirectAlign;
    *len = std::min(region, ((hi - lo_b) * cb + kDirectAlign - 1) / kDirectAlign * kDirectAlign) -
           *from;
  };
  auto start = [&](size_t j) {
    const int tag = static_cast<int>(j % kBuffers);
#if TSR_PLUGIN_CUDA
    if (s->cuda) cuda_check(cudaEventSynchronize(s->fetch_ev[tag]), kWho, "parameters' copy");
#endif
    size_t from = 0, len = 0;
    covered(misses[j], &from, &len);
    s->fetch_io.start(tag, false, s->fetch_buf[tag] + from, len,
                      s->params_offset(misses[j]) + static_cast<off_t>(from));
  };
  if (!misses.empty()) start(0);
  for (size_t j = 0; j < misses.size(); ++j) {
    const int cur = static_cast<int>(j % kBuffers);
    if (j + 1 < misses.size()) start(j + 1);
    s->fetch_io.wait(cur);
    const size_t b = misses[j];
    size_t from = 0, len = 0, lo = 0, hi = 0;
    covered(b, &from, &len);
    part(b, &lo, &hi);
    s->fetch_bytes_read += len;
    char *out = static_cast<char *>(dst) + (lo - offset) * cb;
    const char *in = s->fetch_buf[cur] + (lo - b * s->block) * cb;
#if TSR_PLUGIN_CUDA
    if (s->cuda) {
      cuda_check(cudaMemcpyAsync(out, in, (hi - lo) * cb, cudaMemcpyHostToDevice, s->copies.h2d),
                 kWho, "copy parameters to the GPU");
      cuda_check(cudaEventRecord(s->fetch_ev[cur], s->copies.h2d), kWho, "record");
      continue;
    }
#endif
    std::memcpy(out, in, (hi - lo) * cb);
  }
  // The fetch's end on the copy stream: what ready() waits for.
  uint64_t ticket = 0;
#if TSR_PLUGIN_CUDA
  if (s->cuda) {
    ticket = s->fetches++;
    cuda_check(cudaEventRecord(s->fetch_end[ticket % Nvme::kFetchEnds], s->copies.h2d), kWho,
               "record");
  }
#endif
  return ticket;
}

int32_t params_home(void *self) {
  return static_cast<Nvme *>(self)->params_where;
}

tsr_status fetch_params(void *self, size_t offset, size_t count, void *dst, uint64_t *ticket) {
  auto *s = static_cast<Nvme *>(self);
  return sdk::guard(s->host, [&] {
    s->check_range(offset, count);
    *ticket = 0;
    if (count == 0) return;
    // What is on disk or in the home is current once the walk has written
    // the blocks holding the range (the host asked for them already).
    if (s->on_disk()) {
      *ticket = fetch_from_disk(s, offset, count, dst);
    } else if (s->home.active()) {
      walk_wait(s, offset, count);
      *ticket = s->home.fetch(offset, count, dst, s->host->compute_stream);
    } else
      throw Error(TSR_ERR_INVALID, fmt("%s: fetch, but the parameters are not offloaded", kWho));
  });
}

tsr_status params_ready(void *self, uint64_t ticket) {
  auto *s = static_cast<Nvme *>(self);
  return sdk::guard(s->host, [&] {
    if (!s->on_disk()) return s->home.ready(ticket, s->host->compute_stream);
#if TSR_PLUGIN_CUDA
    // The fetch's end event (a later fetch may have recorded it again: its
    // copies come after this one's on the same stream, so waiting for them
    // is later than needed, never early).
    if (s->cuda)
      cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s->host->compute_stream),
                                     s->fetch_end[ticket % Nvme::kFetchEnds], 0),
                 kWho, "wait for the parameters' copy");
#else
    (void)ticket;
#endif
  });
}

void params_bytes(void *self, uint64_t *host_bytes, uint64_t *disk_bytes) {
  auto *s = static_cast<Nvme *>(self);
  if (host_bytes) *host_bytes = s->home.active() ? s->home.bytes() : 0;
  if (disk_bytes) *disk_bytes = s->on_disk() ? s->blocks * s->params_region() : 0;
}

const tsr_ext_offload_params kParamsExt = {tsr_ext_offload_params_STRUCT_SIZE, params_home,
                                           fetch_params, params_ready, params_bytes};
// The host takes the sink only with offloaded parameters (session.cpp),
// where setup made its buffer.
const sdk::Extension kExtensions[] = {{TSR_EXT_OFFLOAD_PARAMS, &kParamsExt},
                                      {TSR_EXT_OFFLOAD_GRADS, &GradsExtension<Nvme>::table}};

}  // namespace

const void *get_extension(const char *id) {
  return sdk::find_extension(kExtensions, id);
}

}  // namespace tessera::offload::nvme

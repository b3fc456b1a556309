// The nvme backend's extensions (nvme.hpp): parameter offload (its fetches
// from the state file or the host home) and the gradient sink.
#include <tessera/cpp/extension.hpp>

#include "nvme.hpp"

namespace tessera::offload::nvme {

namespace {

// ---- parameter offload (TSR_EXT_OFFLOAD_PARAMS) ----

// params = "nvme": owned [offset, offset + count) from the blocks' parameter
// regions into dst, through the fetches' own ring and buffers (the walk may
// be updating later blocks meanwhile), once the walk has written the blocks
// back; the next block's read in flight while the last one is copied out
// (to the GPU on the copy stream, after the compute stream's queued work,
// since dst may be a buffer the last group was computing from).
// Each read takes only the part of a block's region the range covers,
// widened to O_DIRECT's 4096-byte alignment, at the same place in the
// buffer: a group smaller than a block no longer reads the whole region.
uint64_t fetch_from_disk(Nvme *s, size_t offset, size_t count, void *dst) {
  const size_t cb = dtype_bytes(s->compute_dtype), region = s->params_region();
  const size_t b0 = offset / s->block, b1 = (offset + count - 1) / s->block;
  walk_wait(s, offset, count);
  // Block b's covered bytes [*from, *from + *len) within its region.
  auto covered = [&](size_t b, size_t *from, size_t *len) {
    const size_t lo_b = b * s->block;
    const size_t lo = std::max(offset, lo_b), hi = std::min(offset + count, lo_b + s->block);
    *from = (lo - lo_b) * cb / kDirectAlign * kDirectAlign;
    const size_t to =
        std::min(region, ((hi - lo_b) * cb + kDirectAlign - 1) / kDirectAlign * kDirectAlign);
    *len = to - *from;
  };
#if TSR_PLUGIN_CUDA
  if (s->cuda) s->copies.after_compute(s->host->compute_stream);
#endif
  auto start = [&](size_t b) {
    const int tag = static_cast<int>((b - b0) % kBuffers);
#if TSR_PLUGIN_CUDA
    if (s->cuda) cuda_check(cudaEventSynchronize(s->fetch_ev[tag]), kWho, "parameters' copy");
#endif
    size_t from = 0, len = 0;
    covered(b, &from, &len);
    s->fetch_io.start(tag, false, s->fetch_buf[tag] + from, len,
                      s->params_offset(b) + static_cast<off_t>(from));
  };
  start(b0);
  int last = 0;
  for (size_t b = b0; b <= b1; ++b) {
    const int cur = static_cast<int>((b - b0) % kBuffers);
    if (b + 1 <= b1) start(b + 1);
    s->fetch_io.wait(cur);
    size_t from = 0, len = 0;
    covered(b, &from, &len);
    s->fetch_bytes_read += len;
    const size_t lo_b = b * s->block;
    const size_t lo = std::max(offset, lo_b), hi = std::min(offset + count, lo_b + s->block);
    char *out = static_cast<char *>(dst) + (lo - offset) * cb;
    const char *in = s->fetch_buf[cur] + (lo - lo_b) * cb;
#if TSR_PLUGIN_CUDA
    if (s->cuda) {
      cuda_check(cudaMemcpyAsync(out, in, (hi - lo) * cb, cudaMemcpyHostToDevice, s->copies.h2d),
                 kWho, "copy parameters to the GPU");
      cuda_check(cudaEventRecord(s->fetch_ev[cur], s->copies.h2d), kWho, "record");
      last = cur;
      continue;
    }
#endif
    std::memcpy(out, in, (hi - lo) * cb);
  }
  return static_cast<uint64_t>(last);
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
    // The last block's copy ends the fetch (one stream, in order).
    if (s->cuda)
      cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s->host->compute_stream),
                                     s->fetch_ev[ticket % kBuffers], 0),
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

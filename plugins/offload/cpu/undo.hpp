// What offload cpu keeps to undo a speculative step (TSR_EXT_OFFLOAD_SPECULATE,
// pipeline.hpp): the pre-step values of the elements it updated before the
// step's gradient scale was known, and nothing else.
//
// Why a copy and not an inverse: AdamW with a scaled gradient is not the
// unscaled step scaled (m, v and the denominator all see the scale), and
// floating point is not invertible, so the only exact way back is the
// values from before. The cheapest exact scheme is the one here:
//
//  - copy-on-speculate, per range and only while the verdict is unknown: a
//    range the dispatcher reaches after the verdict is stepped once with
//    the right scale and copies nothing;
//  - fused with the step: each thread copies a block of 16K elements of
//    master and state (and, where the verdict may be "skip", the compute
//    parameters) just before the optimizer reads the same block, so the
//    copy reads from cache what the step then reads again (the extra
//    traffic is the copy's writes, 12 bytes per element with AdamW);
//  - a fixed space, allocated at setup (offload.speculation_memory): when
//    the ranges stepped ahead fill it, the dispatcher holds the next range
//    until the verdict comes instead of growing it.
//
// The gradients need no copy: the host keeps them untouched until
// wait_grads (ABI 1.2), so a redo reads the same inputs again.
#pragma once

#include <atomic>
#include <chrono>

#include "offload_common.hpp"

namespace tessera::offload {

// Where one range's pre-step values sit in the undo space: master, then
// each state array, then (optionally) the compute parameters, each
// 64-byte aligned.
struct UndoLayout {
  size_t count = 0;
  uint32_t state_count = 0;
  size_t param_bytes = 0;  // per element; 0: the compute parameters are not kept

  size_t array_bytes() const { return align_up(count * sizeof(float), 64); }
  size_t bytes() const {
    return array_bytes() * (1 + state_count) + align_up(count * param_bytes, 64);
  }
  // Slot 0 master, 1 + i state i, in the space at `base`.
  float *slot(char *base, uint32_t i) const {
    return reinterpret_cast<float *>(base + i * array_bytes());
  }
  char *params(char *base) const { return base + array_bytes() * (1 + state_count); }
};

// `u` as run_update steps it, but each block's master, state (and, with
// layout.param_bytes, compute parameters) copied to `undo` first. The step
// of each element depends on that element alone, so stepping in blocks
// gives the bits of one call. Returns the first failing status; adds the
// threads' copying time, averaged over the threads, to *copy_s.
inline tsr_status run_update_saving(ThreadPool &pool, const tsr_optimizer_vtable *opt,
                                    void *opt_self, const HostUpdate &u, const UndoLayout &layout,
                                    char *undo, double *copy_s) {
  constexpr size_t kBlock = 16384;
  if (u.count == 0) return TSR_OK;
  const size_t blocks = (u.count + kBlock - 1) / kBlock;
  const size_t pb = dtype_bytes(u.out_dtype);
  std::atomic<tsr_status> first{TSR_OK};
  std::atomic<int64_t> copy_ns{0};
  pool.run(blocks, [&](size_t k) {
    const size_t b = k * kBlock, n = std::min(kBlock, u.count - b);
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(layout.slot(undo, 0) + b, u.master + b, n * sizeof(float));
    for (uint32_t s = 0; s < u.state_count; ++s)
      std::memcpy(layout.slot(undo, 1 + s) + b, u.state[s] + b, n * sizeof(float));
    if (layout.param_bytes && u.params_out)
      std::memcpy(layout.params(undo) + b * pb, static_cast<const char *>(u.params_out) + b * pb,
                  n * pb);
    copy_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    HostUpdate part = u;
    part.master = u.master + b;
    for (uint32_t s = 0; s < u.state_count; ++s) part.state[s] = u.state[s] + b;
    part.grads = static_cast<const char *>(u.grads) + b * dtype_bytes(u.grads_dtype);
    part.params_out = u.params_out ? static_cast<char *>(u.params_out) + b * pb : nullptr;
    part.owned = u.owned + b;
    part.count = n;
    std::vector<tsr_segment> segs;
    slice_segments(u.segments, u.num_segments, b, b + n, segs);
    part.segments = segs.data();
    part.num_segments = segs.size();
    const tsr_status st = step_block(opt, opt_self, part);
    tsr_status ok = TSR_OK;
    if (st != TSR_OK) first.compare_exchange_strong(ok, st);
  });
  *copy_s += static_cast<double>(copy_ns.load()) * 1e-9 / pool.size();
  return first.load();
}

// Puts back what run_update_saving kept of `u`'s elements (restores the
// compute parameters too where they were kept).
inline void restore_from_undo(ThreadPool &pool, const HostUpdate &u, const UndoLayout &layout,
                              const char *undo) {
  constexpr size_t kBlock = 65536;
  const size_t blocks = (u.count + kBlock - 1) / kBlock;
  const size_t pb = dtype_bytes(u.out_dtype);
  char *base = const_cast<char *>(undo);
  pool.run(blocks, [&](size_t k) {
    const size_t b = k * kBlock, n = std::min(kBlock, u.count - b);
    std::memcpy(u.master + b, layout.slot(base, 0) + b, n * sizeof(float));
    for (uint32_t s = 0; s < u.state_count; ++s)
      std::memcpy(u.state[s] + b, layout.slot(base, 1 + s) + b, n * sizeof(float));
    if (layout.param_bytes && u.params_out)
      std::memcpy(static_cast<char *>(u.params_out) + b * pb, layout.params(base) + b * pb, n * pb);
  });
}

}  // namespace tessera::offload

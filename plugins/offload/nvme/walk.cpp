// The nvme backend's walk (nvme.hpp): the recorded ranges' blocks through
// the three buffers, on a thread of its own,
//
//   buffer (i + 1) % 3:  read block i + 1           (io_uring)
//   buffer i % 3:        update block i             (CPU threads)
//   buffer (i - 1) % 3:  write block i - 1 back     (io_uring)
//
// while the host goes on to the next forward. The forward asks for each
// group's parameters (wait_params, and the fetches of params = "nvme"):
// walk_wait returns once the blocks holding them are on disk, so the
// forward trails the walk block by block instead of waiting for all of it,
// and the disk writes the update's blocks while it reads the ones the
// forward fetches.
#include <algorithm>

#include "nvme.hpp"

namespace tessera::offload::nvme {

namespace {

// Updates [lo, hi) of range p, whose block is in buffer `bb` starting at
// owned element `first`.
void update(Nvme *s, const Pending &p, char *bb, size_t first, size_t lo, size_t hi) {
  const size_t rel = lo - p.offset, cb = dtype_bytes(s->compute_dtype);
  std::vector<tsr_segment> segs;
  slice_segments(p.segments.data(), p.segments.size(), rel, rel + (hi - lo), segs);
  HostUpdate u;
  float *base = reinterpret_cast<float *>(bb);
  u.master = base + (lo - first);
  u.state_count = s->state_count;
  for (uint32_t i = 0; i < s->state_count; ++i)
    u.state[i] = base + (1 + i) * s->block + (lo - first);
  u.owned = lo;
  u.count = hi - lo;
  u.segments = segs.data();
  u.num_segments = segs.size();
  u.lr = p.lr;
  u.grad_scale = p.grad_scale;
  u.step = p.step;
  u.grads_dtype = s->compute_dtype;
  u.out_dtype = s->compute_dtype;
  // No gradients handed over: the sink holds them in host memory already.
  const bool sunk = p.grads == nullptr;
  if (sunk && !s->sink.active())
    throw Error(TSR_ERR_INVALID,
                fmt("%s: update of owned elements [%zu, %zu) without gradients, and no gradient "
                    "sink holds them (the backend holds gradients only with offloaded parameters)",
                    kWho, lo, hi));
  u.grads = sunk ? s->sink.at(lo) : static_cast<const char *>(p.grads) + rel * cb;
  // Offloaded parameters: written where they live (the block's region, or
  // the host home), with nothing to send back to the device.
  const bool held = s->params_where != TSR_PARAMS_ON_DEVICE;
  if (s->on_disk())
    u.params_out = bb + (1 + s->state_count) * s->block * sizeof(float) + (lo - first) * cb;
  else if (held)
    u.params_out = s->home.at(lo);
  else
    u.params_out = static_cast<char *>(p.params) + rel * cb;
#if TSR_PLUGIN_CUDA
  if (s->cuda && sunk) {
    // Pinned already: the update reads them in place.
  } else if (s->cuda && held) {
    s->copies.to_host(s->grads_stage.get(), u.grads, u.count * cb, s->grads_ev);
    s->copies.wait(s->grads_ev);
    u.grads = s->grads_stage.get();
  } else if (s->cuda) {
    // Gradients to the pinned stage (the disk dominates: no overlap here),
    // the compute copy out through one of two stages.
    s->copies.to_host(s->grads_stage.get(), u.grads, u.count * cb, s->grads_ev);
    s->copies.wait(s->grads_ev);
    const int j = s->next_params;
    s->next_params ^= 1;
    s->copies.wait(s->params_ev[j]);
    void *dst = u.params_out;
    u.grads = s->grads_stage.get();
    u.params_out = s->params_stage[j].get();
    const auto t0 = std::chrono::steady_clock::now();
    sdk::check(run_update(*s->pool, s->opt, s->opt_self, u));
    s->update_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s->elements_updated += u.count;
    s->copies.to_device(dst, s->params_stage[j].get(), u.count * cb, s->params_ev[j]);
    return;
  }
#endif
  const auto t0 = std::chrono::steady_clock::now();
  sdk::check(run_update(*s->pool, s->opt, s->opt_self, u));
  s->update_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s->elements_updated += u.count;
}

// The walk's thread: every block of s->walk_blocks read, updated by the
// ranges that touch it, written back. walk_written counts the blocks on
// disk, in order (writes land in the order they were issued: each buffer's
// write is waited for before the buffer's next read).
void walk_blocks(Nvme *s) {
  const size_t nb = s->walk_blocks.size();
  size_t issued = 0, written = 0;
  // Counts writes that have landed, in order, and tells the waiters.
  auto landed = [&] {
    size_t w = written;
    while (w < issued && s->io.landed(static_cast<int>(w % kBuffers))) ++w;
    if (w == written) return;
    written = w;
    {
      std::lock_guard<std::mutex> lk(s->walk_mu);
      s->walk_written = w;
    }
    s->walk_cv.notify_all();
  };
  auto read = [&](size_t i) {
    const int tag = static_cast<int>(i % kBuffers);
    s->io.start(tag, false, s->buf[tag], s->walk_read_len[i], s->block_offset(s->walk_blocks[i]));
  };
  read(0);
  size_t first_range = 0;
  for (size_t i = 0; i < nb; ++i) {
    const int cur = static_cast<int>(i % kBuffers);
    if (i + 1 < nb) {
      s->wait(static_cast<int>((i + 1) % kBuffers), landed);  // block i - 2 written back
      landed();
      read(i + 1);
    }
    s->wait(cur, landed);
    s->bytes_read += s->walk_read_len[i];
    const size_t lo_b = s->walk_blocks[i] * s->block, hi_b = std::min(s->n, lo_b + s->block);
    while (first_range < s->pending.size() &&
           s->pending[first_range].offset + s->pending[first_range].count <= lo_b)
      ++first_range;
    for (size_t q = first_range; q < s->pending.size() && s->pending[q].offset < hi_b; ++q) {
      const Pending &p = s->pending[q];
      update(s, p, s->buf[cur], lo_b, std::max(lo_b, p.offset), std::min(hi_b, p.offset + p.count));
    }
    ++s->updates;
    if (s->on_disk()) s->cache.put(s->walk_blocks[i], s->buf[cur] + s->state_bytes());
    s->io.start(cur, true, s->buf[cur], s->block_bytes, s->block_offset(s->walk_blocks[i]));
    s->bytes_written += s->block_bytes;
    issued = i + 1;
    landed();
  }
  for (size_t i = nb > kBuffers ? nb - kBuffers : 0; i < nb; ++i) {
    s->wait(static_cast<int>(i % kBuffers), landed);
    landed();
  }
}

void walk_main(Nvme *s) {
  std::exception_ptr err;
  try {
#if TSR_PLUGIN_CUDA
    // The copies this thread queues go to the run's GPU.
    if (s->cuda) cuda_check(cudaSetDevice(s->device_id), kWho, "set the walk's device");
#endif
    walk_blocks(s);
  } catch (...) {
    s->io.drain();
    err = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lk(s->walk_mu);
    s->walk_error = err;
    s->walk_ended = true;
  }
  s->walk_cv.notify_all();
}

// Joins an ended walk's thread and rethrows its failure.
void walk_join(Nvme *s) {
  if (!s->walker.joinable()) return;
  s->walker.join();
  s->pending.clear();
  if (std::exception_ptr e = std::exchange(s->walk_error, nullptr)) std::rethrow_exception(e);
}

}  // namespace

void walk_start(Nvme *s) {
  if (s->pending.empty() || s->walker.joinable()) return;
  // The ranges came in owned order from the host's walk, or in backward's
  // order when the update starts during backward: either way, in order now.
  std::sort(s->pending.begin(), s->pending.end(),
            [](const Pending &a, const Pending &b) { return a.offset < b.offset; });
  for (size_t q = 1; q < s->pending.size(); ++q)
    if (s->pending[q].offset < s->pending[q - 1].offset + s->pending[q - 1].count) {
      const Pending a = s->pending[q - 1], b = s->pending[q];
      s->pending.clear();
      throw Error(TSR_ERR_INVALID, fmt("%s: ranges [%zu, %zu) and [%zu, %zu) overlap", kWho,
                                       a.offset, a.offset + a.count, b.offset, b.offset + b.count));
    }
  // What the update needs settled, on the host's thread: the parameters'
  // copies out of the home have landed (the update rewrites them), the
  // gradients' copies into the sink have, and (CUDA) the walk's copies
  // come after the compute stream's queued work, the backward that made
  // the gradients and read the parameters.
  s->home.finish();
  s->sink.settle();
  s->cache.clear();  // the walk rewrites the blocks it held
#if TSR_PLUGIN_CUDA
  if (s->cuda) s->copies.after_compute(s->host->compute_stream);
#endif
  // The blocks the ranges touch, in order, and how many bytes of each to
  // read: a block whose every owned element is updated gets its whole
  // parameter region (params = "nvme") rewritten, so only its masters and
  // state are read (4096-byte multiples from the block's start: O_DIRECT).
  s->walk_blocks.clear();
  std::vector<size_t> covered;
  for (const Pending &p : s->pending)
    for (size_t b = p.offset / s->block; b <= (p.offset + p.count - 1) / s->block; ++b) {
      if (s->walk_blocks.empty() || s->walk_blocks.back() < b) {
        s->walk_blocks.push_back(b);
        covered.push_back(0);
      }
      covered.back() +=
          std::min(p.offset + p.count, (b + 1) * s->block) - std::max(p.offset, b * s->block);
    }
  s->walk_read_len.resize(s->walk_blocks.size());
  for (size_t i = 0; i < s->walk_blocks.size(); ++i) {
    const size_t lo_b = s->walk_blocks[i] * s->block, live = std::min(s->n, lo_b + s->block) - lo_b;
    s->walk_read_len[i] = s->on_disk() && covered[i] == live ? s->state_bytes() : s->block_bytes;
  }
  s->walk_written = 0;
  s->walk_ended = false;
  s->walk_error = nullptr;
  s->walker = std::thread(walk_main, s);
}

void walk_wait(Nvme *s, size_t offset, size_t count) {
  walk_start(s);
  if (!s->walker.joinable() || count == 0) return;
  // The walk's blocks up to the last one holding the range.
  const size_t last = (offset + count - 1) / s->block;
  const size_t need =
      static_cast<size_t>(std::upper_bound(s->walk_blocks.begin(), s->walk_blocks.end(), last) -
                          s->walk_blocks.begin());
  bool failed = false;
  {
    std::unique_lock<std::mutex> lk(s->walk_mu);
    s->walk_cv.wait(lk, [&] { return s->walk_written >= need || s->walk_ended; });
    failed = s->walk_error != nullptr;
  }
  if (failed) walk_join(s);
}

void walk_settle(Nvme *s) {
  walk_start(s);
  walk_join(s);
}

}  // namespace tessera::offload::nvme

// The offloaded updates that may still be running after a step returns.
// An offload backend that overlaps (ABI 1.2 wait_params) takes every owned
// range and returns before it has updated them: each group is then marked
// in flight, and the next pass waits for a group's update just before the
// group's first use (the model pass's param view, train/model_pass.cpp).
// Any other backend is flushed as soon as it has every range.
#pragma once

#include <tessera/tessera.h>

#include <span>
#include <utility>
#include <vector>

#include "host/host.hpp"
#include "plugin/layout.hpp"
#include "train/gpu_clock.hpp"
#include "train/instance.hpp"

namespace tessera {

struct UpdateFlight {
  Host *host = nullptr;
  const Instance<tsr_offload_vtable> *offload = nullptr;  // null: no update (not training)
  // Stage 3: asking for a group also starts the gather of the next one in
  // the pass's direction, which reads that group's owned slice.
  bool partition_params = false;
  // Per group: the owned (offset, count) ranges that touch it.
  std::vector<std::vector<std::pair<size_t, size_t>>> group_owned;
  std::vector<char> in_flight;  // per group: its update may not have landed
  bool any = false;
  // Seconds the param views spent waiting for updates in flight (the GPU,
  // or the CPU forward, waiting for the offloaded step).
  double wait_s = 0;
  // Owned ranges whose update a last backward handed over before it ended
  // (early_start in train/step.cpp), counted for the breakdown.
  uint64_t ranges_in_backward = 0;
  // CUDA runs with log.breakdown: the compute stream's own time at those
  // waits, and over each step's passes (flight_time_gpu; null: untimed).
  std::unique_ptr<GpuClock> gpu_waits, gpu_passes;
};

// Times the GPU's side of the offloaded step on `device` (CUDA only): the
// stream's time at the waits for updates in flight and over each step's
// passes, which the breakdown reports beside the host's.
void flight_time_gpu(UpdateFlight &f, DLDevice device);

// Which owned ranges (all of this rank's, in owned order) touch each group
// of `layout`: what a wait for a group waits for.
void flight_attach(UpdateFlight &f, Host &host, const Instance<tsr_offload_vtable> &offload,
                   const Layout &layout, std::span<const tsr_owned_range> owned,
                   bool partition_params);

// Every owned range was handed to the offload backend: an overlapping one
// has every group in flight; any other is flushed here.
void flight_handed_over(UpdateFlight &f);

// Completes every update in flight (offload flush): before anything reads
// the state or the parameters outside the step (checkpoints, gather, the
// end of the run).
void flight_settle(UpdateFlight &f);

// Before the gradients are cleared: the backend has read them (ABI 1.2
// wait_grads, where it offers it).
void flight_wait_grads(UpdateFlight &f);

// Before group g's parameters are used in a pass (`backward`: its
// direction): its update, and under stage 3 that of the group the
// prefetch reads next, have landed. A status, as the view that asks
// answers a plugin.
tsr_status flight_wait_near(UpdateFlight &f, uint32_t g, bool backward);

}  // namespace tessera

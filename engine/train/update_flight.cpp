// The offloaded updates in flight (see update_flight.hpp).
#include "train/update_flight.hpp"

#include <algorithm>
#include <chrono>

#include "host/plugin_call.hpp"

namespace tessera {

namespace {

tsr_status wait_group(UpdateFlight &f, uint32_t g) {
  if (g >= f.in_flight.size() || !f.in_flight[g]) return TSR_OK;
  const auto t0 = std::chrono::steady_clock::now();
  // The stream's time from here to past the backend's waits: the GPU idle
  // for want of the update (or of the host, blocked on it meanwhile).
  if (f.gpu_waits) f.gpu_waits->begin();
  for (const auto &[offset, count] : f.group_owned[g])
    if (tsr_status st = f.offload->vt->wait_params(f.offload->self, offset, count); st != TSR_OK)
      return st;
  if (f.gpu_waits) f.gpu_waits->end();
  f.in_flight[g] = 0;
  f.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return TSR_OK;
}

}  // namespace

void flight_attach(UpdateFlight &f, Host &host, const Instance<tsr_offload_vtable> &offload,
                   const Layout &layout, std::span<const tsr_owned_range> owned,
                   bool partition_params) {
  f.host = &host;
  f.offload = &offload;
  f.partition_params = partition_params;
  const size_t groups = layout.group_offset.size();
  f.group_owned.assign(groups, {});
  f.in_flight.assign(groups, 0);
  for (const tsr_owned_range &r : owned)
    for (size_t g = 0; g < groups; ++g) {
      const size_t lo = layout.group_offset[g], hi = lo + layout.group_size[g];
      if (r.flat_offset < hi && r.flat_offset + r.count > lo)
        f.group_owned[g].emplace_back(r.owned_offset, r.count);
    }
}

void flight_time_gpu(UpdateFlight &f, DLDevice device) {
  f.gpu_waits = gpu_clock_make(device);
  f.gpu_passes = gpu_clock_make(device);
}

void flight_handed_over(UpdateFlight &f) {
  if (!f.offload->caps.offload.wait_params) {
    plugin_ok(*f.host, f.offload->vt->flush(f.offload->self), "[offload] flush");
    return;
  }
  for (size_t g = 0; g < f.in_flight.size(); ++g) f.in_flight[g] = !f.group_owned[g].empty();
  f.any = true;
}

void flight_settle(UpdateFlight &f) {
  if (!f.any) return;
  plugin_ok(*f.host, f.offload->vt->flush(f.offload->self), "[offload] flush");
  std::fill(f.in_flight.begin(), f.in_flight.end(), 0);
  f.any = false;
}

void flight_wait_grads(UpdateFlight &f) {
  if (f.offload->caps.offload.wait_grads)
    plugin_ok(*f.host, f.offload->vt->wait_grads(f.offload->self), "[offload] wait_grads");
}

tsr_status flight_wait_near(UpdateFlight &f, uint32_t g, bool backward) {
  if (!f.any) return TSR_OK;
  tsr_status st = wait_group(f, g);
  if (st != TSR_OK || !f.partition_params) return st;
  if (backward) return g > 0 ? wait_group(f, g - 1) : TSR_OK;
  return wait_group(f, g + 1);
}

}  // namespace tessera

// The CUDA device runtime of one process: which GPU it drives, its streams,
// its caching allocator and its pinned host memory. Built only where the
// CUDA toolkit is (TESSERA_HAVE_CUDA); everything here is process-wide,
// because a worker drives exactly one GPU.
//
//   compute stream  every op of the ops table, and plugins' own kernels
//   comm stream     NCCL collectives, ordered against compute with events
//   copy stream     host-to-device batch copies, overlapped with compute
#pragma once

#include <cuda_runtime.h>
#include <tessera/host.h>

#include <cstddef>
#include <string>

namespace tessera::cuda {

// Throws tessera::Error(TSR_ERR_INTERNAL or TSR_ERR_NO_MEMORY) naming the
// call, file and line when a CUDA runtime call fails.
#define TSR_CUDA_CHECK(call) ::tessera::cuda::check_cuda((call), #call, __FILE__, __LINE__)
void check_cuda(cudaError_t err, const char *call, const char *file, int line);

// GPUs this process can see (CUDA_VISIBLE_DEVICES applied); 0 when there is
// no driver or no device. Never throws.
int visible_devices();

// Makes `ordinal` this process's device and creates the streams. Call once,
// before anything else here; later calls with the same ordinal do nothing.
void select_device(int ordinal);
// The selected device (-1 before select_device).
int current_device();
// "NVIDIA H200 (sm_90, 139.80 GiB)", for the start-up report.
std::string device_name();

cudaStream_t compute_stream();
cudaStream_t comm_stream();
cudaStream_t copy_stream();

// Blocks until the compute stream is idle; throws on a sticky CUDA error.
void synchronize();

// Device memory through the caching allocator: freed blocks are kept for
// reuse by later requests of the same size class, so a training step
// allocates nothing from the driver after the first. When cudaMalloc fails
// the cache is released and the call retried once; a second failure throws
// Error(TSR_ERR_NO_MEMORY) naming the bytes asked for and the bytes in use.
// Blocks are 256-byte aligned. Memory is NOT zeroed.
void *device_alloc(size_t bytes);
void device_free(void *p);
// Bytes held from the driver (in use + cached), and cached-but-free bytes.
size_t reserved_bytes();
// The current device's memory in bytes (cudaMemGetInfo's total).
size_t device_capacity();
size_t cached_bytes();
// Returns every cached block to the driver.
void release_cache();

// Page-locked host memory (cudaHostAlloc), for asynchronous copies. When
// `zeroed` is given it says whether the block is known to hold zeros (a
// fresh mapping, which the kernel zero-fills), so a caller that needs zeros
// can skip writing them over gigabytes.
void *pinned_alloc(size_t bytes, bool *zeroed = nullptr);
void pinned_free(void *p);

// ---- appended by the NCCL/device work ----
// Makes the selected device current on the calling thread (CUDA's current
// device is per host thread, and a thread starts on device 0). Every
// function above does this itself; call it in a thread of your own before
// raw CUDA calls (a loader thread's cudaMemcpyAsync, say). Throws when no
// device is selected.
void bind_thread();

}  // namespace tessera::cuda

// Collectives through shared memory, for a job whose ranks are all on one
// host (comm.shm, on by default): Gloo's TCP loopback moved a 1 MB gradient
// in ~2.4 ms, two thirds of a 2-rank MLP step on 2 cores; through
// /dev/shm it is a few copies at memory speed. GlooComm runs these on its
// communication thread in place of Gloo's algorithms, so ordering,
// timeouts and errors are the same.
//
// The segment holds two sets of one slot per rank, and one arrival counter
// per rank. Every collective is a sequence of barriers over the counters
// with copies between them; each element of a reduction is combined in rank order, so
// results are the same bits whatever the timing.
#pragma once

#include <dlpack/dlpack.h>
#include <tessera/host.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "util/spin_policy.hpp"

namespace tessera {

class StoreClient;

class ShmGroup {
 public:
  // Every rank calls this collectively. Returns nullptr (every rank the
  // same) when the ranks are not all on this host or the segment cannot be
  // made (a note for the log goes to *why); throws on a store failure.
  static std::unique_ptr<ShmGroup> open(StoreClient &store, const std::string &prefix,
                                        uint32_t rank, uint32_t world, const std::string &host,
                                        std::chrono::milliseconds timeout, std::string *why);
  ~ShmGroup();

  // In place; AVG divides the sum by the world size.
  void all_reduce(char *p, size_t n, DLDataType dt, tsr_reduce_op op);
  // src holds world x n elements; this rank's n come out in dst.
  void reduce_scatter(const char *src, char *dst, size_t n, DLDataType dt, tsr_reduce_op op);
  // src's bytes from every rank, in rank order, into dst (world x bytes).
  void all_gather(const char *src, char *dst, size_t bytes);
  void broadcast(char *p, size_t bytes, uint32_t root);
  void barrier();

  size_t slot_bytes() const { return slot_; }

 private:
  ShmGroup(uint32_t rank, uint32_t world, size_t slot, void *base, size_t bytes,
           std::chrono::milliseconds timeout);
  char *slot(uint32_t r) const;
  void next_round();
  void sleep_until(const std::function<bool()> &all_arrived);

  uint32_t rank_, world_;
  size_t slot_;
  void *base_;
  size_t bytes_;
  std::chrono::milliseconds timeout_;
  uint64_t phase_ = 0;               // barriers passed
  uint32_t set_ = 0;                 // which of the two sets of slots this round uses
  SpinBackoff backoff_;              // this rank's barrier spins
  std::vector<const char *> whole_;  // every rank's slot
  std::vector<const char *> piece_;  // reduce_scatter's pieces, per call
};

}  // namespace tessera

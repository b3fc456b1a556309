// The state behind the four ZeRO stages: one implementation, configured by
// the stage number, because the stages differ only in what they partition.
//
//   stage 0: full parameters, full gradients (all-reduced in buckets)
//   stage 1: + optimizer state partitioned (each rank updates its slice,
//              then all-gathers parameters)
//   stage 2: + gradients partitioned (reduce-scatter per group as backward
//              finishes it; each rank keeps only its slice)
//   stage 3: + parameters partitioned (each rank keeps its slice; a group is
//              all-gathered when the model asks for it, released after use,
//              and the next one prefetched)
//
// Frozen groups (tessera.zero.frozen/1) are weights only at every stage:
// kept (stage 3: partitioned and gathered) like any group, but without a
// gradient, owned elements (so no optimizer state, master copy or offload
// traffic), reduction or re-share.
//
// Everything numeric goes through the host's ops and collectives, so the
// same code serves CPU (Gloo) and GPU (NCCL) runs.
#pragma once

#include <map>
#include <tessera/cpp/plugin.hpp>
#include <vector>

namespace tessera::zero {

struct Options {
  int stage = 0;
  double bucket_mb = 25;  // stage 0/1 all-reduce bucket (DeepSpeed reduce_bucket_size)
  bool overlap = true;    // start reductions during backward (DeepSpeed overlap_comm)
  bool prefetch = true;   // stage 3: gather the next group ahead of use
};

// The four stages' vtables are the SDK's adapter over this class
// (sdk::zero_vtable, zero_plugin.cpp): its members are the vtable's entries.
class ZeroState {
 public:
  static constexpr const char *kName = "zero";  // for messages
  ZeroState(const tsr_host *host, Options opt) : host_(host), opt_(opt) {}
  ~ZeroState();

  const tsr_host *host() const { return host_; }

  void plan(tsr_zero_plan *out) const;
  // Stage 3: the owned compute parameters live with `src` (an offload
  // backend's host memory or disk), not on the device. Before setup.
  void use_source(const tsr_param_source *src);
  // Stages 2-3: the reduced gradients go to `sink` (an offload backend's
  // host memory) as each bucket completes; no device gradient slice.
  void use_sink(const tsr_grad_sink *sink);
  // Which layout groups are frozen (1) or trainable (0). Before setup.
  void set_frozen(const int32_t *group_frozen, size_t num_groups);
  // Each frozen range this rank keeps, its compute parameters in `params`.
  void frozen_ranges(tsr_range_fn fn, void *ctx);
  void setup(const tsr_zero_setup *s);
  size_t owned_count() const { return owned_total_; }
  void ranges(tsr_range_fn fn, void *ctx);
  void *params(uint32_t g, bool backward);
  void params_done(uint32_t g);
  void *grads(uint32_t g);
  void grads_done(uint32_t g, bool last_micro);
  void end_pass();
  void finish_grads();
  // ABI 1.10 take_final (stages 0-1 at several ranks, stages 2-3 at any
  // number): up to `cap` groups whose reduced gradients (at stages 2-3,
  // this rank's slices of them) became final since the last call.
  void take_final(uint32_t *groups, size_t cap, size_t *n);
  double grad_norm_sq();
  // ABI 1.0's step: every range through st->update, flush, reshare,
  // clear_grads. A 1.2 host makes those calls itself.
  void step(const tsr_zero_step *st);
  // Stages 1-2 at several ranks: all-gather the slices each rank updated.
  void reshare();
  // Fresh (zero) gradients for the next step.
  void clear_grads();

 private:
  struct Live {  // a gathered group (stage 3)
    sdk::Buffer buf;
    tsr_comm_work *work = nullptr;  // pending gather
    sdk::Buffer staged;             // offloaded parameters, several ranks: the owned slice
    uint64_t ticket = 0;            // offloaded parameters, one rank: the pending fetch
    bool fetching = false;
  };
  struct Pending {  // a reduction in flight
    tsr_comm_work *work = nullptr;
    std::vector<uint32_t> groups;  // stage 2/3: the groups packed in the bucket
    // The groups this reduction makes final (take_final): at stages 0-1 all
    // of the bucket's (launched on the last micro-batch only), at 2-3 those
    // whose entry came from the last micro-batch.
    std::vector<uint32_t> finals;
    sdk::Buffer packed;   // stage 2/3: their gradients, rank-major
    sdk::Buffer reduced;  // stage 2/3: this rank's reduced slices
  };

  DLTensor view(void *data, size_t count);
  void place_groups();
  size_t per(uint32_t g) const { return size_[g] / world_; }
  void *at(void *base, size_t elems) const { return static_cast<char *>(base) + elems * esize_; }
  void launch_bucket();
  void launch_scatter_bucket();
  void complete(Pending &p);
  // Buffers for buckets are reused across steps instead of reallocated.
  sdk::Buffer take(size_t elems, tsr_mem_purpose purpose);
  void give(sdk::Buffer b);
  void gather(uint32_t g);
  void fetch(uint32_t g, Live &l);
  void wait_live(Live &l);
  void sink_put(uint32_t g, const void *src);
  void release_drained(size_t keep);
  void finish_sink();

  const tsr_host *host_;
  Options opt_;
  bool sourced_ = false;  // owned parameters come from source_
  tsr_param_source source_{};
  bool sunk_ = false;  // reduced gradients go to sink_
  tsr_grad_sink sink_{};
  bool training_ = false;
  std::vector<char> filled_;  // sink: group g has had its first put this step
  // sink: reduced buffers whose copies may still read them, oldest first
  std::vector<std::pair<sdk::Buffer, uint64_t>> draining_;
  uint64_t last_ticket_ = 0;
  uint32_t rank_ = 0, world_ = 1;
  DLDevice device_{};
  DLDataType dtype_{};
  size_t esize_ = 4;
  std::vector<size_t> offset_, size_, owned_offset_;
  size_t total_ = 0, owned_total_ = 0;
  std::vector<int32_t> frozen_;  // per group: no gradient, owns nothing
  // Stages 0-1: where each trainable group's gradients start in grads_.
  std::vector<size_t> grad_offset_;
  size_t grad_total_ = 0;
  // Stage 3: where each group's slice starts in params_ (every group's, or
  // with a parameter source only the frozen ones'); kNotKept otherwise.
  static constexpr size_t kNotKept = ~size_t{0};
  std::vector<size_t> kept_offset_;
  size_t kept_total_ = 0;

  sdk::Buffer params_;  // stage 0-2: full; stage 3: this rank's kept slices
  sdk::Buffer grads_;   // stage 0-1: full (trainable groups); stage 2-3: this rank's owned slices
  std::map<uint32_t, sdk::Buffer> active_grads_;  // stage 2-3: groups being accumulated
  std::map<uint32_t, Live> live_;                 // stage 3: gathered groups
  std::vector<sdk::Buffer> spare_;                // stage 3: released gather buffers
  std::vector<Pending> pending_;
  // stage 0-1 bucket being filled: groups [bucket_lo_, bucket_hi_]
  int64_t bucket_lo_ = -1, bucket_hi_ = -1;
  // stage 2-3 bucket being filled: finished groups, their gradients, and
  // whether the last micro-batch declared them (a bucket may span two)
  struct Finished {
    uint32_t group;
    sdk::Buffer grads;
    bool last;
  };
  std::vector<Finished> scatter_bucket_;
  size_t scatter_bytes_ = 0;
  std::vector<sdk::Buffer> pool_;
  // stage 0-1: groups whose last-micro-batch gradients were declared done
  std::vector<char> declared_;
  // groups whose reduction is final this step, in completion order;
  // take_final has reported the first final_taken_ of them.
  std::vector<uint32_t> final_;
  size_t final_taken_ = 0;
  int64_t shapes_[8] = {};  // a ring: views live only for one call
  unsigned next_shape_ = 0;
};

}  // namespace tessera::zero

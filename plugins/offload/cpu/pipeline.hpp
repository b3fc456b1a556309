// The overlapped host update of offload `cpu` (ABI 1.2): step() hands an
// owned range over and returns; a dispatcher thread updates the ranges in
// the order they came, on the thread pool, and the host waits only for what
// it is about to use.
//
// In a CUDA run, per range:
//
//   main thread (step):   queue grads -> pinned (copy stream d2h), return
//   dispatcher:           wait for that copy, update on the pool (master,
//                         state, and the bf16 compute copy written straight
//                         into the pinned upload buffer), queue the upload
//                         pinned -> GPU (copy stream h2d)
//   next forward:         group g's first use makes the compute stream wait
//                         for g's upload only (wait_params)
//
// so the copies of later ranges run while the CPU updates earlier ones, and
// the next forward of the first layers runs while the CPU still updates the
// last. Both pinned buffers hold every owned element, so no range waits for
// a staging slot. In a CPU run the same dispatcher updates in place while
// the main thread goes on to the next forward.
//
// The order: ranges come in backward's order, last layer first, and the
// next forward wants them the other way round. Where the CPU update is the
// longer part of the step, most ranges are still waiting when that forward
// begins, and updating them as they came would make the first layer wait
// for every other. So the dispatcher serves demand: a range the host
// waits for and that has not started goes next, and once the step's
// ranges are all in (the verdict of a speculative round, or the first
// wait of the next forward) the rest are put in the order the last step's
// forward asked for them. In a CUDA run a range whose gradients have not
// reached the host yet gives way to one whose have (the first layer's are
// the last to land). Each range's update depends on its own elements
// alone, so the order changes no bit.
//
// The update math is run_update's (offload_common.hpp): the same chunks and
// the same optimizer kernel as a synchronous step, so the same bits.
//
// Speculation (TSR_EXT_OFFLOAD_SPECULATE, with clipping or fp16): between
// spec_begin and spec_resolve the ranges are stepped with the scale they
// came with, each keeping its pre-step values in the undo space first
// (undo.hpp); a range the dispatcher reaches once the verdict is known is
// stepped with the verdict's scale and keeps nothing. A verdict that
// changes the step appends one "fix" job per range stepped ahead: it puts
// the kept values back and steps again with the right scale (or, for a
// skip, only puts them back), and in a CUDA run uploads the parameters
// again; waits for a range cover its fix jobs as any job. When the undo
// space is full the dispatcher holds the next range until the verdict.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grad_sink.hpp"
#include "offload_common.hpp"
#include "undo.hpp"

namespace tessera::offload {

// One owned range's update, as step() handed it over.
struct RangeUpdate {
  size_t offset = 0, count = 0;
  const void *grads = nullptr;  // compute dtype, where compute runs
  void *params = nullptr;       // compute dtype, where compute runs
  std::vector<tsr_segment> segments;
  double lr = 0, grad_scale = 1;
  int64_t step = 0;
};

struct PipelineSetup {
  const tsr_host *host = nullptr;
  const char *who = "offload";
  const tsr_optimizer_vtable *opt = nullptr;
  void *opt_self = nullptr;
  uint32_t state_count = 0;
  float *slots[1 + kMaxStates] = {};  // [0] master, [1 + i] state i: owned element 0
  DLDataType compute_dtype{kDLFloat, 32, 1};
  ThreadPool *pool = nullptr;
  bool cuda = false;
  int device = 0;                 // CUDA ordinal
  char *grads_pinned = nullptr;   // CUDA: every owned element, compute dtype
  char *params_pinned = nullptr;  // CUDA: every owned element, compute dtype
  // Gradient sink, CPU runs: the owned gradients the sink took (every
  // owned element, compute dtype); CUDA runs use grads_pinned.
  char *grads_host = nullptr;
  size_t n = 0;  // owned elements
  // The host's arrays (slots, pinned buffers, grads_host) hold owned
  // elements [first, n): those below are the device share's (ratio "auto"
  // decided at start-up, device_share.hpp), and no range below comes here.
  size_t first = 0;
  // Parameter offload: the update writes the compute copy here (every owned
  // element, host memory) and nothing goes back to the device; the zero
  // plugin fetches from it (param_home.hpp).
  char *params_home = nullptr;
  // Speculation: the space that keeps the pre-step values of the ranges
  // stepped ahead of the verdict (undo.hpp); 0 bytes: every range waits
  // for the verdict.
  char *undo = nullptr;
  size_t undo_bytes = 0;
  // The worst case, for tests and for measuring what a redo costs: the
  // verdict waits until every range handed over is stepped ahead (or held
  // for want of undo space), so every range that could be redone is.
  bool worst_case = false;
  // Adaptive speculation: after a step whose verdict changed the update
  // (its norm clipped, or fp16 overflowed), the next step steps nothing
  // ahead and holds its ranges for the verdict, as with no undo space.
  // Where most steps clip, a speculative range is redone almost always,
  // and keeping and redoing it costs more than waiting for the norm.
  bool adaptive = true;
};

class HostPipeline {
 public:
  explicit HostPipeline(const PipelineSetup &s);
  ~HostPipeline();
  HostPipeline(const HostPipeline &) = delete;
  HostPipeline &operator=(const HostPipeline &) = delete;

  // Starts the update of one range (main thread). The first range of a new
  // step first retires the last step's ranges.
  void submit(RangeUpdate u);
  // The updated parameters of owned [offset, offset + count) are in place
  // for work queued on the compute stream from now on.
  void wait_params(size_t offset, size_t count);
  // The updates of owned [offset, offset + count) are complete on the host
  // (parameter offload: the home holds their new values).
  void wait_range(size_t offset, size_t count);
  // Every gradient submitted so far has been read (for the compute stream).
  void wait_grads();
  // Everything submitted is complete, copies included.
  void flush();
  // The gradient sink (TSR_EXT_OFFLOAD_GRADS, main thread): owned
  // [offset, offset + count) of this step's gradients from device memory
  // src, replacing (add false) or added to (add true) what is held; the
  // ticket names the copy that reads src.
  uint64_t sink_put(size_t offset, size_t count, const void *src, bool add);
  // Work queued on the compute stream from now on runs after that copy.
  void sink_release(uint64_t ticket);
  // The sum of squares of every held gradient, once all puts have landed.
  double sink_norm_sq();
  // Cumulative seconds: d2h, host step, h2d; elements updated.
  tsr_offload_stats stats();
  // Speculation (TSR_EXT_OFFLOAD_SPECULATE, main thread): the ranges
  // submitted from spec_begin on are stepped ahead of the verdict (with
  // may_skip, keeping the compute parameters too); spec_resolve gives it.
  void spec_begin(bool may_skip);
  // The undo space, given after construction (speculation_memory = "auto"
  // sized at the first round); before any round has stepped ahead.
  void set_undo(char *undo, size_t bytes);
  void spec_resolve(int32_t verdict, double grad_scale);
  tsr_speculate_stats spec_stats();

 private:
  static constexpr size_t kNoUndo = SIZE_MAX;
  struct Job {
    RangeUpdate u;
    bool done = false;
    tsr_status status = TSR_OK;
    std::string error;
    double host_s = 0;  // the pool's time on it
    // Speculation: submitted between spec_begin and spec_resolve; where its
    // pre-step values are kept (kNoUndo: stepped with a known scale);
    // a fix job restores job `of`'s, and steps again unless `skip`.
    bool spec = false, fix = false, skip = false;
    size_t undo = kNoUndo, of = 0;
    double save_s = 0;      // keeping the pre-step values (the threads' time, averaged)
    bool demanded = false;  // the host has waited for its parameters
  };
  void push(Job j, bool copy_grads);
  void serve();
  bool admit(Job &j, std::unique_lock<std::mutex> &lk);
  void order_as_demanded();
  void demand(size_t k, bool params);
  void move_up(size_t p);
  void take_landed();
  std::vector<size_t> overlapping(size_t offset, size_t count, bool params);
  HostUpdate update_of(const Job &j) const;
  void process(Job &j, size_t index, void *events, void *of_events);
  void wait_done(size_t index, std::unique_lock<std::mutex> &lk);
  void retire();
  void raise(const Job &j) const;

  PipelineSetup s_;
  std::deque<Job> jobs_;  // this step's ranges (references stay valid)
  // The dispatcher takes jobs_[order_[next_]], then the next position;
  // positions from next_ on may be reordered (order_as_demanded, demand).
  // pos_ is order_'s inverse.
  std::vector<size_t> order_, pos_;
  size_t next_ = 0;
  // The offsets of this step's and the last step's ranges in the order the
  // host first waited for their parameters (the next forward's order).
  std::vector<size_t> demanded_, last_demanded_;
  bool ordered_ = false;  // this step's pending ranges were put in that order
  size_t landed_ = 0;     // CUDA: jobs_[0, landed_) have their gradients on the host
  int64_t step_ = 0;      // the step the jobs belong to
  bool stop_ = false;
  std::mutex mu_;
  std::condition_variable work_, done_;
  std::thread thread_;
  double host_s_ = 0, d2h_s_ = 0, h2d_s_ = 0;
  uint64_t elements_ = 0;
  // Speculation (under mu_): a round is open from spec_begin to
  // spec_resolve; the verdict, once known; the undo space in use.
  bool spec_open_ = false, may_skip_ = false, verdict_known_ = true;
  int32_t verdict_ = TSR_SPECULATE_KEEP;
  double verdict_scale_ = 1;
  size_t undo_used_ = 0;
  size_t round_undo_bytes_ = 0;  // this round's undo space (adaptive: 0 after a change)
  int32_t last_verdict_ = TSR_SPECULATE_KEEP;
  size_t holding_ = kNoUndo;  // the position the dispatcher holds for the verdict
  tsr_speculate_stats spec_{};
#if TSR_PLUGIN_CUDA
  CopyStreams copies_;
  // Per job index: d2h begin/end, h2d begin/end (timed, for the breakdown).
  // A deque: a reference taken under the lock stays valid as it grows.
  std::deque<std::array<cudaEvent_t, 4>> events_;
#endif
  // After the copy streams: its copies run on their d2h stream, and it
  // waits for them before they go.
  GradSink sink_;
};

}  // namespace tessera::offload

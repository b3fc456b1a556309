// Shared-memory collectives for ranks on one host (shm_group.hpp).
#include "comm/shm_group.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <type_traits>

#include "comm/store.hpp"
#include "util/error.hpp"
#include "util/spin_policy.hpp"

namespace tessera {
namespace {

constexpr size_t kLine = 64;  // one arrival counter per cache line
constexpr uint64_t kMagic = 0x7465737365726131ull;

// The first cache line; past it, one arrival counter per rank.
struct Header {
  uint64_t magic;
  uint64_t world;
  uint64_t slot;
  // A futex word that a rank arriving at a full barrier bumps when ranks
  // sleep there, and how many do (a rank counts itself before it looks).
  // Both start at zero: a new segment's pages are (posix_fallocate).
  std::atomic<uint32_t> wake_seq;
  std::atomic<uint32_t> sleepers;
};
static_assert(sizeof(Header) <= kLine);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// How long a rank waiting at a barrier may spin while a core is free for
// it (spin_policy.hpp), before it sleeps on the futex: a peer is usually
// microseconds behind, and a wake from sleep costs tens of microseconds.
constexpr std::chrono::milliseconds kSpin{5};

Header *header(void *base) {
  return static_cast<Header *>(base);
}

// Shared, not FUTEX_PRIVATE: the word is in memory every rank maps.
long futex(std::atomic<uint32_t> *word, int op, uint32_t value, const timespec *timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), op, value, timeout, nullptr, 0);
}

size_t counters_offset() {
  return kLine;
}
size_t slots_offset(uint32_t world) {
  const size_t end = counters_offset() + kLine * world;
  return (end + 4095) / 4096 * 4096;
}

std::atomic<uint64_t> *counter(void *base, uint32_t r) {
  return reinterpret_cast<std::atomic<uint64_t> *>(static_cast<char *>(base) + counters_offset() +
                                                   kLine * r);
}

// This machine: the host name the ranks reach each other by, and the
// kernel's boot id (two network namespaces of one machine share /dev/shm,
// but are separate hosts to the job).
std::string machine_id(const std::string &host) {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(in, boot);
  return host + "|" + boot;
}

// Rank order for every element (src[0] + src[1] + ... in that order): the
// same bits whatever the timing. The elements go in blocks through a local
// buffer, one pass per rank over it, with the operation chosen outside the
// loops: the loops then vectorize. A per-element loop over the ranks with
// the operation tested inside (and 1 / world divided again for every
// element of an average) ran scalar, ~10% of a 2-rank MLP step.
template <typename T>
void reduce_block(T *acc, const T *v, size_t len, tsr_reduce_op op) {
  if (op == TSR_REDUCE_MAX)
    for (size_t i = 0; i < len; i++) acc[i] = v[i] > acc[i] ? v[i] : acc[i];
  else if (op == TSR_REDUCE_MIN)
    for (size_t i = 0; i < len; i++) acc[i] = v[i] < acc[i] ? v[i] : acc[i];
  else
    for (size_t i = 0; i < len; i++) acc[i] += v[i];
}

template <typename T>
void reduce_into(T *out, const char *const *src, uint32_t world, size_t lo, size_t hi,
                 tsr_reduce_op op) {
  constexpr size_t kBlock = 512;
  T acc[kBlock];
  const double inv = 1.0 / world;
  for (size_t b = lo; b < hi; b += kBlock) {
    const size_t len = std::min(kBlock, hi - b);
    std::memcpy(acc, reinterpret_cast<const T *>(src[0]) + b, len * sizeof(T));
    for (uint32_t q = 1; q < world; q++)
      reduce_block(acc, reinterpret_cast<const T *>(src[q]) + b, len, op);
    if (op == TSR_REDUCE_AVG) {
      if constexpr (std::is_integral_v<T>)
        for (size_t i = 0; i < len; i++) acc[i] /= static_cast<T>(world);
      else
        for (size_t i = 0; i < len; i++) acc[i] = static_cast<T>(static_cast<double>(acc[i]) * inv);
    }
    // out may be src[0] itself (all_reduce reduces in place in slot 0):
    // this block of it was read into acc above, before being written here.
    std::memcpy(out + b, acc, len * sizeof(T));
  }
}

void reduce_any(char *out, const char *const *src, uint32_t world, size_t lo, size_t hi,
                DLDataType dt, tsr_reduce_op op) {
  if (dt.code == kDLFloat && dt.bits == 32)
    reduce_into(reinterpret_cast<float *>(out), src, world, lo, hi, op);
  else if (dt.code == kDLFloat)
    reduce_into(reinterpret_cast<double *>(out), src, world, lo, hi, op);
  else
    reduce_into(reinterpret_cast<int64_t *>(out), src, world, lo, hi, op);
}

}  // namespace

std::unique_ptr<ShmGroup> ShmGroup::open(StoreClient &store, const std::string &prefix,
                                         uint32_t rank, uint32_t world, const std::string &host,
                                         std::chrono::milliseconds timeout, std::string *why) {
  const std::string key = prefix + "/shm/";
  store.set(key + "machine/" + std::to_string(rank), machine_id(host));
  // Rank 0 decides for everyone: the segment's name, or why not.
  if (rank == 0) {
    std::string verdict;
    const std::string mine = machine_id(host);
    for (uint32_t r = 1; r < world && verdict.empty(); r++)
      if (store.get(key + "machine/" + std::to_string(r), timeout) != mine)
        verdict = "-ranks on more than one host";
    size_t slot = std::clamp<size_t>((32u << 20) / world, 256u << 10, 4u << 20);
    slot = slot / 4096 * 4096;
    const size_t bytes = slots_offset(world) + 2 * slot * world;  // two sets
    std::string name;
    if (verdict.empty()) {
      std::random_device rd;
      name = "/tessera-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
      const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
      if (fd < 0) {
        verdict = std::string("-cannot create a shared-memory segment: ") + std::strerror(errno);
      } else {
        // Reserve the pages now: a full /dev/shm is a note here, not a
        // SIGBUS in the middle of a collective.
        const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
        void *base = err == 0 ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                              : MAP_FAILED;
        ::close(fd);
        if (base == MAP_FAILED) {
          ::shm_unlink(name.c_str());
          verdict = "-/dev/shm has no room for " + std::to_string(bytes >> 20) +
                    " MiB: " + std::strerror(err ? err : errno);
        } else {
          auto *h = static_cast<Header *>(base);
          h->world = world;
          h->slot = slot;
          for (uint32_t r = 0; r < world; r++) counter(base, r)->store(0);
          // The others map it only after reading its name from the store,
          // which rank 0 writes after this: no fence needed.
          h->magic = kMagic;
          ::munmap(base, bytes);
          verdict = name;
        }
      }
    }
    store.set(key + "segment", verdict);
  }
  const std::string seg = store.get(key + "segment", timeout);
  if (seg.empty() || seg[0] == '-') {
    if (why) *why = seg.empty() ? "no segment" : seg.substr(1);
    return nullptr;
  }
  const int fd = ::shm_open(seg.c_str(), O_RDWR, 0600);
  if (fd < 0)
    throw Error(TSR_ERR_COMM, "rank " + std::to_string(rank) + ": cannot open shared memory " +
                                  seg + ": " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  const size_t bytes = static_cast<size_t>(st.st_size);
  void *base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED)
    throw Error(TSR_ERR_COMM, "rank " + std::to_string(rank) + ": cannot map shared memory " + seg +
                                  ": " + std::strerror(errno));
  const auto *h = static_cast<const Header *>(base);
  if (h->magic != kMagic || h->world != world ||
      bytes < slots_offset(world) + 2 * h->slot * world) {
    ::munmap(base, bytes);
    throw Error(TSR_ERR_COMM, "rank " + std::to_string(rank) + ": shared memory " + seg +
                                  " is not this job's segment");
  }
  std::unique_ptr<ShmGroup> g(new ShmGroup(rank, world, h->slot, base, bytes, timeout));
  // Once every rank has it mapped the name can go: nothing is left behind
  // in /dev/shm, however the job ends.
  g->barrier();
  if (rank == 0) ::shm_unlink(seg.c_str());
  return g;
}

ShmGroup::ShmGroup(uint32_t rank, uint32_t world, size_t slot, void *base, size_t bytes,
                   std::chrono::milliseconds timeout)
    : rank_(rank), world_(world), slot_(slot), base_(base), bytes_(bytes), timeout_(timeout) {
  whole_.resize(world);
  piece_.resize(world);
  // Every rank of the group is on this node: a waiting rank spins only
  // while the node's threads fit its cores.
  spin_set_local_ranks(world);
}

ShmGroup::~ShmGroup() {
  ::munmap(base_, bytes_);
}

char *ShmGroup::slot(uint32_t r) const {
  return static_cast<char *>(base_) + slots_offset(world_) + slot_ * (set_ * world_ + r);
}

// Each round (write the slots, barrier, read them) uses the other set of
// slots than the round before. A rank can only write a set again two
// rounds later, after the middle round's barrier, which every rank reaches
// only once done reading it: no barrier is needed at the end of a round.
void ShmGroup::next_round() {
  set_ ^= 1;
  for (uint32_t q = 0; q < world_; q++) whole_[q] = slot(q);
}

void ShmGroup::barrier() {
  ++phase_;
  // seq_cst, with the loads below and the sleepers' count: a rank about to
  // sleep either sees this arrival or is seen asleep by the rank that sees
  // the barrier full.
  counter(base_, rank_)->store(phase_, std::memory_order_seq_cst);
  const auto all_arrived = [this] {
    for (uint32_t q = 0; q < world_; q++)
      if (counter(base_, q)->load(std::memory_order_seq_cst) < phase_) return false;
    return true;
  };
  // Spin while a core is free (a peer is usually microseconds behind),
  // else sleep: with more runnable threads than cores a spinning or
  // yielding rank takes the core its late peer needs, or is last in line
  // for one once the peer is done.
  if (!spin_until(all_arrived, kSpin, backoff_)) sleep_until(all_arrived);
  Header *h = header(base_);
  if (h->sleepers.load(std::memory_order_seq_cst) > 0) {
    h->wake_seq.fetch_add(1, std::memory_order_seq_cst);
    futex(&h->wake_seq, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

// Sleeps on the futex until every rank has arrived; the rank that sees the
// barrier full wakes the sleepers (a sleeper of the next barrier woken by
// it looks and sleeps again). Gives up after comm.timeout_s.
void ShmGroup::sleep_until(const std::function<bool()> &all_arrived) {
  const auto start = std::chrono::steady_clock::now();
  Header *h = header(base_);
  h->sleepers.fetch_add(1, std::memory_order_seq_cst);
  struct Leave {
    Header *h;
    ~Leave() { h->sleepers.fetch_sub(1, std::memory_order_seq_cst); }
  } leave{h};
  for (;;) {
    const uint32_t seq = h->wake_seq.load(std::memory_order_seq_cst);
    if (all_arrived()) break;
    const auto left = timeout_ - (std::chrono::steady_clock::now() - start);
    if (left <= std::chrono::steady_clock::duration::zero())
      throw std::runtime_error("timed out in a shared-memory barrier");
    // At most a second at a time, so the timeout is checked.
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::min<std::chrono::steady_clock::duration>(left, std::chrono::seconds(1)));
    const timespec ts{static_cast<time_t>(ns.count() / 1000000000),
                      static_cast<long>(ns.count() % 1000000000)};
    futex(&h->wake_seq, FUTEX_WAIT, seq, &ts);  // EAGAIN, ETIMEDOUT, EINTR: look again
  }
  backoff_.slept(std::chrono::steady_clock::now() - start, kSpin);
}

void ShmGroup::all_reduce(char *p, size_t n, DLDataType dt, tsr_reduce_op op) {
  const size_t es = dt.bits / 8, per = slot_ / es;
  for (size_t off = 0; off < n || (n == 0 && off == 0); off += per) {
    const size_t len = std::min(per, n - off);
    next_round();
    const char *const *src = whole_.data();
    std::memcpy(slot(rank_), p + off * es, len * es);
    barrier();
    // This rank reduces its share of the chunk, in place in slot 0 (each
    // element is read and written by one rank only).
    const size_t lo = len * rank_ / world_, hi = len * (rank_ + 1) / world_;
    reduce_any(slot(0), src, world_, lo, hi, dt, op);
    barrier();
    std::memcpy(p + off * es, slot(0), len * es);
    if (n == 0) break;
  }
}

void ShmGroup::reduce_scatter(const char *in, char *out, size_t n, DLDataType dt,
                              tsr_reduce_op op) {
  const size_t es = dt.bits / 8, per = std::max<size_t>(1, slot_ / es / world_);
  const char **src = piece_.data();
  for (size_t off = 0; off < n; off += per) {
    const size_t len = std::min(per, n - off);
    next_round();
    // Slot of this rank: each destination rank's piece of the chunk, in order.
    for (uint32_t q = 0; q < world_; q++)
      std::memcpy(slot(rank_) + q * len * es, in + (q * n + off) * es, len * es);
    barrier();
    for (uint32_t q = 0; q < world_; q++) src[q] = slot(q) + rank_ * len * es;
    reduce_any(out + off * es, src, world_, 0, len, dt, op);
  }
}

void ShmGroup::all_gather(const char *in, char *out, size_t bytes) {
  for (size_t off = 0; off < bytes || (bytes == 0 && off == 0); off += slot_) {
    const size_t len = std::min(slot_, bytes - off);
    next_round();
    std::memcpy(slot(rank_), in + off, len);
    barrier();
    for (uint32_t q = 0; q < world_; q++) std::memcpy(out + q * bytes + off, slot(q), len);
    if (bytes == 0) break;
  }
}

void ShmGroup::broadcast(char *p, size_t bytes, uint32_t root) {
  for (size_t off = 0; off < bytes || (bytes == 0 && off == 0); off += slot_) {
    const size_t len = std::min(slot_, bytes - off);
    next_round();
    if (rank_ == root) std::memcpy(slot(root), p + off, len);
    barrier();
    if (rank_ != root) std::memcpy(p + off, slot(root), len);
    if (bytes == 0) break;
  }
}

}  // namespace tessera

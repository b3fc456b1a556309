// The nvme backend's transfers to and from its state file (walk.cpp,
// extensions.cpp): whole buffers, one operation in flight per buffer,
// through io_uring where the kernel allows it, blocking pread / pwrite
// otherwise. One Io is used by one thread at a time: the walk and the
// fetches have one each.
#pragma once

#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "offload_common.hpp"

namespace tessera::offload::nvme {

using sdk::Error;

constexpr const char *kWho = "offload nvme";
// The buffers the block pipeline rotates through: one read, one update and
// one write at a time.
constexpr int kBuffers = 3;

// Reads and writes of whole buffers, one operation in flight per buffer
// (tag). io_uring when available; a short transfer is resubmitted for the
// rest. Without a ring every operation completes in start().
class Io {
 public:
  Io() = default;
  Io(const Io &) = delete;
  Io &operator=(const Io &) = delete;
  ~Io() {
    if (ring_ok_) {
      drain();
      io_uring_queue_exit(&ring_);
    }
  }
  // Returns 0, or the errno io_uring_queue_init failed with.
  int init_ring() {
    const int r = io_uring_queue_init(2 * kBuffers, &ring_, 0);
    ring_ok_ = r == 0;
    return r < 0 ? -r : 0;
  }
  bool ring() const { return ring_ok_; }

  int fd = -1;
  std::string name;  // for messages

  void start(int tag, bool write, char *buf, size_t len, off_t off) {
    Op &o = ops_[tag];
    if (o.busy) throw Error(TSR_ERR_INTERNAL, fmt("%s: buffer %d is busy", kWho, tag));
    o = Op{write, true, buf, len, 0, off, 0};
    if (!ring_ok_) {
      o.busy = false;
      sync(write, buf, len, off);
      return;
    }
    submit(tag);
  }
  // Waits for the operation of `tag`; throws if it failed.
  void wait(int tag) {
    wait(tag, [] {});
  }
  // The same, calling after_reap() after each completion taken on the way
  // (the walk learns of its earlier writes landing as they do).
  template <class F>
  void wait(int tag, F &&after_reap) {
    Op &o = ops_[tag];
    while (o.busy) {
      reap();
      after_reap();
    }
    if (o.err) {
      const int e = o.err;
      o.err = 0;
      fail(o.write, o.len, o.off, e);
    }
  }
  // Whether the last operation of `tag` has completed without error.
  bool landed(int tag) const { return !ops_[tag].busy && ops_[tag].err == 0; }
  // Waits for everything in flight, ignoring failures (teardown).
  void drain() {
    for (int t = 0; t < kBuffers; ++t) {
      while (ops_[t].busy) reap();
      ops_[t].err = 0;
    }
  }
  // A blocking transfer (checkpoints, start-up).
  void sync(bool write, char *buf, size_t len, off_t off) {
    size_t done = 0;
    while (done < len) {
      const ssize_t r = write ? pwrite(fd, buf + done, len - done, off + done)
                              : pread(fd, buf + done, len - done, off + done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) fail(write, len, off, r < 0 ? errno : EIO);
      done += static_cast<size_t>(r);
    }
  }

 private:
  struct Op {
    bool write = false, busy = false;
    char *buf = nullptr;
    size_t len = 0, done = 0;
    off_t off = 0;
    int err = 0;
  };

  [[noreturn]] void fail(bool write, size_t len, off_t off, int err) const {
    throw Error(TSR_ERR_IO,
                fmt("%s: %s of %zu bytes at offset %lld of %s failed: %s", kWho,
                    write ? "write" : "read", len, static_cast<long long>(off), name.c_str(),
                    err == EIO ? "I/O error or end of file" : std::strerror(err)));
  }
  void submit(int tag) {
    Op &o = ops_[tag];
    io_uring_sqe *sqe = io_uring_get_sqe(&ring_);
    if (!sqe) {
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
      if (!sqe) throw Error(TSR_ERR_INTERNAL, fmt("%s: io_uring queue full", kWho));
    }
    const unsigned len = static_cast<unsigned>(std::min<size_t>(o.len - o.done, 1u << 30));
    if (o.write)
      io_uring_prep_write(sqe, fd, o.buf + o.done, len, static_cast<__u64>(o.off) + o.done);
    else
      io_uring_prep_read(sqe, fd, o.buf + o.done, len, static_cast<__u64>(o.off) + o.done);
    sqe->user_data = static_cast<__u64>(tag);
    const int r = io_uring_submit(&ring_);
    if (r < 0) throw Error(TSR_ERR_IO, fmt("%s: io_uring_submit: %s", kWho, std::strerror(-r)));
  }
  // Takes one completion and moves its operation on.
  void reap() {
    io_uring_cqe *cqe = nullptr;
    const int r = io_uring_wait_cqe(&ring_, &cqe);
    if (r == -EINTR) return;
    if (r < 0) throw Error(TSR_ERR_IO, fmt("%s: io_uring_wait_cqe: %s", kWho, std::strerror(-r)));
    const int tag = static_cast<int>(cqe->user_data);
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    Op &o = ops_[tag];
    if (res == -EINTR || res == -EAGAIN) return submit(tag);
    if (res <= 0) {
      o.busy = false;
      o.err = res < 0 ? -res : EIO;
      return;
    }
    o.done += static_cast<size_t>(res);
    if (o.done < o.len) return submit(tag);
    o.busy = false;
  }

  io_uring ring_{};
  bool ring_ok_ = false;
  Op ops_[kBuffers];
};

}  // namespace tessera::offload::nvme

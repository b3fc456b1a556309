// A buffer of zeros that costs memory only where it is written: an
// anonymous private mapping, whose untouched pages are the kernel's shared
// zero page. The initial weights of a run live in one, as large as the
// whole flat layout on every rank, while a rank that keeps a slice of the
// parameters (ZeRO stage 3) writes, and so holds, only that slice.
#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

#include "util/error.hpp"

namespace tessera {

template <typename T>
class ZeroedPages {
 public:
  ZeroedPages() = default;
  explicit ZeroedPages(size_t n) : n_(n) {
    if (n == 0) return;
    void *p = ::mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      throw Error(TSR_ERR_NO_MEMORY, "cannot map " + std::to_string(n * sizeof(T)) +
                                         " bytes for the initial weights: " + std::strerror(errno));
    p_ = static_cast<T *>(p);
  }
  ZeroedPages(ZeroedPages &&o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  ZeroedPages &operator=(ZeroedPages &&o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ZeroedPages(const ZeroedPages &) = delete;
  ZeroedPages &operator=(const ZeroedPages &) = delete;
  ~ZeroedPages() {
    if (p_) ::munmap(p_, n_ * sizeof(T));
  }
  T *data() { return p_; }
  const T *data() const { return p_; }
  size_t size() const { return n_; }

 private:
  T *p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace tessera

// Noted value ranges of uploaded int32 buffers (known_ids.hpp).
#include "backend/cuda/known_ids.hpp"

#include <algorithm>
#include <mutex>
#include <vector>

namespace tessera::cuda {
namespace {

struct Noted {
  uintptr_t begin, end;
  int64_t lo, hi;
};

// A handful of entries (two device slots a loader, inputs and targets).
struct Registry {
  std::mutex mu;
  std::vector<Noted> noted;
};

Registry &registry() {
  static Registry *r = new Registry;  // never destroyed: ops may run during exit
  return *r;
}

}  // namespace

void note_int_range(const void *dev, size_t bytes, int64_t lo, int64_t hi) {
  Registry &r = registry();
  const auto b = reinterpret_cast<uintptr_t>(dev);
  std::lock_guard<std::mutex> lk(r.mu);
  std::erase_if(r.noted, [&](const Noted &n) { return n.begin == b; });
  r.noted.push_back({b, b + bytes, lo, hi});
}

void forget_int_range(const void *dev) {
  Registry &r = registry();
  const auto b = reinterpret_cast<uintptr_t>(dev);
  std::lock_guard<std::mutex> lk(r.mu);
  std::erase_if(r.noted, [&](const Noted &n) { return n.begin == b; });
}

bool ints_known_in(const void *p, size_t bytes, int64_t limit) {
  Registry &r = registry();
  const auto b = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lk(r.mu);
  return std::any_of(r.noted.begin(), r.noted.end(), [&](const Noted &n) {
    return b >= n.begin && b + bytes <= n.end && n.lo >= 0 && n.hi < limit;
  });
}

}  // namespace tessera::cuda

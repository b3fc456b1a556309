// Loaded weights must be numbers: a NaN or an infinity in a checkpoint, an
// export or an init_from file would train (or evaluate) to NaN without a
// word about where it came from.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>

#include "util/error.hpp"

namespace tessera {

// The index of the first NaN or infinity of p[0, n), or n when there is none.
inline size_t first_nonfinite(const float *p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return i;
  return n;
}

inline const char *nonfinite_name(float v) {
  return std::isnan(v) ? "NaN" : "infinite";
}

// Throws Error naming `what` (the file and tensor) and the first element of
// p[0, n) that is NaN or infinite.
inline void require_finite(const float *p, size_t n, const std::string &what) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i]))
      throw Error(TSR_ERR_INVALID, what + ": element " + std::to_string(i) + " is " +
                                       (std::isnan(p[i]) ? "NaN" : "infinite") +
                                       "; refusing to load weights that are not numbers (a "
                                       "diverged run's save, or a damaged or edited file)");
}

}  // namespace tessera

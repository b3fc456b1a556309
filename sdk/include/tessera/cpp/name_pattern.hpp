// Parameter name patterns, as models' `freeze` keys take them: '*' matches
// any run of characters (dots included), '?' any one character, anything
// else itself; and a model's `freeze` applied with them. Header-only, for
// plugins.
#pragma once

#include <tessera/model.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tessera/cpp/error.hpp>
#include <vector>

namespace tessera::sdk {

inline bool name_matches(const char *pattern, const char *name) {
  const char *star = nullptr, *resume = nullptr;
  while (*name) {
    if (*pattern == '*') {
      star = pattern++;
      resume = name;
    } else if (*pattern == '?' || *pattern == *name) {
      ++pattern;
      ++name;
    } else if (star) {  // let the last '*' take one more character
      pattern = star + 1;
      name = ++resume;
    } else {
      return false;
    }
  }
  while (*pattern == '*') ++pattern;
  return *pattern == '\0';
}

// `freeze`: marks the parameters each pattern matches untrainable; a
// pattern matching none is a config error naming it (`who`: "gpt2",
// `example`: a parameter name to show). Returns the lowest group holding a
// trainable parameter (groups are backward stages: below it backward
// computes nothing), or `none_trains` when everything is frozen.
inline int64_t apply_freeze(std::vector<tsr_param_info> &infos,
                            const std::vector<std::string> &patterns, const std::string &who,
                            const std::string &example, int64_t none_trains) {
  for (const std::string &pat : patterns) {
    size_t hits = 0;
    for (tsr_param_info &p : infos)
      if (name_matches(pat.c_str(), p.name)) {
        p.trainable = 0;
        ++hits;
      }
    if (hits == 0)
      throw Error(TSR_ERR_CONFIG, who + ": freeze pattern '" + pat +
                                      "' matches no parameter (names look like '" + example +
                                      "'; * matches any run)");
  }
  int64_t lowest = none_trains;
  for (const tsr_param_info &p : infos)
    if (p.trainable) lowest = std::min(lowest, static_cast<int64_t>(p.group));
  return lowest;
}

}  // namespace tessera::sdk

// Parameter name patterns, as models' `freeze` keys take them: '*' matches
// any run of characters (dots included), '?' any one character, anything
// else itself. Header-only, for plugins.
#pragma once

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

}  // namespace tessera::sdk

#include "util/regular_file.hpp"

#include "util/error.hpp"

namespace tessera {

namespace {

[[noreturn]] void fail(const std::string &path, const std::string &what, bool refused,
                       const std::string &why) {
  if (refused) throw Error(TSR_ERR_INVALID, what + " '" + path + "' " + why);
  throw Error(TSR_ERR_IO, "cannot read " + what + " '" + path + "': " + why);
}

}  // namespace

RegularFile open_regular(const std::string &path, const std::string &what) {
  RegularFile f = sdk::open_regular_file(path);
  if (!f) fail(path, what, f.refused, f.why);
  return f;
}

std::string read_regular(const std::string &path, const std::string &what, uint64_t max) {
  std::string text, why;
  bool refused = false;
  if (sdk::read_regular_file(path, &text, &why, max, &refused)) return text;
  fail(path, what, refused, why);
}

}  // namespace tessera

// The engine's side of tessera/cpp/regular_file.hpp: the same checks
// (a regular file, opened without blocking), failures thrown as Error with
// the file's role and path in front ("checkpoint manifest '…/manifest.json'
// is a FIFO (named pipe), not a regular file: …").
#pragma once

#include <cstdint>
#include <string>
#include <tessera/cpp/regular_file.hpp>

namespace tessera {

using sdk::RegularFile;

// Opens `path`, which is `what` ("checkpoint shard", "config"), or throws.
RegularFile open_regular(const std::string &path, const std::string &what);

// Reads all of it (at most `max` bytes), or throws.
std::string read_regular(const std::string &path, const std::string &what,
                         uint64_t max = uint64_t{1} << 30);

}  // namespace tessera

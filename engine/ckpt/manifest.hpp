// The structural check of a checkpoint manifest (manifest.json), before any
// of its numbers sizes an allocation or places a read: docs/security.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace tessera {

// Checks `m` (already known to be format "tessera-checkpoint"): where
// training stands (step, epoch, steps into the epoch, samples, global batch,
// loss scaler: each in range and consistent with the others), the parameter
// table (names, non-negative shapes whose element counts do not overflow),
// the slots, and every file's entry: a plain file name inside the checkpoint
// directory, its byte count, and each tensor's slot, element range, byte
// offset and block checksums, which must lie inside the file's declared
// bytes and inside the parameter table. A file's tensors follow one another
// to its end, and each slot's tensors tile the parameters exactly: no
// element in two, none in none. (A file shorter than its entry says fails
// where it is read: a short read, a checksum.) Throws tessera::Error naming
// `where` and the field.
void check_manifest(const nlohmann::json &m, const std::string &where);

// The checksum a version 3 manifest carries under "checksum": SHA-256 of
// the manifest without that key, dumped compactly (keys sorted).
std::string manifest_checksum(const nlohmann::json &m);

// Parses manifest.json's text (`where` names it in messages): valid JSON,
// format "tessera-checkpoint" version 3 with a matching checksum (any
// other version is refused), then check_manifest.
nlohmann::json parse_manifest(const std::string &text, const std::string &where);

// The checksum block of checkpoint tensors, in bytes (1 MiB).
inline constexpr size_t kCheckpointBlock = size_t{1} << 20;

}  // namespace tessera

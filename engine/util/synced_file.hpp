// Small files written so that a crash leaves the old content or the new,
// never a part (checkpoints' manifests and `latest`): the SDK's
// tessera/cpp/synced_file.hpp, which plugins' exports use too.
#pragma once

#include <tessera/cpp/synced_file.hpp>

namespace tessera {

using sdk::fsync_path;
using sdk::write_file_synced;

}  // namespace tessera

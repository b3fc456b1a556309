// Files written so that a crash leaves the old content or the new, never a
// part: the bytes go to PATH.tmp, are fsync'd, and PATH.tmp is renamed over
// PATH. Header-only, for the engine (manifests, `latest`) and plugins that
// write files of their own (an export's config.json).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <tessera/cpp/error.hpp>

namespace tessera::sdk {

// fsync of a file (dir = false) or of a directory's entries (dir = true);
// best effort: a path that cannot be opened is left as it is.
inline void fsync_path(const std::filesystem::path &p, bool dir) {
  const int fd = ::open(p.c_str(), dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Throws Error(TSR_ERR_IO) naming the file when the write or the rename
// fails.
inline void write_file_synced(const std::filesystem::path &path, const std::string &text) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc | std::ios::binary);
    out << text;
    out.flush();
    if (!out) throw Error(TSR_ERR_IO, tmp.string() + ": write failed (disk full?)");
  }
  fsync_path(tmp, false);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(TSR_ERR_IO, path.string() + ": cannot rename into place: " + ec.message());
}

}  // namespace tessera::sdk

// Finding, loading and registering plugin libraries.
#pragma once

#include <tessera/abi.h>

#include <memory>
#include <string>
#include <vector>

#include "plugin/caps.hpp"

namespace tessera {

struct PluginEntry {
  const tsr_plugin_descriptor *desc = nullptr;
  // The declared parameters as this host's struct: a plugin built against a
  // later minor version may declare larger structs, so the host steps
  // through its array by the plugin's struct_size and keeps the 1.0 fields.
  std::vector<tsr_param_decl> params;
  std::string kind;  // short kind name: "model", "optimizer", ...
  std::string file;  // the library it came from
  // Its optional entries and extensions, resolved when it loaded.
  PluginCaps caps;
  // The ABI its library was built for (tsr_plugin_library), for reports.
  uint32_t abi_major = 0, abi_minor = 0;

  // The plugin's table for extension `id` (extensions.h, TSR_EXT_*), or
  // nullptr when it offers none by that id (or predates ABI 1.2).
  const void *extension(const char *id) const;
  template <typename T>
  const T *extension(const char *id) const {
    const auto *t = static_cast<const T *>(extension(id));
    // A table shorter than the fields this host calls counts as absent.
    return t && t->struct_size >= sizeof(size_t) ? t : nullptr;
  }
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry &) = delete;
  Registry &operator=(const Registry &) = delete;

  // Loads every shared library in each directory (missing directories are
  // skipped). Libraries that cannot be used are recorded in refusals(). Each
  // is loaded first in a child process (load_file), so one that crashes or
  // hangs while loading is refused, not fatal.
  void scan(const std::vector<std::string> &dirs);
  // Loads one library; throws tessera::Error with the reason when it is
  // refused (the message names the file).
  void load_file(const std::string &path);

  // The plugin of `kind` (short name, "optimizer") called `name`, or nullptr.
  const PluginEntry *find(const std::string &kind, const std::string &name) const;
  // Same, but throws a ConfigError naming the known plugins of that kind.
  const PluginEntry &get(const std::string &kind, const std::string &name) const;
  const std::vector<PluginEntry> &plugins() const { return entries_; }
  const std::vector<std::string> &refusals() const { return refusals_; }

  // Where plugins are searched, in order: explicit dirs (--plugin-path,
  // run.plugin_path), TESSERA_PLUGIN_PATH, then the directory next to the
  // running binary (../lib/tessera/plugins: the build tree and the install
  // prefix alike).
  static std::vector<std::string> search_dirs(const std::vector<std::string> &explicit_dirs);

 private:
  struct Libs;
  std::unique_ptr<Libs> libs_;
  std::vector<PluginEntry> entries_;
  std::vector<std::string> refusals_;
  // load_file after its location checks and probe.
  void load_probed(const std::string &path);

  std::vector<std::string> dirs_;           // every directory scan() searched, for messages
  std::vector<std::string> refused_files_;  // the library of each scan refusal
};

// Why code must not be loaded from `path` (`what`: "plugin directory" or
// "plugin library"): world-writable, or owned by a user other than this one
// and root, itself or where its symbolic links lead; or under a directory
// anyone may write to (world-writable without the sticky bit). "" when it
// may (or does not exist).
std::string unsafe_plugin_location(const std::string &path, const char *what);

// "tessera.model/1" -> "model"; "" when the id is not a known kind.
std::string kind_short_name(const char *kind_id);
// Minimum struct_size of each kind's 1.0 vtable.
size_t kind_vtable_min_size(const std::string &kind);

}  // namespace tessera

// Plugin discovery and loading with Boost.DLL. Each refusal names the file
// and the reason; libraries stay loaded for the life of the process because
// plugin code and static descriptors must outlive every instance.
#include "plugin/registry.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <tessera/tessera.h>
#include <unistd.h>

#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "config/config.hpp"
#include "plugin/probe.hpp"
#include "util/error.hpp"

namespace fs = std::filesystem;

namespace tessera {

const void *PluginEntry::extension(const char *id) const {
  return caps_has_extensions(desc) ? desc->get_extension(id) : nullptr;
}

struct Registry::Libs {
  std::vector<boost::dll::shared_library> libs;
};

namespace {

// Libraries outlive their registry: never unloaded while the process runs.
std::vector<boost::dll::shared_library> &kept_libraries() {
  static auto *libs = new std::vector<boost::dll::shared_library>();
  return *libs;
}

struct KindInfo {
  const char *id;
  const char *short_name;
  size_t vtable_min;
};

const KindInfo kKinds[] = {
    {TSR_KIND_MODEL, "model", offsetof(tsr_model_vtable, predict)},  // predict: ABI 1.1
    {TSR_KIND_DATASET, "dataset", tsr_dataset_vtable_STRUCT_SIZE},
    {TSR_KIND_SAMPLER, "sampler", tsr_sampler_vtable_STRUCT_SIZE},
    {TSR_KIND_OPTIMIZER, "optimizer", tsr_optimizer_vtable_STRUCT_SIZE},
    // reshare: ABI 1.2, which a zero plugin needs (caps_zero_refusal)
    {TSR_KIND_ZERO, "zero", offsetof(tsr_zero_vtable, reshare)},
    {TSR_KIND_OFFLOAD, "offload", offsetof(tsr_offload_vtable, wait_params)},  // ABI 1.2
};

// Size of the 1.0 descriptor and library structs: the minimum we accept.
constexpr size_t kLibraryMin = offsetof(tsr_plugin_library, num_plugins) + sizeof(size_t);
constexpr size_t kDescriptorMin = offsetof(tsr_plugin_descriptor, vtable) + sizeof(void *);

bool is_shared_library(const fs::path &p) {
  std::string name = p.filename().string();
  return p.extension() == ".so" || name.find(".so.") != std::string::npos ||
         p.extension() == ".dylib";
}

// The checks of unsafe_plugin_location on one path itself (no ancestors).
std::string unsafe_plugin_location_real(const fs::path &p, const char *what) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return "";
  if (st.st_mode & S_IWOTH)
    return std::string(what) + " is world-writable; refusing to load code from it";
  if (st.st_uid != 0 && st.st_uid != ::geteuid())
    return std::string(what) + " is owned by another user (uid " + std::to_string(st.st_uid) + ")";
  return "";
}

}  // namespace

std::string unsafe_plugin_location(const std::string &path, const char *what) {
  // Code is loaded only from places no other user can write to: a
  // world-writable directory or library, or one another (non-root) user
  // owns, could hold anyone's code (docs/security.md, "Plugins").
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  if (st.st_mode & S_IWOTH)
    return path + ": " + what + " is world-writable, so anyone could put code there; refusing to " +
           "load from it (chmod o-w " + path + ")";
  if (st.st_uid != 0 && st.st_uid != ::geteuid())
    return path + ": " + what + " is owned by another user (uid " + std::to_string(st.st_uid) +
           "); refusing to load code from it";
  // Where it really is (symbolic links resolved), and every directory
  // above: one that anyone may write to without the sticky bit lets anyone
  // rename what is under it and put their own in its place.
  std::error_code ec;
  const fs::path real = fs::canonical(path, ec);
  if (ec) return "";
  if (real != fs::path(path))
    if (std::string why = unsafe_plugin_location_real(real, what); !why.empty())
      return path + " (really " + real.string() + "): " + why;
  for (fs::path dir = real.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    struct stat ds {};
    if (::stat(dir.c_str(), &ds) == 0 && (ds.st_mode & S_IWOTH) && !(ds.st_mode & S_ISVTX))
      return path + ": " + what + " lies under " + dir.string() +
             ", which anyone may write to (world-writable, no sticky bit): anyone could replace "
             "what is under it; refusing to load code from it";
    if (dir == dir.root_path()) break;
  }
  return "";
}

std::string kind_short_name(const char *kind_id) {
  if (!kind_id) return "";
  for (const auto &k : kKinds)
    if (std::string(kind_id) == k.id) return k.short_name;
  return "";
}

size_t kind_vtable_min_size(const std::string &kind) {
  for (const auto &k : kKinds)
    if (kind == k.short_name) return k.vtable_min;
  return 0;
}

Registry::Registry() : libs_(std::make_unique<Libs>()) {}

Registry::~Registry() {
  auto &kept = kept_libraries();
  for (auto &l : libs_->libs) kept.push_back(std::move(l));
}

namespace {

// The short kind of descriptor `d` (named `at` in errors), its function
// table checked: at least the 1.0 table, and for a zero plugin 1.2's.
std::string checked_kind(const tsr_plugin_descriptor *d, const std::string &at) {
  std::string kind = kind_short_name(d->kind);
  if (kind.empty())
    throw Error(TSR_ERR_UNSUPPORTED,
                at + " has unknown kind '" + (d->kind ? d->kind : "(null)") + "'");
  if (!d->vtable) throw Error(TSR_ERR_INVALID, at + " has no function table");
  size_t vt_size = *static_cast<const size_t *>(d->vtable);
  if (vt_size < kind_vtable_min_size(kind))
    throw Error(TSR_ERR_INVALID, at + ": " + kind + " function table is " +
                                     std::to_string(vt_size) + " bytes, smaller than the " +
                                     std::to_string(kind_vtable_min_size(kind)) +
                                     " bytes ABI 1.0 requires");
  if (kind == "zero")
    if (std::string why = caps_zero_refusal(d); !why.empty())
      throw Error(TSR_ERR_UNSUPPORTED, at + " is " + why);
  return kind;
}

// The declared parameters of `d` as this host's struct: a plugin built
// against a later minor may declare larger ones.
std::vector<tsr_param_decl> param_decls(const tsr_plugin_descriptor *d, const std::string &at) {
  if (d->num_params > 0 && !d->params) throw Error(TSR_ERR_INVALID, at + " has a NULL params list");
  std::vector<tsr_param_decl> params;
  if (d->num_params == 0) return params;
  // Elements are d->params[0].struct_size apart (append-only growth).
  const size_t stride = d->params[0].struct_size;
  if (stride < sizeof(tsr_param_decl) || stride > 4096)
    throw Error(TSR_ERR_INVALID, at + ": parameter declarations are " + std::to_string(stride) +
                                     " bytes; ABI 1.0 needs at least " +
                                     std::to_string(sizeof(tsr_param_decl)));
  const char *base = reinterpret_cast<const char *>(d->params);
  for (size_t k = 0; k < d->num_params; ++k) {
    tsr_param_decl pd;
    std::memcpy(&pd, base + k * stride, sizeof pd);
    if (pd.struct_size != stride || !pd.name || !*pd.name)
      throw Error(TSR_ERR_INVALID,
                  at + ": parameter #" + std::to_string(k) +
                      " is malformed (struct_size differs from the first, or no name)");
    pd.struct_size = sizeof pd;
    params.push_back(pd);
  }
  return params;
}

}  // namespace

namespace {

// The library and the directory it is in, against unsafe_plugin_location.
void check_location(const std::string &path) {
  for (const auto &[p, what] : {std::pair<std::string, const char *>{path, "plugin library"},
                                {fs::path(path).parent_path().string(), "plugin directory"}})
    if (std::string why = unsafe_plugin_location(p.empty() ? "." : p, what); !why.empty())
      throw Error(TSR_ERR_INVALID, why);
}

}  // namespace

void Registry::load_file(const std::string &path) {
  check_location(path);
  if (std::string why = probe_libraries({path}).at(0); !why.empty())
    throw Error(TSR_ERR_INVALID, why);
  load_probed(path);
}

void Registry::load_probed(const std::string &path) {
  boost::dll::shared_library lib;
  std::error_code ec;
  lib.load(path, ec, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  if (ec) {
    const char *why = dlerror();
    throw Error(TSR_ERR_IO, path + ": cannot load library: " + (why ? why : ec.message()));
  }
  if (!lib.has(TSR_ENTRY_SYMBOL))
    throw Error(TSR_ERR_INVALID,
                path + ": not a tessera plugin (no '" TSR_ENTRY_SYMBOL "' symbol exported)");
  auto entry = lib.get<const tsr_plugin_library *()>(TSR_ENTRY_SYMBOL);
  const tsr_plugin_library *l = entry();
  if (!l) throw Error(TSR_ERR_INVALID, path + ": " TSR_ENTRY_SYMBOL "() returned NULL");
  if (l->struct_size < kLibraryMin)
    throw Error(TSR_ERR_INVALID, path + ": library descriptor is " +
                                     std::to_string(l->struct_size) + " bytes, smaller than the " +
                                     std::to_string(kLibraryMin) + " bytes ABI 1.0 requires");
  if (l->abi_major != TSR_ABI_MAJOR)
    throw Error(TSR_ERR_UNSUPPORTED,
                path + ": built for tessera ABI " + std::to_string(l->abi_major) + "." +
                    std::to_string(l->abi_minor) + ", but this tessera speaks ABI " +
                    std::to_string(TSR_ABI_MAJOR) + "." + std::to_string(TSR_ABI_MINOR) +
                    "; rebuild the plugin against this SDK");
  if (l->num_plugins > 0 && !l->plugins)
    throw Error(TSR_ERR_INVALID, path + ": library lists plugins but the list is NULL");
  std::vector<PluginEntry> found;
  for (size_t i = 0; i < l->num_plugins; ++i) {
    const tsr_plugin_descriptor *d = l->plugins[i];
    std::string at = path + ": plugin #" + std::to_string(i);
    if (!d) throw Error(TSR_ERR_INVALID, at + " is NULL");
    if (d->struct_size < kDescriptorMin)
      throw Error(TSR_ERR_INVALID, at + ": descriptor is " + std::to_string(d->struct_size) +
                                       " bytes, smaller than the " +
                                       std::to_string(kDescriptorMin) + " bytes ABI 1.0 requires");
    if (!d->name || !*d->name) throw Error(TSR_ERR_INVALID, at + " has no name");
    at = path + ": plugin '" + d->name + "'";
    const std::string kind = checked_kind(d, at);
    std::vector<tsr_param_decl> params = param_decls(d, at);
    for (const auto &e : entries_)
      if (e.kind == kind && std::string(e.desc->name) == d->name)
        throw Error(TSR_ERR_INVALID, "two " + kind + " plugins named '" + d->name + "': " + e.file +
                                         " and " + path +
                                         " (the library loaded second is refused)");
    for (const auto &e : found)
      if (e.kind == kind && std::string(e.desc->name) == d->name)
        throw Error(TSR_ERR_INVALID,
                    path + " declares two " + kind + " plugins named '" + d->name + "'");
    found.push_back(PluginEntry{d, std::move(params), kind, path, caps_resolve(kind, d),
                                l->abi_major, l->abi_minor});
  }
  for (auto &e : found) entries_.push_back(std::move(e));
  libs_->libs.push_back(std::move(lib));
}

void Registry::scan(const std::vector<std::string> &dirs) {
  std::vector<std::string> seen;
  // Every library of every directory that may be loaded, probed side by
  // side under one deadline (plugin/probe.hpp), then loaded in order.
  std::vector<std::string> candidates;
  const auto refuse = [this](const std::string &why, const std::string &file) {
    refusals_.push_back(why);
    refused_files_.push_back(file);
  };
  for (const auto &dir : dirs) {
    std::error_code ec;
    const bool there = fs::is_directory(dir, ec);
    dirs_.push_back(there ? dir : dir + " (missing)");
    if (!there) continue;
    if (std::string why = unsafe_plugin_location(dir, "plugin directory"); !why.empty()) {
      refuse(why, dir);
      continue;
    }
    std::vector<fs::path> files;
    for (const auto &ent : fs::directory_iterator(dir, ec))
      if (ent.is_regular_file() && is_shared_library(ent.path())) files.push_back(ent.path());
    std::sort(files.begin(), files.end());
    for (const auto &f : files) {
      std::string canon = fs::weakly_canonical(f, ec).string();
      if (std::find(seen.begin(), seen.end(), canon) != seen.end()) continue;
      seen.push_back(canon);
      try {
        check_location(f.string());
        candidates.push_back(f.string());
      } catch (const Error &e) {
        refuse(e.what(), f.string());
      }
    }
  }
  const std::vector<std::string> verdicts = probe_libraries(candidates);
  for (size_t i = 0; i < candidates.size(); ++i) {
    try {
      if (!verdicts[i].empty()) throw Error(TSR_ERR_INVALID, verdicts[i]);
      load_probed(candidates[i]);
    } catch (const Error &e) {
      refuse(e.what(), candidates[i]);
    }
  }
}

const PluginEntry *Registry::find(const std::string &kind, const std::string &name) const {
  for (const auto &e : entries_)
    if (e.kind == kind && name == e.desc->name) return &e;
  return nullptr;
}

const PluginEntry &Registry::get(const std::string &kind, const std::string &name) const {
  if (const auto *e = find(kind, name)) return *e;
  std::vector<std::string> names;
  for (const auto &e : entries_)
    if (e.kind == kind) names.push_back(e.desc->name);
  std::string msg = "no " + kind + " plugin named '" + name + "'";
  std::string dym = config::did_you_mean(name, names);
  if (!dym.empty()) msg += "; did you mean '" + dym + "'?";
  msg += " (known " + kind + " plugins:";
  for (const auto &n : names) msg += " " + n;
  if (names.empty()) msg += " none";
  msg += "); searched";
  for (size_t i = 0; i < dirs_.size(); ++i) msg += (i ? ", " : " ") + dirs_[i];
  if (dirs_.empty()) msg += " no directory";
  // The plugin may be in a library that was refused (another ABI, a crash
  // while loading): a refused library's plugins cannot be read, so the one
  // whose file name holds the plugin's name is the likely one; say why.
  size_t named = 0;
  for (size_t i = 0; i < refused_files_.size(); ++i)
    if (fs::path(refused_files_[i]).filename().string().find(name) != std::string::npos) {
      msg += "; a library that may hold it was refused: " + refusals_[i];
      ++named;
    }
  if (named == 0 && !refused_files_.empty())
    msg += "; " + std::to_string(refused_files_.size()) +
           " plugin libraries were refused ('tessera plugins' says why)";
  msg +=
      "; a plugin built elsewhere is found with --plugin-path DIR (or run.plugin_path, or "
      "TESSERA_PLUGIN_PATH) naming the directory that holds its library";
  throw config::ConfigError(msg);
}

std::vector<std::string> Registry::search_dirs(const std::vector<std::string> &explicit_dirs) {
  std::vector<std::string> dirs = explicit_dirs;
  if (const char *env = std::getenv("TESSERA_PLUGIN_PATH")) {
    std::string s = env, cur;
    for (char c : s + ":") {
      if (c == ':') {
        if (!cur.empty()) dirs.push_back(cur);
        cur.clear();
      } else {
        cur.push_back(c);
      }
    }
  }
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec)
    dirs.push_back((exe.parent_path().parent_path() / "lib" / "tessera" / "plugins").string());
#ifdef TESSERA_INSTALL_PLUGIN_DIR
  dirs.push_back(TESSERA_INSTALL_PLUGIN_DIR);
#endif
  return dirs;
}

}  // namespace tessera

#include "plugin/verify.hpp"

#include <elf.h>
#include <tessera/tessera.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "config/validate.hpp"
#include "plugin/registry.hpp"
#include "util/error.hpp"
#include "util/regular_file.hpp"

namespace fs = std::filesystem;

namespace tessera {

std::vector<std::string> elf_exported_symbols(const std::string &path) {
  const std::string b = read_regular(path, "plugin library");
  auto bad = [&](const std::string &why) -> Error {
    return Error(TSR_ERR_INVALID, path + ": not a well-formed ELF library: " + why);
  };
  // [off, off + n) inside the file, without overflow.
  auto inside = [&](uint64_t off, uint64_t n) { return off <= b.size() && n <= b.size() - off; };
  Elf64_Ehdr eh;
  if (!inside(0, sizeof eh)) throw bad("too short");
  std::memcpy(&eh, b.data(), sizeof eh);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) throw bad("no ELF magic");
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB)
    throw bad("not 64-bit little-endian");
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 ||
      !inside(eh.e_shoff, uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr)))
    throw bad("section headers outside the file");
  auto section = [&](size_t i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, b.data() + eh.e_shoff + i * sizeof sh, sizeof sh);
    return sh;
  };
  std::vector<std::string> out;
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr sh = section(i);
    if (sh.sh_type != SHT_DYNSYM) continue;
    if (sh.sh_entsize != sizeof(Elf64_Sym) || !inside(sh.sh_offset, sh.sh_size) ||
        sh.sh_link >= eh.e_shnum)
      throw bad("dynamic symbol table outside the file");
    const Elf64_Shdr str = section(sh.sh_link);
    if (str.sh_type != SHT_STRTAB || !inside(str.sh_offset, str.sh_size))
      throw bad("dynamic string table outside the file");
    for (uint64_t k = 0; k < sh.sh_size / sizeof(Elf64_Sym); ++k) {
      Elf64_Sym sym;
      std::memcpy(&sym, b.data() + sh.sh_offset + k * sizeof sym, sizeof sym);
      const unsigned bind = ELF64_ST_BIND(sym.st_info), type = ELF64_ST_TYPE(sym.st_info);
      if (sym.st_shndx == SHN_UNDEF || sym.st_name == 0) continue;
      if (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE) continue;
      if (ELF64_ST_VISIBILITY(sym.st_other) != STV_DEFAULT) continue;
      if (type == STT_SECTION || type == STT_FILE) continue;
      if (sym.st_name >= str.sh_size) throw bad("a symbol name lies outside its string table");
      const char *name = b.data() + str.sh_offset + sym.st_name;
      const size_t max = str.sh_size - sym.st_name;
      out.emplace_back(name, strnlen(name, max));
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::string> plugin_libraries(const std::vector<std::string> &dirs) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto &dir : dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    std::vector<std::string> files;
    for (const auto &e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (e.is_regular_file() &&
          (e.path().extension() == ".so" || name.find(".so.") != std::string::npos))
        files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    for (const auto &f : files)
      if (seen.insert(fs::weakly_canonical(f, ec).string()).second) out.push_back(f);
  }
  return out;
}

PluginVerdict verify_plugin_library(const std::string &path) {
  PluginVerdict v;
  v.file = path;
  // 1. What it exports: the entry symbol and nothing else (tessera_add_plugin
  // hides the rest; an exported symbol can bind to the host's or another
  // plugin's by the same name).
  try {
    const std::vector<std::string> syms = elf_exported_symbols(path);
    std::vector<std::string> extra;
    bool entry = false;
    for (const auto &s : syms) {
      if (s == TSR_ENTRY_SYMBOL)
        entry = true;
      else
        extra.push_back(s);
    }
    if (!entry) v.problems.push_back("does not export " TSR_ENTRY_SYMBOL);
    if (!extra.empty()) {
      std::string list;
      for (size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + extra[i];
      if (extra.size() > 8) list += ", ...";
      v.problems.push_back("exports " + std::to_string(extra.size()) + " symbol(s) besides " +
                           TSR_ENTRY_SYMBOL + ": " + list +
                           " (build it with tessera_add_plugin, which hides them)");
    }
    if (!entry) return v;
  } catch (const Error &e) {
    v.problems.push_back(e.what());
    return v;
  }
  // 2. The registry's checks: where it lies, ABI, descriptors, kinds, tables.
  Registry reg;
  try {
    reg.load_file(path);
  } catch (const Error &e) {
    v.problems.push_back(e.what());
    return v;
  }
  // 3. Each plugin's metadata and declared parameters.
  for (const auto &e : reg.plugins()) {
    const auto *d = e.desc;
    v.plugins.push_back(e.kind + " " + d->name + " " + (d->version ? d->version : "?"));
    const std::string at = e.kind + " '" + d->name + "'";
    if (!d->version || !*d->version) v.problems.push_back(at + " has no version");
    if (!d->summary || !*d->summary) v.problems.push_back(at + " has no summary");
    if (d->devices == 0 || (d->devices & ~uint32_t{TSR_DEVICE_CPU | TSR_DEVICE_CUDA}) != 0)
      v.problems.push_back(at + " declares unknown devices (" + std::to_string(d->devices) + ")");
    std::set<std::string> names;
    for (const auto &p : e.params) {
      const std::string pat = at + " parameter '" + p.name + "'";
      if (!names.insert(p.name).second) v.problems.push_back(pat + " is declared twice");
      if (std::string(config::type_name(p.type)) == "an unknown type")
        v.problems.push_back(pat + " has an unknown type " + std::to_string(p.type));
      if (p.has_min && p.has_max && p.min > p.max)
        v.problems.push_back(pat + " has an empty range");
      if (p.default_value) {
        try {
          (void)config::parse_default(p, at);
        } catch (const std::exception &ex) {
          v.problems.push_back(pat + ": default does not parse: " + ex.what());
        }
      }
    }
  }
  return v;
}

}  // namespace tessera

// Plugin loading rules (docs/security.md, "Plugins"): code never loads from
// a world-writable directory or library, nor from one another non-root user
// owns; `tessera plugins --verify` reads a library's exported symbols from
// its ELF symbol table and checks its descriptors.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "plugin/registry.hpp"
#include "plugin/verify.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_plugin_security {

namespace fs = std::filesystem;

namespace {

struct TempPluginDir {
  fs::path dir;
  fs::path lib;
  TempPluginDir() {
    std::string tmpl = (fs::temp_directory_path() / "tessera_plugsec_XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()));
    dir = tmpl;
    ::chmod(dir.c_str(), 0755);
    lib = dir / "libtsr_optimizer_sgd.so";
    fs::copy_file(fs::path(TESSERA_TEST_PLUGIN_DIR) / "libtsr_optimizer_sgd.so", lib);
    ::chmod(lib.c_str(), 0755);
  }
  ~TempPluginDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

TEST_CASE("plugins load from a private directory", "[security][plugins]") {
  TempPluginDir t;
  tessera::Registry reg;
  reg.scan({t.dir.string()});
  CHECK(reg.refusals().empty());
  CHECK(reg.find("optimizer", "sgd") != nullptr);
}

TEST_CASE("a world-writable plugin directory is refused, naming it", "[security][plugins]") {
  TempPluginDir t;
  ::chmod(t.dir.c_str(), 0777);
  tessera::Registry reg;
  reg.scan({t.dir.string()});
  REQUIRE(reg.refusals().size() == 1);
  CHECK_THAT(reg.refusals()[0],
             Catch::Contains(t.dir.string()) && Catch::Contains("world-writable"));
  CHECK(reg.find("optimizer", "sgd") == nullptr);
}

TEST_CASE("a world-writable plugin library is refused, naming it", "[security][plugins]") {
  TempPluginDir t;
  ::chmod(t.lib.c_str(), 0777);
  tessera::Registry reg;
  reg.scan({t.dir.string()});
  REQUIRE(reg.refusals().size() == 1);
  CHECK_THAT(reg.refusals()[0],
             Catch::Contains(t.lib.string()) && Catch::Contains("world-writable"));
  CHECK_THROWS_WITH(reg.load_file(t.lib.string()), Catch::Contains("world-writable"));
}

TEST_CASE("a plugin library another user owns is refused", "[security][plugins]") {
  if (::geteuid() != 0) {
    // Only root can give a file away; elsewhere the check is the same code.
    SUCCEED("not root: cannot chown a file to another user here");
    return;
  }
  TempPluginDir t;
  REQUIRE(::chown(t.lib.c_str(), 65534, 65534) == 0);
  tessera::Registry reg;
  reg.scan({t.dir.string()});
  REQUIRE(reg.refusals().size() == 1);
  CHECK_THAT(reg.refusals()[0], Catch::Contains("owned by another user (uid 65534)"));
}

TEST_CASE("plugins --verify: exported symbols and descriptors", "[security][plugins]") {
  const std::string lib = std::string(TESSERA_TEST_PLUGIN_DIR) + "/libtsr_optimizer_adam.so";
  CHECK(tessera::elf_exported_symbols(lib) == std::vector<std::string>{"tessera_plugin_library"});
  const tessera::PluginVerdict v = tessera::verify_plugin_library(lib);
  INFO((v.problems.empty() ? std::string() : v.problems[0]));
  CHECK(v.problems.empty());
  REQUIRE(!v.plugins.empty());
  CHECK_THAT(v.plugins[0], Catch::StartsWith("optimizer adam"));
  // Every shipped plugin passes.
  for (const auto &l : tessera::plugin_libraries({TESSERA_TEST_PLUGIN_DIR})) {
    const auto r = tessera::verify_plugin_library(l);
    INFO(l << ": " << (r.problems.empty() ? std::string() : r.problems[0]));
    CHECK(r.problems.empty());
  }
  // Libraries the registry refuses fail verification with its reason.
  for (const char *bad : {"no_entry", "abi_major", "small_descriptor", "unknown_kind"})
    for (const auto &l :
         tessera::plugin_libraries({std::string(TESSERA_TEST_BAD_PLUGIN_DIR) + "/" + bad})) {
      if (l.find("_good") != std::string::npos) continue;  // each case's loadable neighbour
      INFO(l);
      CHECK(!tessera::verify_plugin_library(l).problems.empty());
    }
  // Not an ELF file: refused before anything is loaded.
  CHECK_THROWS_WITH(tessera::elf_exported_symbols(std::string(TESSERA_SOURCE_DIR) + "/README.md"),
                    Catch::Contains("no ELF magic"));
}

TEST_CASE("a library that crashes as it loads is refused, and the scan goes on",
          "[security][plugins]") {
  // Its constructor raises SIGSEGV: loaded in this process it would end the
  // test binary here. The registry loads it in a child first.
  const fs::path dir = fs::path(TESSERA_TEST_BAD_PLUGIN_DIR) / "ctor_crash";
  const std::string lib = (dir / "libtsr_test_ctor_crash.so").string();
  tessera::Registry reg;
  reg.scan({dir.string()});
  REQUIRE(reg.refusals().size() == 1);
  // Under ASan the child reports the signal and exits 1 instead of dying by it.
  CHECK_THAT(reg.refusals()[0], Catch::Contains(lib) && Catch::Contains("while loading") &&
                                    Catch::Contains("child process"));
#if !defined(__SANITIZE_ADDRESS__)
  CHECK_THAT(reg.refusals()[0], Catch::Contains("crashed while loading (signal 11, SIGSEGV"));
#endif
  // The good library next to it still loads.
  CHECK(reg.plugins().size() == 1);
  CHECK_THROWS_WITH(reg.load_file(lib), Catch::Contains("while loading"));
}

TEST_CASE("a plugin the config needs names why its library was refused", "[security][plugins]") {
  // "no optimizer plugin named X" alone hides that X's library is there
  // but was built for another ABI.
  tessera::Registry reg;
  reg.scan({(fs::path(TESSERA_TEST_BAD_PLUGIN_DIR) / "abi_major").string()});
  CHECK_THROWS_WITH(reg.get("optimizer", "abi_major"),
                    Catch::Contains("no optimizer plugin named 'abi_major'") &&
                        Catch::Contains("libtsr_test_abi_major.so") &&
                        Catch::Contains("built for tessera ABI 2.3"));
  // Another name: the refusals are counted, not guessed at.
  CHECK_THROWS_WITH(reg.get("optimizer", "lion"),
                    Catch::Contains("1 plugin libraries were refused"));
}

TEST_CASE("plugin paths: symbolic links are resolved, writable parents refused",
          "[security][plugins]") {
  TempPluginDir t;
  SECTION("a directory under a world-writable one (no sticky bit)") {
    const fs::path open = t.dir / "open", inner = open / "plugins";
    fs::create_directories(inner);
    ::chmod(open.c_str(), 0777);
    fs::copy_file(t.lib, inner / t.lib.filename());
    tessera::Registry reg;
    reg.scan({inner.string()});
    REQUIRE(reg.refusals().size() == 1);
    CHECK_THAT(reg.refusals()[0],
               Catch::Contains(open.string()) && Catch::Contains("anyone may write to"));
    CHECK(reg.find("optimizer", "sgd") == nullptr);
  }
  SECTION("a link in a private directory to a library in a world-writable one") {
    const fs::path open = t.dir / "open", priv = t.dir / "private";
    fs::create_directories(open);
    fs::create_directories(priv);
    ::chmod(open.c_str(), 0777);
    fs::copy_file(t.lib, open / t.lib.filename());
    fs::create_symlink(open / t.lib.filename(), priv / t.lib.filename());
    tessera::Registry reg;
    CHECK_THROWS_WITH(reg.load_file((priv / t.lib.filename()).string()),
                      Catch::Contains("really " + (open / t.lib.filename()).string()) ||
                          Catch::Contains(open.string()));
  }
}

}  // namespace unit_test_plugin_security

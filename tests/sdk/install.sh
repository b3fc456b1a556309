#!/usr/bin/env bash
# install.sh BUILD_DIR PREFIX: `cmake --install BUILD_DIR --prefix PREFIX`
# into an empty PREFIX, then checks what a plugin author relies on:
#  - the layout: bin/tessera, lib/tessera/plugins/*.so, include/tessera/,
#    lib/cmake/Tessera/ (package, version file, tessera_add_plugin, version
#    script), lib/pkgconfig/tessera.pc;
#  - the installed tessera finds its own plugins from any working directory,
#    with no plugin path set (next to the binary: PREFIX/lib/tessera/plugins);
#  - `tessera plugin new` knows it is installed and prints this prefix;
#  - pkg-config gives the include flags, and a C plugin built with nothing
#    but cc and pkg-config loads.
# The prefix is then used by the other sdk tests (ctest fixture sdk_prefix).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"
build=$1 prefix=$2
src="$(cd "$here/../.." && pwd)"

rm -rf "$prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null

for f in bin/tessera include/tessera/tessera.h include/tessera/abi.h \
  include/tessera/cpp/plugin.hpp include/tessera/cpp/optimizer.hpp \
  lib/cmake/Tessera/TesseraConfig.cmake lib/cmake/Tessera/TesseraConfigVersion.cmake \
  lib/cmake/Tessera/TesseraTargets.cmake lib/cmake/Tessera/TesseraPlugin.cmake \
  lib/cmake/Tessera/tessera_plugin.map lib/pkgconfig/tessera.pc \
  lib/tessera/plugins/libtsr_model_mlp.so lib/tessera/plugins/libtsr_zero.so; do
  [ -e "$prefix/$f" ] || fail "cmake --install did not install $f"
done
echo "installed into $prefix"

# Its own plugins, from elsewhere, with nothing pointing at them.
elsewhere=$(mktemp -d)
trap 'rm -rf "$elsewhere"' EXIT
listing=$(cd "$elsewhere" && env -u TESSERA_PLUGIN_PATH PATH="$prefix/bin:$PATH" tessera plugins)
for p in mlp idx distributed sequential sgd adam stage0 stage3 none; do
  grep -q " $p .*$prefix/lib/tessera/plugins/" <<<"$listing" ||
    fail "the installed tessera, run from $elsewhere, does not list '$p' from $prefix/lib/tessera/plugins:
$listing"
done
if grep -q "^refused" <<<"$listing"; then fail "refused plugins in a fresh install: $listing"; fi
echo "the installed tessera finds its plugins from any directory"

# tessera plugin new from the install names the prefix for find_package.
out=$(cd "$elsewhere" && "$prefix/bin/tessera" plugin new optimizer probe)
grep -q -- "-DCMAKE_PREFIX_PATH=$prefix" <<<"$out" ||
  fail "tessera plugin new does not suggest -DCMAKE_PREFIX_PATH=$prefix: $out"

# pkg-config, and a plugin built with it alone.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# (paths are relative to the .pc file, so compare them resolved)
real() { (cd "$1" && pwd -P); }
cflags=$(pkg-config --cflags tessera)
incdir=$(echo "$cflags" | tr ' ' '\n' | grep -m1 '^-I' | cut -c3-)
[ "$(real "$incdir")" = "$(real "$prefix/include")" ] || fail "pkg-config --cflags tessera: $cflags"
[ "$(real "$(pkg-config --variable=plugindir tessera)")" = "$(real "$prefix/lib/tessera/plugins")" ] ||
  fail "pkg-config plugindir is $(pkg-config --variable=plugindir tessera)"
[ "$(pkg-config --variable=abi_version tessera)" = "$("$prefix/bin/tessera" version | head -1 |
  sed -E 's/.*ABI ([0-9.]+).*/\1/')" ] || fail "pkg-config abi_version differs from tessera version"
mkdir -p "$elsewhere/pc"
# shellcheck disable=SC2046
cc -std=c99 -pedantic -Wall -Wextra -Werror -O2 $cflags \
  $(pkg-config --variable=plugin_cflags tessera) -c "$src/examples/lion_c/lion.c" \
  -o "$elsewhere/pc/lion.o"
# shellcheck disable=SC2046
cc -o "$elsewhere/pc/liblion.so" "$elsewhere/pc/lion.o" $(pkg-config --variable=plugin_ldflags tessera)
check_exports "${NM:-nm}" "$elsewhere/pc/liblion.so"
shown=$("$prefix/bin/tessera" plugins show lion --plugin-path "$elsewhere/pc")
grep -q "^optimizer lion" <<<"$shown" ||
  fail "the plugin built with pkg-config does not load"
echo "pkg-config: a C plugin built with cc and pkg-config loads"

#!/usr/bin/env bash
# check_exports.sh NM LIB...: the exported-symbol allow-list of plugin
# libraries. Each must export exactly one dynamic symbol, the entry point
# tessera_plugin_library (docs/abi.md); anything else (a helper without
# hidden visibility, a C++ template instance) could clash with the host's or
# another plugin's symbols.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
check_exports "$@"

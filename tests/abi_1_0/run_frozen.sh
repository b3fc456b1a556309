#!/usr/bin/env bash
# run_frozen.sh TESSERA PLUGIN_DIR CONFIG RUN_DIR: the plugins built against
# the frozen ABI 1.0 headers load into this tessera (every one listed, no
# library refused) and train frozen.toml's 20 steps, the loss going down.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../sdk/lib.sh"
tessera=$1 plugins=$2 config=$3 run=$4
listing=$("$tessera" plugins --plugin-path "$plugins")
for p in "dataset *frozen_blobs" "sampler *frozen_blocks" "model *frozen_linear" \
  "optimizer *frozen_sgd" "offload *frozen_host"; do
  grep -q "^$p " <<<"$listing" || fail "not loaded: $p
$listing"
done
if grep -q "^refused" <<<"$listing"; then fail "refused: $listing"; fi
echo "all five ABI 1.0 plugins load"
check_exports "${NM:-nm}" "$plugins"/*.so
train_check "$tessera" "$config" "$run" --plugin-path "$plugins"

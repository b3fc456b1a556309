// The fuzz targets' entry functions (docs/security.md, "Fuzzing"): each
// takes untrusted bytes, feeds them to one of tessera's readers, and
// returns 0. A reader may refuse the bytes with an exception; it must
// never crash, read out of bounds or allocate without bound. The libFuzzer
// binaries (tools/fuzz) and the unit test that replays tests/fuzz/corpus and
// tests/fuzz/regressions call the same functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::fuzz {

using Entry = int (*)(const uint8_t *data, size_t size);

struct Target {
  const char *name;  // tests/fuzz/corpus/<name>, regressions/<name>
  Entry entry;
};

// Every target, by name.
const std::vector<Target> &targets();
// The entry of `name`, or nullptr.
Entry find(const std::string &name);

int toml_config(const uint8_t *data, size_t size);     // TOML + engine and plugin schemas
int deepspeed_json(const uint8_t *data, size_t size);  // DeepSpeed JSON -> config
int safetensors(const uint8_t *data, size_t size);     // safetensors reader
int ckpt_manifest(const uint8_t *data, size_t size);   // checkpoint manifest.json
// check_manifest alone (past the checksum): coverage, layout and ranges.
int ckpt_coverage(const uint8_t *data, size_t size);
int idx(const uint8_t *data, size_t size);          // IDX (MNIST) files, plain or gzip
int token_shard(const uint8_t *data, size_t size);  // token shards
// encoder.json and vocab.bpe: the input is encoder.json's text, a line
// "#----vocab.bpe----", then vocab.bpe's text.
int tokenizer(const uint8_t *data, size_t size);
int tokenizer_json(const uint8_t *data, size_t size);  // Hugging Face tokenizer.json

}  // namespace tessera::fuzz

// tessera data encode / decode: what a Hugging Face tokenizer.json makes of a
// text and back (tokenizer.encode / decode in Python), to check a dataset or
// a tokenizer against transformers.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "data/tokenizer_json.hpp"
#include "util/error.hpp"

namespace tessera::cli {

namespace {

const char *kEncodeUsage = R"(usage: tessera data encode --tokenizer DIR|tokenizer.json [options]

Reads text on stdin (all of it, bytes as they are: a trailing newline is part
of the text) and prints its token ids as a JSON array on one line, as
tokenizer.encode(text) does in Python: added and special tokens in the text
are recognised, and the post-processor's tokens (e.g. Llama 3's
<|begin_of_text|>) are added.

options:
  --tokenizer PATH          a Hugging Face tokenizer.json, or the directory
                            holding one (byte-level BPE: GPT-2, Llama 3, Qwen)
  --no-special-tokens       leave out the post-processor's tokens
                            (add_special_tokens=False)
  -h, --help                this help
)";

const char *kDecodeUsage = R"(usage: tessera data decode --tokenizer DIR|tokenizer.json [options]

Reads a JSON array of token ids on stdin and prints the text they stand for,
with no newline added, as tokenizer.decode(ids) does in Python (which shows
bytes that are not UTF-8 as U+FFFD; this prints the bytes).

options:
  --tokenizer PATH          a Hugging Face tokenizer.json, or its directory
  --skip-special-tokens     leave out added tokens marked special
  -h, --help                this help
)";

std::string read_stdin() {
  std::ios::sync_with_stdio(false);
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

data::TokenizerJson load_tokenizer(const Parsed &p, const std::string &command) {
  const std::string path = p.get("--tokenizer");
  if (path.empty())
    throw UsageError("tessera data " + command +
                     ": --tokenizer DIR|tokenizer.json is required (a Hugging Face tokenizer)");
  return data::TokenizerJson::load(path);
}

int encode_body(const Parsed &p) {
  if (!p.positional.empty())
    throw UsageError("tessera data encode: unexpected argument '" + p.positional[0] +
                     "' (the text comes on stdin)");
  data::TokenizerJson tok = load_tokenizer(p, "encode");
  const std::vector<uint32_t> ids = tok.encode(read_stdin(), !p.has("--no-special-tokens"));
  std::printf("%s\n", nlohmann::json(ids).dump().c_str());
  return 0;
}

int decode_body(const Parsed &p) {
  if (!p.positional.empty())
    throw UsageError("tessera data decode: unexpected argument '" + p.positional[0] +
                     "' (the ids come on stdin)");
  data::TokenizerJson tok = load_tokenizer(p, "decode");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_stdin());
  } catch (const nlohmann::json::exception &e) {
    throw Error(TSR_ERR_INVALID, std::string("stdin is not valid JSON: ") + e.what());
  }
  if (!j.is_array())
    throw Error(TSR_ERR_INVALID,
                "stdin must hold a JSON array of token ids, got " + std::string(j.type_name()));
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_unsigned() || j[i].get<uint64_t>() > UINT32_MAX)
      throw Error(TSR_ERR_INVALID, "stdin: element " + std::to_string(i) + " is " + j[i].dump() +
                                       ", expected a token id (an integer >= 0)");
    ids.push_back(j[i].get<uint32_t>());
  }
  const std::string text = tok.decode(ids, p.has("--skip-special-tokens"));
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

int cmd_data_encode(const Args &args) {
  return run_command("data encode", kEncodeUsage, encode_body, args,
                     {{"--tokenizer", true, false},
                      {"--no-special-tokens", false, false},
                      {"--help", false, false},
                      {"-h", false, false}});
}

int cmd_data_decode(const Args &args) {
  return run_command("data decode", kDecodeUsage, decode_body, args,
                     {{"--tokenizer", true, false},
                      {"--skip-special-tokens", false, false},
                      {"--help", false, false},
                      {"-h", false, false}});
}

}  // namespace tessera::cli

// Chat and instruction data (docs/data.md): the masked token-shard form
// (written by data/token_shard, read by the "tokens" dataset, whose masked
// targets are -100), the chat formats rendered against the strings their
// specifications give, the format recognised from a chat template, the
// loss mask of encoded examples, bad JSONL lines, and what `tessera data
// tokenize --format chat|prompt-completion` writes.
//
// That a target of -100 is left out of the loss and its gradients exactly
// as Hugging Face leaves it out is shown against transformers' float64
// values in test_llama.cpp (the golden batches have -100 targets); here the
// dataset must put -100 exactly where the mask says and nowhere else.
#include <tessera/dataset.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <vector>

#include "data/chat_format.hpp"
#include "data/sft_examples.hpp"
#include "data/token_shard.hpp"
#include "data/tokenizer_json.hpp"
#include "support/fixture.hpp"
#include "support/temp_dir.hpp"
#include "util/error.hpp"

namespace unit_test_sft_data {

namespace {

namespace fs = std::filesystem;
namespace sdk = tessera::sdk;
namespace data = tessera::data;
using tessera::test::Fixture;
using tessera::test::TempDir;

std::vector<unsigned char> read_bytes(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

int32_t header_int(const std::vector<unsigned char> &b, size_t i) {
  int32_t v;
  std::memcpy(&v, b.data() + 4 * i, 4);
  return v;
}

// The chat test tokenizer (tests/data/chat_tokenizer) copied into `dir`
// with a tokenizer_config.json holding `config` (none when empty).
fs::path chat_tokenizer_dir(const TempDir &dir, const std::string &config) {
  const fs::path out = dir.path() / "tok";
  fs::create_directories(out);
  fs::copy_file(tessera::test::data_path("chat_tokenizer/tokenizer.json"), out / "tokenizer.json");
  if (!config.empty()) std::ofstream(out / "tokenizer_config.json") << config;
  return out;
}

// Chat templates as the models ship them (the parts that identify them).
const char *kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
    "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
const char *kQwen25Template =
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] "
    "+ '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba "
    "Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- for message in messages "
    "%}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- "
    "endfor %}";
const char *kQwen3Template =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + content + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- "
    "'<|im_start|>assistant\\n' }}{%- endif %}";

std::string config_with_template(const std::string &tmpl, const std::string &extra = "") {
  std::string escaped;
  for (char c : tmpl) {
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += c;
  }
  return "{\"chat_template\": \"" + escaped + "\"" + extra + "}";
}

const std::vector<data::ChatMessage> kConversation = {{"system", "Be brief."},
                                                      {"user", "Hi"},
                                                      {"assistant", "Hello!"},
                                                      {"user", "Bye"},
                                                      {"assistant", "  See you.\n"}};

// The ids whose mask is 1, decoded.
std::string trained_text(const data::TokenizerJson &tok, const std::vector<uint32_t> &ids,
                         const std::vector<uint8_t> &mask) {
  std::vector<uint32_t> kept;
  for (size_t i = 0; i < ids.size(); ++i)
    if (mask.at(i)) kept.push_back(ids[i]);
  return tok.decode(kept);
}

struct Dataset {
  Dataset(Fixture &f, const std::string &toml) {
    vt = f.vtable<tsr_dataset_vtable>("dataset", "tokens");
    REQUIRE(vt != nullptr);
    status = vt->create(f.host.table(), f.config("dataset", "tokens", toml), "train", &self);
  }
  ~Dataset() {
    if (self) vt->destroy(self);
  }
  Dataset(const Dataset &) = delete;
  Dataset &operator=(const Dataset &) = delete;
  const tsr_dataset_vtable *vt = nullptr;
  void *self = nullptr;
  tsr_status status = TSR_OK;
};

// Reads windows 0..n-1 of T tokens: inputs and targets, row after row.
void read_windows(Dataset &d, int64_t n, int64_t T, std::vector<int32_t> &x,
                  std::vector<int32_t> &y) {
  x.assign(static_cast<size_t>(n * T), -99);
  y.assign(static_cast<size_t>(n * T), -99);
  int64_t shape[2] = {n, T};
  auto b = sdk::make<tsr_batch>();
  b.size = n;
  b.inputs = sdk::view(x.data(), DLDevice{kDLCPU, 0}, sdk::dtype_i32(), 2, shape);
  b.targets = sdk::view(y.data(), DLDevice{kDLCPU, 0}, sdk::dtype_i32(), 2, shape);
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n; ++i) idx.push_back(i);
  REQUIRE(d.vt->read(d.self, idx.data(), &b) == TSR_OK);
}

}  // namespace

TEST_CASE("masked token shards: the mask after the tokens, versions 1001 and 1007", "[sft]") {
  TempDir dir;
  for (int width : {2, 4}) {
    INFO("width " << width);
    data::ShardWriter w(dir.path(), "m" + std::to_string(width), width, 4, /*masked=*/true);
    w.add({10, 11, 12, 13, 14, 15}, {0, 0, 1, 1, 0, 1});
    w.finish();
    CHECK(w.trained_tokens() == 3);
    REQUIRE(w.files().size() == 2);
    const auto b = read_bytes(w.files()[0]);
    REQUIRE(b.size() == 1024 + 4 * static_cast<size_t>(width) + 4);
    CHECK(header_int(b, 0) == (width == 2 ? 20240520 : 20240801));
    CHECK(header_int(b, 1) == (width == 2 ? 1001 : 1007));
    CHECK(header_int(b, 2) == 4);
    const unsigned char *mask = b.data() + 1024 + 4 * width;
    CHECK(std::vector<unsigned char>(mask, mask + 4) == std::vector<unsigned char>{0, 0, 1, 1});
    const auto tail = read_bytes(w.files()[1]);
    REQUIRE(tail.size() == 1024 + 2 * static_cast<size_t>(width) + 2);
    CHECK(tail[1024 + 2 * width] == 0);
    CHECK(tail[1024 + 2 * width + 1] == 1);
  }
  data::ShardWriter bad(dir.path(), "bad", 2, 4, true);
  CHECK_THROWS_AS(bad.add({1, 2}, {1}), tessera::Error);
}

TEST_CASE("tokens gives -100 targets where a masked shard's mask is 0", "[sft]") {
  TempDir dir;
  // 9 tokens, T = 4: windows [0, 5) and [4, 9). Mask by hand.
  const std::vector<uint32_t> tokens = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  const std::vector<uint8_t> mask = {1, 0, 1, 1, 0, 0, 1, 0, 1};
  data::ShardWriter w(dir.path(), "d_train", 2, 100, true);
  w.add(tokens, mask);
  w.finish();
  Fixture f;
  Dataset d(f, "files = '" + dir.file("d_train_*.bin") + "'\ncontext = 4\nvocab = 20");
  INFO(f.host.last_error());
  REQUIRE(d.status == TSR_OK);
  std::vector<int32_t> x, y;
  read_windows(d, 2, 4, x, y);
  CHECK(x == std::vector<int32_t>{5, 6, 7, 8, 9, 10, 11, 12});
  // Target j of window k is token 4k + j + 1, kept where its mask is 1.
  CHECK(y == std::vector<int32_t>{-100, 7, 8, -100, -100, 11, -100, 13});

  // A masked shard cut short of its mask is refused naming the file.
  const fs::path cut = dir.path() / "cut_train_000000.bin";
  fs::copy_file(w.files()[0], cut);
  fs::resize_file(cut, fs::file_size(cut) - 1);
  Dataset d2(f, "files = '" + cut.string() + "'\ncontext = 4");
  CHECK(d2.status != TSR_OK);
  CHECK_THAT(f.host.last_error(), Catch::Contains(cut.string()) && Catch::Contains("truncated") &&
                                      Catch::Contains("loss mask"));
}

TEST_CASE("chat formats render as the models' chat templates do", "[sft]") {
  const data::ChatFormat llama3{data::ChatStyle::llama3, ""};
  CHECK(data::spans_text(data::render_chat(llama3, kConversation)) ==
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nSee you.<|eot_id|>");
  const data::ChatFormat chatml{data::ChatStyle::chatml, ""};
  CHECK(data::spans_text(data::render_chat(chatml, kConversation)) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n  See you.\n<|im_end|>\n");
  // Qwen2.5's template adds its system message to a conversation without one.
  const auto qwen25 = data::chat_format_of_template(kQwen25Template);
  REQUIRE(qwen25);
  CHECK(data::spans_text(data::render_chat(*qwen25, {{"user", "Hi"}, {"assistant", "Yo"}})) ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>"
        "\n");
  CHECK(data::spans_text(
            data::render_chat(*qwen25, {{"system", "S"}, {"user", "Hi"}, {"assistant", "Yo"}})) ==
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        "Yo<|im_end|>\n");
}

TEST_CASE("the chat format is recognised from the template", "[sft]") {
  const auto l = data::chat_format_of_template(kLlama3Template);
  REQUIRE(l);
  CHECK(l->style == data::ChatStyle::llama3);
  const auto q3 = data::chat_format_of_template(kQwen3Template);
  REQUIRE(q3);
  CHECK(q3->style == data::ChatStyle::chatml);
  CHECK(q3->default_system.empty());
  CHECK_FALSE(
      data::chat_format_of_template("{{ bos_token }}{% for m in messages %}[INST] "
                                    "{{ m['content'] }} [/INST]{% endfor %}"));
  CHECK_FALSE(data::chat_format_of_template(""));
  CHECK(data::chat_style_named("chatml") == data::ChatStyle::chatml);
  CHECK_FALSE(data::chat_style_named("mistral"));
}

TEST_CASE("encoded chats: the ids of the rendered text, assistant turns trained", "[sft]") {
  auto tok = data::TokenizerJson::load(tessera::test::data_path("chat_tokenizer"));
  for (auto style : {data::ChatStyle::llama3, data::ChatStyle::chatml}) {
    INFO(data::chat_style_name(style));
    const auto spans = data::render_chat({style, ""}, kConversation);
    std::vector<uint32_t> ids;
    std::vector<uint8_t> mask;
    data::encode_spans(tok, spans, ids, mask);
    // As the tokenizer encodes the whole rendered text (what
    // apply_chat_template(tokenize=True) gives).
    CHECK(ids == tok.encode(data::spans_text(spans), false));
    REQUIRE(mask.size() == ids.size());
    // Trained: each answer and its end-of-turn token, nothing else.
    CHECK(trained_text(tok, ids, mask) == (style == data::ChatStyle::llama3
                                               ? "Hello!<|eot_id|>See you.<|eot_id|>"
                                               : "Hello!<|im_end|>  See you.\n<|im_end|>"));
  }
}

TEST_CASE("SFT encoder: format from tokenizer_config.json, bad lines named", "[sft]") {
  TempDir dir;
  auto tok = data::TokenizerJson::load(tessera::test::data_path("chat_tokenizer"));
  const fs::path llama_dir = chat_tokenizer_dir(dir, config_with_template(kLlama3Template));
  const auto enc = data::sft_encoder(data::SftKind::chat, tok, llama_dir, "");
  CHECK(enc.format.style == data::ChatStyle::llama3);
  CHECK_THAT(enc.format_source, Catch::Contains("tokenizer_config.json"));
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  CHECK(enc.encode_line(R"({"messages": [{"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": "Hello!"}]})",
                        ids, mask) == "");
  CHECK(trained_text(tok, ids, mask) == "Hello!<|eot_id|>");
  CHECK(enc.encode_line("{\"messages\": [", ids, mask) == "not valid JSON");
  CHECK(enc.encode_line("[1, 2]", ids, mask) == "not a JSON object");
  CHECK_THAT(enc.encode_line(R"({"conversation": []})", ids, mask),
             Catch::Contains("expected {\"messages\""));
  CHECK_THAT(enc.encode_line(R"({"messages": [{"role": "bot", "content": "x"}]})", ids, mask),
             Catch::Contains("messages[0] has role 'bot'"));
  CHECK_THAT(enc.encode_line(R"({"messages": [{"role": "user", "content": 3}]})", ids, mask),
             Catch::Contains("messages[0] has no string 'content'"));
  CHECK_THAT(enc.encode_line(R"({"messages": [{"role": "user", "content": "x"}]})", ids, mask),
             Catch::Contains("no assistant message"));

  // --chat-format wins over the template; without either, the error says
  // what to pass.
  CHECK(data::sft_encoder(data::SftKind::chat, tok, llama_dir, "chatml").format.style ==
        data::ChatStyle::chatml);
  TempDir bare;
  const fs::path no_config = chat_tokenizer_dir(bare, "");
  CHECK_THROWS_WITH(data::sft_encoder(data::SftKind::chat, tok, no_config, ""),
                    Catch::Contains("--chat-format llama3 or chatml") &&
                        Catch::Contains("tokenizer_config.json"));
  CHECK_THROWS_WITH(data::sft_encoder(data::SftKind::chat, tok, no_config, "zephyr"),
                    Catch::Contains("'zephyr'"));
  // A tokenizer without the format's tokens is refused naming the token.
  auto plain = data::TokenizerJson::load(tessera::test::data_path("bpe_tokenizer"));
  CHECK_THROWS_WITH(data::sft_encoder(data::SftKind::chat, plain, llama_dir, ""),
                    Catch::Contains("<|start_header_id|>"));
}

TEST_CASE("SFT encoder: prompt-completion trains the completion and the end token", "[sft]") {
  TempDir dir;
  auto tok = data::TokenizerJson::load(tessera::test::data_path("chat_tokenizer"));
  const fs::path d = chat_tokenizer_dir(dir, R"({"eos_token": {"content": "<|end_of_text|>"}})");
  const auto enc = data::sft_encoder(data::SftKind::prompt_completion, tok, d, "");
  CHECK(enc.eos == "<|end_of_text|>");
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  REQUIRE(enc.encode_line(R"({"prompt": "2 + 2 =", "completion": " 4"})", ids, mask) == "");
  CHECK(ids == tok.encode("2 + 2 = 4<|end_of_text|>", false));
  CHECK(trained_text(tok, ids, mask) == " 4<|end_of_text|>");
  CHECK_THAT(enc.encode_line(R"({"prompt": "x"})", ids, mask), Catch::Contains("\"completion\""));
  CHECK_THAT(enc.encode_line(R"({"prompt": "x", "completion": ""})", ids, mask),
             Catch::Contains("empty completion"));
}

TEST_CASE("tessera data tokenize --format chat writes masked shards, bad lines by FILE:LINE",
          "[sft]") {
  TempDir dir;
  const fs::path tok = chat_tokenizer_dir(dir, config_with_template(kLlama3Template));
  const std::string good =
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]})";
  {
    std::ofstream in(dir.file("chats.jsonl"));
    in << good << "\n"
       << R"({"messages": [{"role": "robot", "content": "?"}]})"
       << "\n\n"
       << good << "\n";
  }
  const std::string base = std::string("'") + TESSERA_BINARY + "' data tokenize '" +
                           dir.file("chats.jsonl") + "' -o '" + dir.file("out") +
                           "' --format chat --tokenizer '" + tok.string() +
                           "' --eval-fraction 0 > '" + dir.file("log") + "' 2>&1";
  // The bad line stops the run by default, named with its file and line.
  CHECK(std::system(base.c_str()) != 0);
  std::ifstream log1(dir.file("log"));
  const std::string said1((std::istreambuf_iterator<char>(log1)), {});
  CHECK_THAT(said1, Catch::Contains("chats.jsonl:2: messages[0] has role 'robot'") &&
                        Catch::Contains("--max-bad"));
  // With --max-bad 1 it is reported, skipped and counted.
  const std::string cmd = std::string("'") + TESSERA_BINARY + "' data tokenize '" +
                          dir.file("chats.jsonl") + "' -o '" + dir.file("out") +
                          "' --format chat --tokenizer '" + tok.string() +
                          "' --eval-fraction 0 --max-bad 1 > '" + dir.file("log") + "' 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream log2(dir.file("log"));
  const std::string said2((std::istreambuf_iterator<char>(log2)), {});
  CHECK_THAT(said2, Catch::Contains("chats.jsonl:2:") && Catch::Contains("skipped") &&
                        Catch::Contains("chat format llama3"));
  const auto b = read_bytes(dir.path() / "out" / "out_train_000000.bin");
  REQUIRE(b.size() > 1024);
  // Version 2001: the mask, then where each example starts (for packing).
  CHECK(header_int(b, 1) == 2001);
  CHECK(header_int(b, 3) == 2);
  // Two examples, each as the tokenizer encodes its rendering, back to back.
  auto t = data::TokenizerJson::load(tok);
  std::vector<uint32_t> one;
  std::vector<uint8_t> one_mask;
  data::encode_spans(
      t,
      data::render_chat({data::ChatStyle::llama3, ""}, {{"user", "Hi"}, {"assistant", "Hello!"}}),
      one, one_mask);
  const int32_t count = header_int(b, 2);
  REQUIRE(count == static_cast<int32_t>(2 * one.size()));
  REQUIRE(b.size() == 1024 + 3 * static_cast<size_t>(count) + 2 * 4);
  int32_t starts[2];
  std::memcpy(starts, b.data() + 1024 + 3 * static_cast<size_t>(count), sizeof starts);
  CHECK(starts[0] == 0);
  CHECK(starts[1] == static_cast<int32_t>(one.size()));
  for (int32_t i = 0; i < count; ++i) {
    uint16_t v;
    std::memcpy(&v, b.data() + 1024 + 2 * i, 2);
    CHECK(v == one[static_cast<size_t>(i) % one.size()]);
    CHECK(b[1024 + 2 * static_cast<size_t>(count) + static_cast<size_t>(i)] ==
          one_mask[static_cast<size_t>(i) % one.size()]);
  }
}

}  // namespace unit_test_sft_data

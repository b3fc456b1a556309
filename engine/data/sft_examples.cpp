#include "data/sft_examples.hpp"

#include <nlohmann/json.hpp>
#include <optional>

#include "data/tokenizer_json.hpp"
#include "util/error.hpp"
#include "util/regular_file.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace tessera::data {

namespace {

// tokenizer_config.json's token fields are a string or {"content": ...}.
std::string token_text(const json &v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

// tokenizer_config.json beside the tokenizer, or null when there is none.
json tokenizer_config(const fs::path &tokenizer_path, std::string &where) {
  std::error_code ec;
  const fs::path dir =
      fs::is_directory(tokenizer_path, ec) ? tokenizer_path : tokenizer_path.parent_path();
  const fs::path file = (dir.empty() ? fs::path(".") : dir) / "tokenizer_config.json";
  where = file.string();
  if (!fs::exists(file, ec)) return json();
  try {
    return json::parse(read_regular(file.string(), "tokenizer config"));
  } catch (const json::exception &e) {
    throw Error(TSR_ERR_INVALID, "tokenizer config '" + where + "' is not valid JSON: " + e.what());
  }
}

// The template text: a string, or a list of {"name", "template"} (the one
// named "default", else the first).
std::string chat_template(const json &config) {
  if (!config.is_object() || !config.contains("chat_template")) return "";
  const json &t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (!t.is_array()) return "";
  for (const auto &e : t)
    if (e.is_object() && e.value("name", "") == "default") return e.value("template", "");
  return !t.empty() && t[0].is_object() ? t[0].value("template", "") : "";
}

void require_tokens(const TokenizerJson &tok, const std::vector<std::string> &tokens,
                    const std::string &what) {
  for (const auto &t : tokens)
    if (!tok.token_id(t))
      throw Error(TSR_ERR_INVALID, "tokenizer '" + tok.name() + "' has no token " + t + ", which " +
                                       what +
                                       " needs: pick the format the model was trained "
                                       "with (--chat-format llama3 or chatml)");
}

void set_chat_format(SftEncoder &e, const json &config, const std::string &config_where,
                     const std::string &chat_format) {
  if (!chat_format.empty()) {
    const auto style = chat_style_named(chat_format);
    if (!style)
      throw Error(TSR_ERR_INVALID, "--chat-format '" + chat_format +
                                       "' is not a chat format tessera renders (llama3, chatml)");
    e.format.style = *style;
    if (const auto from = chat_format_of_template(chat_template(config));
        from && from->style == *style)
      e.format.default_system = from->default_system;
    e.format_source = "--chat-format";
  } else {
    const std::string t = chat_template(config);
    const auto from = chat_format_of_template(t);
    if (!from)
      throw Error(
          TSR_ERR_INVALID,
          std::string("--format chat: ") +
              (config.is_null() ? "no tokenizer_config.json at '" + config_where + "'"
               : t.empty()      ? "'" + config_where + "' has no chat_template"
                                : "the chat_template in '" + config_where +
                                 "' is neither Llama 3's nor ChatML (Qwen)") +
              "; name the format the model was trained with: --chat-format llama3 or chatml");
    e.format = *from;
    e.format_source = config_where + "'s chat_template";
  }
  if (e.format.style == ChatStyle::llama3)
    require_tokens(*e.tokenizer,
                   {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
                   "the llama3 chat format");
  else
    require_tokens(*e.tokenizer, {"<|im_start|>", "<|im_end|>"}, "the chatml chat format");
}

void set_prompt_completion_tokens(SftEncoder &e, const json &config,
                                  const std::string &config_where) {
  // The begin token: what the post-processor puts before a sequence.
  const std::vector<uint32_t> bos_ids = e.tokenizer->encode("", true);
  e.bos = e.tokenizer->decode(bos_ids);
  e.eos = config.is_object() ? token_text(config.value("eos_token", json())) : "";
  if (e.eos.empty())
    for (const char *t : {"<|end_of_text|>", "<|endoftext|>"})
      if (e.tokenizer->token_id(t)) {
        e.eos = t;
        break;
      }
  if (e.eos.empty() || !e.tokenizer->token_id(e.eos))
    throw Error(TSR_ERR_INVALID,
                "tokenizer '" + e.tokenizer->name() +
                    "': no end-of-text token to close each "
                    "completion (no eos_token in '" +
                    config_where +
                    "', and neither <|end_of_text|> nor <|endoftext|> in the vocabulary)");
}

std::optional<std::string> string_field(const json &o, const char *key) {
  const auto it = o.find(key);
  if (it == o.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

// The messages of a chat line, or why it is refused.
std::string parse_messages(const json &j, std::vector<ChatMessage> &out) {
  const auto it = j.find("messages");
  if (it == j.end() || !it->is_array())
    return "expected {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}";
  bool answer = false;
  for (size_t i = 0; i < it->size(); ++i) {
    const json &m = (*it)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return at + " is not an object";
    const auto role = string_field(m, "role");
    const auto content = string_field(m, "content");
    if (!role) return at + " has no string 'role'";
    if (*role != "system" && *role != "user" && *role != "assistant")
      return at + " has role '" + *role + "' (expected system, user or assistant)";
    if (!content) return at + " has no string 'content'";
    answer |= *role == "assistant";
    out.push_back({*role, *content});
  }
  if (!answer) return "has no assistant message: nothing to train on";
  return "";
}

}  // namespace

SftEncoder sft_encoder(SftKind kind, TokenizerJson &tokenizer, const fs::path &tokenizer_path,
                       const std::string &chat_format) {
  SftEncoder e;
  e.kind = kind;
  e.tokenizer = &tokenizer;
  std::string where;
  const json config = tokenizer_config(tokenizer_path, where);
  if (kind == SftKind::chat)
    set_chat_format(e, config, where, chat_format);
  else
    set_prompt_completion_tokens(e, config, where);
  return e;
}

std::string SftEncoder::encode_line(std::string_view line, std::vector<uint32_t> &ids,
                                    std::vector<uint8_t> &mask) const {
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception &) {
    return "not valid JSON";
  }
  if (!j.is_object()) return "not a JSON object";
  std::vector<TextSpan> spans;
  if (kind == SftKind::chat) {
    std::vector<ChatMessage> messages;
    if (std::string why = parse_messages(j, messages); !why.empty()) return why;
    spans = render_chat(format, messages);
  } else {
    const auto prompt = string_field(j, "prompt");
    const auto completion = string_field(j, "completion");
    if (!prompt || !completion) return "expected {\"prompt\": \"...\", \"completion\": \"...\"}";
    if (completion->empty()) return "has an empty completion: nothing to train on";
    spans = render_prompt_completion(bos, *prompt, *completion, eos);
  }
  try {
    encode_spans(*tokenizer, spans, ids, mask);
  } catch (const Error &err) {
    return err.what();
  }
  return "";
}

}  // namespace tessera::data

#include "data/chat_format.hpp"

#include <algorithm>

#include "data/tokenizer_json.hpp"

namespace tessera::data {

namespace {

// Qwen2.5's templates add this system message to a conversation without one.
constexpr std::string_view kQwenDefaultSystem =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

std::string trimmed(std::string_view s) {
  // Jinja's trim: Python's str.strip(), whitespace at both ends.
  const auto space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return std::string(s);
}

void render_llama3(const std::vector<ChatMessage> &messages, std::vector<TextSpan> &out) {
  out.push_back({"<|begin_of_text|>"});
  for (const auto &m : messages) {
    const bool trained = m.role == "assistant";
    out.push_back({"<|start_header_id|>" + m.role + "<|end_header_id|>"});
    out.push_back({"\n\n" + trimmed(m.content), trained ? size_t{2} : std::string::npos});
    out.push_back({"<|eot_id|>", trained ? size_t{0} : std::string::npos});
  }
}

void render_chatml(const ChatFormat &f, const std::vector<ChatMessage> &messages,
                   std::vector<TextSpan> &out) {
  const auto message = [&](const std::string &role, const std::string &content) {
    const bool trained = role == "assistant";
    const std::string head = "<|im_start|>" + role + "\n";
    out.push_back({head + content, trained ? head.size() : std::string::npos});
    out.push_back({"<|im_end|>", trained ? size_t{0} : std::string::npos});
    out.push_back({"\n"});
  };
  if (!f.default_system.empty() && (messages.empty() || messages.front().role != "system"))
    message("system", f.default_system);
  for (const auto &m : messages) message(m.role, m.content);
}

}  // namespace

std::optional<ChatStyle> chat_style_named(std::string_view name) {
  if (name == "llama3") return ChatStyle::llama3;
  if (name == "chatml") return ChatStyle::chatml;
  return std::nullopt;
}

const char *chat_style_name(ChatStyle style) {
  return style == ChatStyle::llama3 ? "llama3" : "chatml";
}

std::optional<ChatFormat> chat_format_of_template(std::string_view t) {
  const auto has = [&](std::string_view marker) { return t.find(marker) != std::string::npos; };
  if (has("<|start_header_id|>") && has("<|end_header_id|>") && has("<|eot_id|>"))
    return ChatFormat{ChatStyle::llama3, ""};
  if (has("<|im_start|>") && has("<|im_end|>"))
    return ChatFormat{ChatStyle::chatml,
                      has(kQwenDefaultSystem) ? std::string(kQwenDefaultSystem) : ""};
  return std::nullopt;
}

std::vector<TextSpan> render_chat(const ChatFormat &format,
                                  const std::vector<ChatMessage> &messages) {
  std::vector<TextSpan> out;
  if (format.style == ChatStyle::llama3)
    render_llama3(messages, out);
  else
    render_chatml(format, messages, out);
  return out;
}

std::vector<TextSpan> render_prompt_completion(const std::string &bos, const std::string &prompt,
                                               const std::string &completion,
                                               const std::string &eos) {
  std::vector<TextSpan> out;
  if (!bos.empty()) out.push_back({bos});
  out.push_back({prompt + completion, prompt.size()});
  out.push_back({eos, 0});
  return out;
}

std::string spans_text(const std::vector<TextSpan> &spans) {
  std::string s;
  for (const auto &span : spans) s += span.text;
  return s;
}

void encode_spans(TokenizerJson &tokenizer, const std::vector<TextSpan> &spans,
                  std::vector<uint32_t> &ids, std::vector<uint8_t> &mask) {
  ids.clear();
  mask.clear();
  std::vector<uint32_t> span_ids, head_ids;
  for (const auto &span : spans) {
    span_ids.clear();
    tokenizer.encode(span.text, span_ids, /*add_special_tokens=*/false);
    size_t first_trained = span_ids.size();
    if (span.train_from == 0) {
      first_trained = 0;
    } else if (span.train_from < span.text.size()) {
      head_ids.clear();
      tokenizer.encode(std::string_view(span.text).substr(0, span.train_from), head_ids, false);
      const auto diverge =
          std::mismatch(head_ids.begin(), head_ids.end(), span_ids.begin(), span_ids.end());
      first_trained = static_cast<size_t>(diverge.second - span_ids.begin());
    }
    ids.insert(ids.end(), span_ids.begin(), span_ids.end());
    for (size_t i = 0; i < span_ids.size(); ++i) mask.push_back(i >= first_trained ? 1 : 0);
  }
}

}  // namespace tessera::data

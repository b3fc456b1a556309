// Supervised fine-tuning examples as text with a loss mask (docs/data.md,
// "Chat and instruction data"): a conversation rendered in a model's chat
// format, or a prompt and its completion, as spans of text each knowing
// which of its characters are trained targets.
//
// Formats, as the models' Hugging Face chat templates render a conversation
// (no generation prompt):
//   llama3  <|begin_of_text|> then per message
//           <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
//           (CONTENT trimmed of surrounding whitespace, as Llama 3's template
//           does; Llama 3.1+'s extra system preamble with knowledge dates is
//           a prompt convention, not added here)
//   chatml  per message <|im_start|>ROLE\nCONTENT<|im_end|>\n (Qwen2/2.5/3);
//           Qwen2.5's template adds a default system message when there is
//           none, and so do we when the template has one
// Trained: each assistant message's CONTENT and its end-of-turn token, the
// tokens the model must learn to produce; everything else is context.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

class TokenizerJson;

enum class ChatStyle { llama3, chatml };

struct ChatFormat {
  ChatStyle style = ChatStyle::llama3;
  std::string default_system;  // chatml: a system message to add when none is given
};

// "llama3" or "chatml"; nullopt for any other name.
std::optional<ChatStyle> chat_style_named(std::string_view name);
const char *chat_style_name(ChatStyle style);

// The format a Hugging Face chat template (tokenizer_config.json's
// "chat_template") renders, recognised by its markers; nullopt when it is
// neither.
std::optional<ChatFormat> chat_format_of_template(std::string_view chat_template);

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

// A piece of rendered text; characters [train_from, text.size()) are
// trained (train_from == npos: none). Every span boundary falls where the
// tokenizer splits anyway (at a special token), except inside a span, which
// is why a span carries its own boundary.
struct TextSpan {
  std::string text;
  size_t train_from = std::string::npos;
};

std::vector<TextSpan> render_chat(const ChatFormat &format,
                                  const std::vector<ChatMessage> &messages);
// `bos`/`eos`: the tokenizer's begin (may be empty: none) and end tokens.
std::vector<TextSpan> render_prompt_completion(const std::string &bos, const std::string &prompt,
                                               const std::string &completion,
                                               const std::string &eos);
// The spans' text joined: what the chat template renders.
std::string spans_text(const std::vector<TextSpan> &spans);

// Token ids of the spans and one mask byte per id (1: trained). Each span
// is encoded whole, as the tokenizer encodes the rendered text; a trained
// tail starts at the first id where the span's ids leave the ids of its
// untrained head alone (a token spanning the boundary is trained).
void encode_spans(TokenizerJson &tokenizer, const std::vector<TextSpan> &spans,
                  std::vector<uint32_t> &ids, std::vector<uint8_t> &mask);

}  // namespace tessera::data

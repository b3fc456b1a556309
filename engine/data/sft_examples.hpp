// Supervised fine-tuning data (docs/data.md, "Chat and instruction data"):
// JSONL lines of conversations ({"messages": [{"role", "content"}, ...]}) or
// prompt/completion pairs ({"prompt", "completion"}), read one line at a
// time into token ids with a loss mask, in the chat format of the model's
// tokenizer (chat_format.hpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/chat_format.hpp"

namespace tessera::data {

enum class SftKind { chat, prompt_completion };

// How examples become tokens: the tokenizer, the chat format (chat) or the
// begin/end tokens (prompt-completion).
struct SftEncoder {
  SftKind kind = SftKind::chat;
  TokenizerJson *tokenizer = nullptr;  // not owned
  ChatFormat format;
  std::string format_source;  // "tokenizer_config.json's chat_template" or "--chat-format"
  std::string bos, eos;       // prompt-completion: the text of the begin (may be "") and end tokens

  // One JSONL line (without its newline) into ids and mask. Returns "" on
  // success, else why the line is refused (to follow "FILE:LINE: ").
  std::string encode_line(std::string_view line, std::vector<uint32_t> &ids,
                          std::vector<uint8_t> &mask) const;
};

// The encoder for `kind` with `tokenizer` loaded from `tokenizer_path` (a
// tokenizer.json or its directory): the chat format from
// tokenizer_config.json beside it, unless `chat_format` ("llama3",
// "chatml") names one; for prompt-completion, the begin token from the
// tokenizer's post-processor and the end token from tokenizer_config.json's
// eos_token. Throws a tessera::Error saying what to pass when neither
// works, or when the tokenizer lacks the format's special tokens.
SftEncoder sft_encoder(SftKind kind, TokenizerJson &tokenizer,
                       const std::filesystem::path &tokenizer_path, const std::string &chat_format);

}  // namespace tessera::data

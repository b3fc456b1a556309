// tessera data tokenize: text files to token shards (docs/data.md), byte-level,
// with GPT-2's BPE files or a Hugging Face tokenizer.json, split into train
// and eval by document.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cli/args.hpp"
#include "data/sft_examples.hpp"
#include "data/token_shard.hpp"
#include "data/tokenizer_bpe.hpp"
#include "data/tokenizer_json.hpp"
#include "util/error.hpp"
#include "util/regular_file.hpp"
#include "util/text.hpp"

namespace fs = std::filesystem;

namespace tessera::cli {

namespace {

const char *kDataUsage = R"(usage: tessera data <command> [options]

commands:
  tokenize INPUT... -o OUTDIR   text files to token shards for the tokens dataset
  encode --tokenizer F          text on stdin to token ids (JSON) on stdout
  decode --tokenizer F          token ids (JSON) on stdin to text on stdout

Run 'tessera data <command> --help' for its options.
)";

const char *kTokenizeUsage = R"(usage: tessera data tokenize INPUT... -o OUTDIR [options]

Tokenizes text files into token shards in llm.c's format (docs/data.md),
OUTDIR/NAME_train_000000.bin, ... and OUTDIR/NAME_eval_000000.bin, ..., for
the 'tokens' dataset plugin. Earlier shards NAME_train_*.bin and
NAME_eval_*.bin in OUTDIR are replaced.

tokenizer:
  (default)                 byte-level: vocabulary 256, each byte is a token
  --encoder FILE            GPT-2 BPE: GPT-2's encoder.json (token -> id) ...
  --bpe FILE                ... and vocab.bpe (the merges); both or neither.
                            Every document starts with <|endoftext|> (50256)
                            when the encoder has it
  --tokenizer PATH          a Hugging Face tokenizer.json, or the directory
                            holding one (byte-level BPE: GPT-2, Llama 3,
                            Qwen2/3). Each document is encoded as
                            tokenizer.encode(doc) does (Llama 3: with
                            <|begin_of_text|> first); when that adds no
                            token, <|endoftext|> goes first if the tokenizer
                            has it
  Vocabularies over 65536 ids are written as uint32 shards.

chat and instruction data (supervised fine-tuning; needs --tokenizer):
  --format F                text (default): plain text, every token trained;
                            chat: JSONL, one {"messages": [{"role",
                            "content"}, ...]} per line (roles system, user,
                            assistant), rendered in the model's chat format;
                            prompt-completion: JSONL, one {"prompt",
                            "completion"} per line. Shards then carry a loss
                            mask: only assistant messages (with their
                            end-of-turn token) or completions (with the end
                            token) are trained
  --chat-format NAME        llama3 or chatml (Qwen); default: recognised from
                            the chat_template in tokenizer_config.json beside
                            the tokenizer
  --max-bad N               skip up to N lines that are not valid examples,
                            each reported with FILE:LINE (default 0: the
                            first one stops the run)

documents and splits:
  --doc-separator LINE      a line equal to LINE ends a document (fortune
                            files: '%'); default: each INPUT is one document.
                            Byte-level shards keep the separator line after
                            each document as its delimiter; BPE drops it.
                            JSONL formats: each line is one document
  --eval-fraction F         share of documents for the eval split, spread
                            evenly: document d (counting from 0 across all
                            inputs) is eval when round((d+1)F) > round(dF)
                            (default 0.05; 0: no eval split)

output:
  -o, --output OUTDIR       where the shards go (created if missing)
  --name NAME               shard name prefix (default: OUTDIR's own name)
  --shard-tokens N          tokens per shard at most (default 100000000)
  -h, --help                this help
)";

int64_t positive_option(const Parsed &p, const std::string &name, int64_t fallback) {
  const std::string v = p.get(name);
  if (v.empty()) return fallback;
  char *end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (*end != '\0' || errno != 0 || x < 1)
    throw UsageError("tessera data tokenize: " + name + " '" + v + "' is not a positive integer");
  return x;
}

double fraction_option(const Parsed &p) {
  const std::string v = p.get("--eval-fraction", "0.05");
  char *end = nullptr;
  const double f = std::strtod(v.c_str(), &end);
  if (*end != '\0' || v.empty() || !(f >= 0.0 && f < 1.0))
    throw UsageError("tessera data tokenize: --eval-fraction '" + v +
                     "' is not a number in [0, 1)");
  return f;
}

std::string read_input(const fs::path &path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw Error(TSR_ERR_IO, "input '" + path.string() + "' is a directory, not a text file");
  // Any size: a corpus may be gigabytes.
  return read_regular(path.string(), "input", std::numeric_limits<uint64_t>::max());
}

// The documents of one file: the whole file, or the pieces between lines
// equal to `separator` (a trailing '\r' ignored). Empty documents are dropped.
std::vector<std::string_view> split_documents(std::string_view text,
                                              const std::optional<std::string> &separator) {
  std::vector<std::string_view> docs;
  if (!separator) {
    if (!text.empty()) docs.push_back(text);
    return docs;
  }
  size_t doc_start = 0, pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    const size_t next = eol == std::string_view::npos ? text.size() : eol + 1;
    std::string_view line =
        text.substr(pos, (eol == std::string_view::npos ? text.size() : eol) - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line == *separator) {
      if (pos > doc_start) docs.push_back(text.substr(doc_start, pos - doc_start));
      doc_start = next;
    }
    pos = next;
  }
  if (doc_start < text.size()) docs.push_back(text.substr(doc_start));
  return docs;
}

struct Progress {
  using Clock = std::chrono::steady_clock;
  Clock::time_point start = Clock::now(), last = start;
  uint64_t total_bytes = 0;
  bool enabled = false, tty = false;
  bool printed = false;

  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start).count(); }

  void update(uint64_t done_bytes, int64_t tokens, bool force = false) {
    if (!enabled) return;
    const auto now = Clock::now();
    const double since = std::chrono::duration<double>(now - last).count();
    if (!force && since < (tty ? 0.5 : 5.0)) return;
    last = now;
    const double t = elapsed();
    const double rate = t > 0 ? static_cast<double>(done_bytes) / t : 0;
    std::fprintf(stderr, "%stokenize: %s of %s (%.1f%%), %lld tokens, %s/s%s", tty ? "\r" : "",
                 format_bytes(static_cast<double>(done_bytes)).c_str(),
                 format_bytes(static_cast<double>(total_bytes)).c_str(),
                 total_bytes
                     ? 100.0 * static_cast<double>(done_bytes) / static_cast<double>(total_bytes)
                     : 100.0,
                 static_cast<long long>(tokens), format_bytes(rate).c_str(), tty ? "   " : "\n");
    std::fflush(stderr);
    printed = true;
  }
  void done() {
    if (printed && tty) std::fputc('\n', stderr);
  }
};

struct SplitStats {
  int64_t documents = 0;
};

// What `tessera data tokenize` was asked to do, checked before anything
// is read or written.
struct TokenizeOptions {
  std::vector<std::string> inputs;
  fs::path out_dir;
  std::string name;  // the shards' prefix: NAME_train_*, NAME_eval_*
  std::string encoder_path, bpe_path, tokenizer_path;
  double fraction = 0;
  int64_t shard_tokens = 0;
  std::optional<std::string> separator;
  std::optional<data::SftKind> sft;  // --format chat or prompt-completion
  std::string chat_format;
  int64_t max_bad = 0;
};

// --format, --chat-format and --max-bad.
void sft_options(const Parsed &p, TokenizeOptions &o) {
  const std::string format = p.get("--format", "text");
  if (format == "chat")
    o.sft = data::SftKind::chat;
  else if (format == "prompt-completion")
    o.sft = data::SftKind::prompt_completion;
  else if (format != "text")
    throw UsageError("tessera data tokenize: --format '" + format +
                     "' is not one of text, chat, prompt-completion");
  o.chat_format = p.get("--chat-format");
  if (!o.chat_format.empty() && o.sft != data::SftKind::chat)
    throw UsageError("tessera data tokenize: --chat-format goes with --format chat");
  if (o.sft && o.tokenizer_path.empty())
    throw UsageError("tessera data tokenize: --format " + format +
                     " needs --tokenizer DIR (the model's tokenizer.json and "
                     "tokenizer_config.json)");
  if (o.sft && o.separator)
    throw UsageError("tessera data tokenize: --doc-separator is for text; in --format " + format +
                     " each JSONL line is one example");
  if (p.has("--max-bad")) {
    const std::string v = p.get("--max-bad");
    char *end = nullptr;
    errno = 0;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0 || n < 0)
      throw UsageError("tessera data tokenize: --max-bad '" + v + "' is not a count >= 0");
    if (!o.sft)
      throw UsageError(
          "tessera data tokenize: --max-bad goes with --format chat or "
          "prompt-completion");
    o.max_bad = n;
  }
}

TokenizeOptions tokenize_options(const Parsed &p) {
  TokenizeOptions o;
  o.inputs = p.positional;
  if (o.inputs.empty())
    throw UsageError("tessera data tokenize: expected at least one INPUT text file");
  const std::string out_arg = p.get("-o", p.get("--output"));
  if (out_arg.empty()) throw UsageError("tessera data tokenize: -o OUTDIR is required");
  o.encoder_path = p.get("--encoder");
  o.bpe_path = p.get("--bpe");
  if (o.encoder_path.empty() != o.bpe_path.empty())
    throw UsageError(
        "tessera data tokenize: --encoder and --bpe go together (GPT-2's "
        "encoder.json and vocab.bpe)");
  o.tokenizer_path = p.get("--tokenizer");
  if (!o.tokenizer_path.empty() && !o.encoder_path.empty())
    throw UsageError(
        "tessera data tokenize: --tokenizer (a tokenizer.json) or --encoder/--bpe (GPT-2's "
        "files), not both");
  o.fraction = fraction_option(p);
  o.shard_tokens = positive_option(p, "--shard-tokens", 100'000'000);
  if (o.shard_tokens > data::kShardMaxTokens)
    throw UsageError("tessera data tokenize: --shard-tokens is at most " +
                     std::to_string(data::kShardMaxTokens) + " (the header's count is an int32)");
  if (p.has("--doc-separator")) o.separator = p.get("--doc-separator");
  if (o.separator && o.separator->empty())
    throw UsageError("tessera data tokenize: --doc-separator needs a non-empty LINE");
  sft_options(p, o);
  o.out_dir = out_arg;
  o.name = p.get("--name");
  if (o.name.empty()) o.name = fs::absolute(o.out_dir).lexically_normal().filename().string();
  if (o.name.empty() || o.name == "." || o.name == "..") o.name = "data";
  if (o.name.find('/') != std::string::npos)
    throw UsageError("tessera data tokenize: --name '" + o.name + "' must not contain '/'");
  return o;
}

// The inputs' total size; a missing one fails before anything is written.
uint64_t input_bytes(const std::vector<std::string> &inputs) {
  uint64_t total = 0;
  for (const auto &in : inputs) {
    std::error_code ec;
    const auto st = fs::status(in, ec);
    if (ec || !fs::exists(st)) throw Error(TSR_ERR_IO, "input '" + in + "' does not exist");
    if (fs::is_directory(st))
      throw Error(TSR_ERR_IO, "input '" + in + "' is a directory, not a text file");
    total += fs::file_size(in, ec);
  }
  return total;
}

// A document's ids: GPT-2's BPE, a tokenizer.json, or its bytes.
struct DocEncoder {
  std::unique_ptr<data::Gpt2Bpe> bpe;
  std::unique_ptr<data::TokenizerJson> hf;
  std::optional<uint32_t> doc_token;  // a token before every document
  int64_t vocab = 256;
  std::string name = "byte-level";
  std::string byte_delimiter;           // bytes only: the separator line after each document
  std::optional<data::SftEncoder> sft;  // JSONL examples with loss masks

  void encode(std::string_view doc, const std::string &input, std::vector<uint32_t> &ids) const {
    ids.clear();
    if (!bpe && !hf) {
      for (unsigned char b : doc) ids.push_back(b);
      for (unsigned char b : byte_delimiter) ids.push_back(b);
      return;
    }
    if (doc_token) ids.push_back(*doc_token);
    try {
      if (bpe)
        bpe->encode(doc, ids);
      else
        hf->encode(doc, ids);
    } catch (const Error &e) {
      throw Error(e.code(), "input '" + input + "': " + e.what());
    }
  }
};

DocEncoder doc_encoder(const TokenizeOptions &o) {
  DocEncoder e;
  e.byte_delimiter = o.separator ? *o.separator + "\n" : "";
  if (!o.encoder_path.empty()) {
    e.bpe = std::make_unique<data::Gpt2Bpe>(data::Gpt2Bpe::load(o.encoder_path, o.bpe_path));
    e.vocab = e.bpe->vocab_size();
    e.doc_token = e.bpe->end_of_text();
    e.name = "GPT-2 BPE";
  } else if (!o.tokenizer_path.empty()) {
    e.hf = std::make_unique<data::TokenizerJson>(data::TokenizerJson::load(o.tokenizer_path));
    e.vocab = e.hf->vocab_size();
    if (e.hf->added_by_post_processor() == 0) e.doc_token = e.hf->token_id("<|endoftext|>");
    e.name = e.hf->name() + ": " + e.hf->describe();
    if (o.sft) {
      e.sft = data::sft_encoder(*o.sft, *e.hf, o.tokenizer_path, o.chat_format);
      e.name += o.sft == data::SftKind::chat
                    ? std::string(", chat format ") + data::chat_style_name(e.sft->format.style) +
                          " (from " + e.sft->format_source + ")"
                    : ", prompt-completion ending with " + e.sft->eos;
    }
  }
  return e;
}

// Creates OUTDIR and removes the shards an earlier run left under these
// prefixes, so the split holds only this run's.
void prepare_out_dir(const fs::path &out_dir, const std::vector<std::string> &prefixes) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec)
    throw Error(TSR_ERR_IO,
                "cannot create output directory '" + out_dir.string() + "': " + ec.message());
  for (const auto &prefix : prefixes) {
    for (const auto &old : data::existing_shards(out_dir, prefix)) {
      fs::remove(old, ec);
      if (ec)
        throw Error(TSR_ERR_IO,
                    "cannot remove earlier shard '" + old.string() + "': " + ec.message());
    }
  }
}

// The two splits being written.
struct Splits {
  data::ShardWriter train, eval;
  SplitStats train_stats, eval_stats;
  int64_t documents = 0;
  int64_t bad_lines = 0;  // JSONL lines skipped (--max-bad)
};

// Whether document d (counting from 0 across all inputs) goes to eval:
// every 1/fraction-th, spread evenly.
bool document_to_eval(double fraction, int64_t d) {
  const double x = static_cast<double>(d);
  return fraction > 0 && std::floor((x + 1) * fraction + 0.5) > std::floor(x * fraction + 0.5);
}

// The text documents of one input into their splits.
void tokenize_text(const TokenizeOptions &o, const DocEncoder &enc, const std::string &in,
                   std::string_view text, Splits &s, const std::function<void(size_t)> &done) {
  std::vector<uint32_t> ids;
  for (std::string_view doc : split_documents(text, o.separator)) {
    const bool to_eval = document_to_eval(o.fraction, s.documents++);
    ++(to_eval ? s.eval_stats : s.train_stats).documents;
    enc.encode(doc, in, ids);
    (to_eval ? s.eval : s.train).add(ids);
    done(static_cast<size_t>(doc.data() + doc.size() - text.data()));
  }
}

// The JSONL examples of one input (--format chat|prompt-completion), one a
// line, blank lines skipped, into their splits with their loss masks. A
// line that is no valid example is reported as FILE:LINE and skipped, up
// to --max-bad of them in all.
void tokenize_examples(const TokenizeOptions &o, const DocEncoder &enc, const std::string &in,
                       std::string_view text, Splits &s, const std::function<void(size_t)> &done) {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  int64_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t eol = std::min(text.find('\n', pos), text.size());
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string why = enc.sft->encode_line(line, ids, mask);
    if (!why.empty()) {
      const std::string where = in + ":" + std::to_string(line_no) + ": " + why;
      if (++s.bad_lines > o.max_bad)
        throw Error(TSR_ERR_INVALID,
                    where + " (" + std::to_string(s.bad_lines) + " bad line(s) so far, --max-bad " +
                        std::to_string(o.max_bad) +
                        "); fix the line, or pass a larger --max-bad to skip such lines");
      if (s.bad_lines <= 20) std::fprintf(stderr, "warning: %s; line skipped\n", where.c_str());
      continue;
    }
    const bool to_eval = document_to_eval(o.fraction, s.documents++);
    ++(to_eval ? s.eval_stats : s.train_stats).documents;
    (to_eval ? s.eval : s.train).add_example(ids, mask);
    done(std::min(pos, text.size()));
  }
}

// Every document of every input into its split, with a progress line on
// long work.
void tokenize_inputs(const TokenizeOptions &o, const DocEncoder &enc, uint64_t total_bytes,
                     Splits &s, Progress &progress) {
  progress.total_bytes = total_bytes;
  progress.enabled = total_bytes >= (uint64_t{16} << 20);
  progress.tty = ::isatty(STDERR_FILENO) != 0;
  uint64_t done_bytes = 0;
  for (const auto &in : o.inputs) {
    const std::string text = read_input(in);
    const auto done = [&](size_t in_file) {
      progress.update(done_bytes + in_file, s.train.tokens() + s.eval.tokens());
    };
    if (enc.sft)
      tokenize_examples(o, enc, in, text, s, done);
    else
      tokenize_text(o, enc, in, text, s, done);
    done_bytes += text.size();
  }
  s.train.finish();
  s.eval.finish();
  progress.update(done_bytes, s.train.tokens() + s.eval.tokens(), true);
  progress.done();
}

void check_splits(const Parsed &p, const TokenizeOptions &o, const Splits &s) {
  if (s.train.tokens() == 0)
    throw Error(TSR_ERR_INVALID, "no text for the train split: " + std::to_string(s.documents) +
                                     " document(s) in " + std::to_string(o.inputs.size()) +
                                     " input(s)");
  if (o.fraction > 0 && s.eval.tokens() == 0)
    throw Error(TSR_ERR_INVALID,
                "no document for the eval split: " + std::to_string(s.documents) +
                    " document(s) with --eval-fraction " + p.get("--eval-fraction", "0.05") +
                    " give none; split the inputs into documents (--doc-separator), give more "
                    "inputs, or pass --eval-fraction 0");
}

void print_tokenize_summary(const TokenizeOptions &o, const DocEncoder &enc, const Splits &s,
                            uint64_t total_bytes, double secs) {
  std::printf("tokenized %zu input(s), %s, into %lld %s in %.1f s (%s/s)\n", o.inputs.size(),
              format_bytes(static_cast<double>(total_bytes)).c_str(),
              static_cast<long long>(s.documents), o.sft ? "examples" : "documents", secs,
              format_bytes(secs > 0 ? static_cast<double>(total_bytes) / secs : 0).c_str());
  std::printf("  tokenizer  %s, vocab %lld, uint%d tokens\n", enc.name.c_str(),
              static_cast<long long>(enc.vocab), data::token_width_for_vocab(enc.vocab) * 8);
  auto report = [&](const char *label, const SplitStats &st, const data::ShardWriter &w) {
    std::printf("  %-9s  %lld %s, %lld tokens", label, static_cast<long long>(st.documents),
                w.masked() ? "examples" : "documents", static_cast<long long>(w.tokens()));
    if (w.masked())
      std::printf(" (%lld trained, %.1f%%)", static_cast<long long>(w.trained_tokens()),
                  w.tokens() ? 100.0 * static_cast<double>(w.trained_tokens()) /
                                   static_cast<double>(w.tokens())
                             : 0.0);
    std::printf(", %zu shard(s)", w.files().size());
    if (!w.files().empty())
      std::printf(": %s%s", w.files().front().string().c_str(), w.files().size() > 1 ? " ..." : "");
    std::printf("\n");
  };
  report("train", s.train_stats, s.train);
  report("eval", s.eval_stats, s.eval);
  if (s.bad_lines > 0)
    std::printf("  skipped    %lld bad line(s) (--max-bad %lld)\n",
                static_cast<long long>(s.bad_lines), static_cast<long long>(o.max_bad));
  std::printf("  dataset    [data.train] plugin = \"tokens\", files = \"%s\", vocab = %lld\n",
              (o.out_dir / (o.name + "_train_*.bin")).string().c_str(),
              static_cast<long long>(enc.vocab));
}

int tokenize_body(const Parsed &p) {
  const TokenizeOptions o = tokenize_options(p);
  const uint64_t total_bytes = input_bytes(o.inputs);
  const DocEncoder enc = doc_encoder(o);
  const int width = data::token_width_for_vocab(enc.vocab);
  const std::string train_prefix = o.name + "_train", eval_prefix = o.name + "_eval";
  prepare_out_dir(o.out_dir, {train_prefix, eval_prefix});
  const bool masked = o.sft.has_value();
  // SFT examples keep their starts in the shards (versions 2001/2007), for packing.
  Splits s{data::ShardWriter(o.out_dir, train_prefix, width, o.shard_tokens, masked, masked),
           data::ShardWriter(o.out_dir, eval_prefix, width, o.shard_tokens, masked, masked),
           {},
           {},
           0,
           0};
  Progress progress;
  tokenize_inputs(o, enc, total_bytes, s, progress);
  check_splits(p, o, s);
  print_tokenize_summary(o, enc, s, total_bytes, progress.elapsed());
  return 0;
}

int data_body(const Parsed &p) {
  if (p.positional.empty())
    throw UsageError("tessera data: expected a command ('tokenize', 'encode' or 'decode')");
  throw UsageError("tessera data: unknown command '" + p.positional[0] + "'");
}

}  // namespace

int cmd_data(const Args &args) {
  if (!args.empty() && args[0] == "tokenize") {
    return run_command("data tokenize", kTokenizeUsage, tokenize_body,
                       Args(args.begin() + 1, args.end()),
                       {{"-o", true, false},
                        {"--output", true, false},
                        {"--encoder", true, false},
                        {"--bpe", true, false},
                        {"--tokenizer", true, false},
                        {"--eval-fraction", true, false},
                        {"--shard-tokens", true, false},
                        {"--name", true, false},
                        {"--doc-separator", true, false},
                        {"--format", true, false},
                        {"--chat-format", true, false},
                        {"--max-bad", true, false},
                        {"--help", false, false},
                        {"-h", false, false}});
  }
  if (!args.empty() && args[0] == "encode")
    return cmd_data_encode(Args(args.begin() + 1, args.end()));
  if (!args.empty() && args[0] == "decode")
    return cmd_data_decode(Args(args.begin() + 1, args.end()));
  return run_command("data", kDataUsage, data_body, args,
                     {{"--help", false, false}, {"-h", false, false}});
}

}  // namespace tessera::cli

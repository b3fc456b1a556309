#include "data/token_shard.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "util/error.hpp"

namespace fs = std::filesystem;

namespace tessera::data {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian; this writer assumes a little-endian host");

namespace {

[[noreturn]] void io_fail(const std::string &what, const fs::path &path, int err) {
  throw Error(TSR_ERR_IO, what + " '" + path.string() + "': " + std::strerror(err));
}

bool is_shard_name(const std::string &name, const std::string &prefix) {
  // PREFIX_NNNNNN.bin
  const std::string tail = name.substr(std::min(name.size(), prefix.size()));
  if (name.compare(0, prefix.size(), prefix) != 0 || tail.size() != 1 + 6 + 4) return false;
  if (tail[0] != '_' || tail.compare(7, 4, ".bin") != 0) return false;
  return std::all_of(tail.begin() + 1, tail.begin() + 7,
                     [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

int token_width_for_vocab(int64_t vocab) {
  return vocab <= 65536 ? 2 : 4;
}

ShardWriter::ShardWriter(fs::path dir, std::string prefix, int width, int64_t shard_tokens,
                         bool masked, bool examples)
    : dir_(std::move(dir)),
      prefix_(std::move(prefix)),
      width_(width),
      shard_tokens_(std::clamp<int64_t>(shard_tokens, 1, kShardMaxTokens)),
      masked_(masked || examples),
      examples_(examples) {
  if (width_ != 2 && width_ != 4)
    throw Error(TSR_ERR_INVALID,
                "token shard: width must be 2 or 4 bytes, got " + std::to_string(width_));
  buffer_.reserve(size_t{1} << 20);
}

ShardWriter::~ShardWriter() {
  if (file_) {
    std::fclose(file_);
    std::error_code ec;
    fs::remove(tmp_path_, ec);
  }
}

void ShardWriter::open_next() {
  char name[32];
  std::snprintf(name, sizeof name, "_%06zu.bin", files_.size());
  final_path_ = dir_ / (prefix_ + name);
  tmp_path_ = final_path_;
  tmp_path_ += ".tmp";
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  if (!file_) io_fail("cannot create token shard", tmp_path_, errno);
  // The header's count is filled in when the shard is complete.
  const std::vector<unsigned char> zeros(formats::token_shard::kHeaderBytes, 0);
  if (std::fwrite(zeros.data(), 1, zeros.size(), file_) != zeros.size())
    io_fail("cannot write token shard", tmp_path_, errno);
  in_shard_ = 0;
}

void ShardWriter::flush_buffer() {
  if (buffer_.empty()) return;
  if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size())
    io_fail("cannot write token shard", tmp_path_, errno);
  buffer_.clear();
}

void ShardWriter::close_current() {
  flush_buffer();
  if (masked_) {
    if (std::fwrite(mask_.data(), 1, mask_.size(), file_) != mask_.size())
      io_fail("cannot write token shard", tmp_path_, errno);
    mask_.clear();
  }
  if (examples_) {  // little-endian int32, as the header
    const size_t bytes = starts_.size() * sizeof(int32_t);
    if (std::fwrite(starts_.data(), 1, bytes, file_) != bytes)
      io_fail("cannot write token shard", tmp_path_, errno);
  }
  const auto header = formats::token_shard::header(
      width_, in_shard_, masked_, examples_ ? static_cast<int64_t>(starts_.size()) : -1);
  starts_.clear();
  if (std::fseek(file_, 0, SEEK_SET) != 0 ||
      std::fwrite(header.data(), 1, sizeof header, file_) != sizeof header)
    io_fail("cannot write token shard header", tmp_path_, errno);
  if (std::fflush(file_) != 0) io_fail("cannot write token shard", tmp_path_, errno);
  const int closed = std::fclose(file_);
  file_ = nullptr;
  if (closed != 0) io_fail("cannot write token shard", tmp_path_, errno);
  std::error_code ec;
  fs::rename(tmp_path_, final_path_, ec);
  if (ec)
    throw Error(TSR_ERR_IO, "cannot rename '" + tmp_path_.string() + "' to '" +
                                final_path_.string() + "': " + ec.message());
  files_.push_back(final_path_);
}

void ShardWriter::add(uint32_t token, bool trained) {
  if (width_ == 2 && token > 0xFFFF)
    throw Error(TSR_ERR_INVALID, "token shard '" + final_path_.string() + "': token " +
                                     std::to_string(token) + " does not fit in uint16");
  if (!file_) open_next();
  unsigned char bytes[4];
  std::memcpy(bytes, &token, 4);  // little-endian: the low bytes first
  buffer_.insert(buffer_.end(), bytes, bytes + width_);
  if (buffer_.size() >= (size_t{1} << 20)) flush_buffer();
  if (masked_) mask_.push_back(trained ? 1 : 0);
  trained_ += trained ? 1 : 0;
  ++in_shard_;
  ++total_;
  if (in_shard_ == shard_tokens_) close_current();
}

void ShardWriter::add(const std::vector<uint32_t> &tokens, const std::vector<uint8_t> &mask) {
  if (mask.size() != tokens.size())
    throw Error(TSR_ERR_INTERNAL, "token shard: " + std::to_string(tokens.size()) + " tokens but " +
                                      std::to_string(mask.size()) + " mask entries");
  for (size_t i = 0; i < tokens.size(); ++i) add(tokens[i], mask[i] != 0);
}

void ShardWriter::add_example(const std::vector<uint32_t> &tokens,
                              const std::vector<uint8_t> &mask) {
  if (!examples_)
    throw Error(TSR_ERR_INTERNAL, "token shard: add_example on a writer without example starts");
  const auto n = static_cast<int64_t>(tokens.size());
  if (n == 0) return;
  if (n > shard_tokens_)
    throw Error(TSR_ERR_INVALID, "an example of " + std::to_string(n) +
                                     " tokens does not fit in a shard of --shard-tokens " +
                                     std::to_string(shard_tokens_) +
                                     " (examples are never split across shards); pass a larger "
                                     "--shard-tokens");
  if (file_ && in_shard_ + n > shard_tokens_) close_current();
  if (!file_) open_next();
  starts_.push_back(static_cast<int32_t>(in_shard_));
  add(tokens, mask);
}

void ShardWriter::finish() {
  if (file_) close_current();
}

std::vector<fs::path> existing_shards(const fs::path &dir, const std::string &prefix) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (is_shard_name(it->path().filename().string(), prefix)) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tessera::data

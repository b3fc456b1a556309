#include "util/tfevents.hpp"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "util/error.hpp"

namespace tessera {

namespace {

// The byte-at-a-time table of the reflected Castagnoli polynomial: event
// files are small (a few records per logged step), so the simple form does.
const std::array<uint32_t, 256> &crc32c_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// Protocol-buffer wire format, the few pieces an Event needs.
void put_varint(std::string &out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_fixed(std::string &out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

// Field keys: (field number << 3) | wire type (0 varint, 1 fixed64,
// 2 length-delimited, 5 fixed32).
void put_key(std::string &out, uint32_t field, uint32_t wire) {
  put_varint(out, (field << 3) | wire);
}

void put_bytes(std::string &out, uint32_t field, const std::string &bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_double(std::string &out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, 1);
  put_fixed(out, bits, 8);
}

void put_float(std::string &out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, 5);
  put_fixed(out, bits, 4);
}

double unix_time_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void *data, size_t n, uint32_t crc) {
  const auto &t = crc32c_table();
  const auto *p = static_cast<const uint8_t *>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void *data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; }
std::string encode_version_event(double wall_time) {
  std::string e;
  put_double(e, 1, wall_time);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

// Event { wall_time = 1; step = 2; Summary summary = 5; }, Summary
// { repeated Value value = 1; }, Value { string tag = 1; float simple_value = 2; }
std::string encode_scalar_event(double wall_time, int64_t step, const std::string &tag,
                                float value) {
  std::string v;
  put_bytes(v, 1, tag);
  put_float(v, 2, value);
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e;
  put_double(e, 1, wall_time);
  put_key(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  put_bytes(e, 5, summary);
  return e;
}

std::string tfrecord(const std::string &payload) {
  std::string r;
  put_fixed(r, payload.size(), 8);
  put_fixed(r, masked_crc32c(r.data(), 8), 4);
  r += payload;
  put_fixed(r, masked_crc32c(payload.data(), payload.size()), 4);
  return r;
}

EventFileWriter::EventFileWriter(const std::string &dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw Error(TSR_ERR_IO, dir + ": cannot create the TensorBoard log directory (" + ec.message() +
                                "); check monitor.tensorboard.output_path");
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto now = static_cast<long long>(unix_time_now());
  char name[400];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%d.0", now, host,
                static_cast<int>(::getpid()));
  path_ = (std::filesystem::path(dir) / name).string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw Error(TSR_ERR_IO, path_ + ": cannot open for writing: " + std::strerror(errno));
  write_record(encode_version_event(unix_time_now()));
}

EventFileWriter::~EventFileWriter() {
  if (file_) std::fclose(file_);
}

void EventFileWriter::add_scalar(const std::string &tag, double value, int64_t step) {
  write_record(encode_scalar_event(unix_time_now(), step, tag, static_cast<float>(value)));
}

void EventFileWriter::write_record(const std::string &payload) {
  const std::string r = tfrecord(payload);
  if (std::fwrite(r.data(), 1, r.size(), file_) != r.size() || std::fflush(file_) != 0)
    throw Error(TSR_ERR_IO, path_ + ": write failed: " + std::strerror(errno));
}

}  // namespace tessera

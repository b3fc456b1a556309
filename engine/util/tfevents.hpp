// TensorBoard event files, written without TensorFlow or protobuf: the
// TFRecord framing (length, masked CRC-32C of the length, payload, masked
// CRC-32C of the payload) around hand-encoded `Event` protos holding scalar
// `Summary` values (tensorflow/core/util/event.proto, summary.proto). What
// TensorBoard's own reader reads; docs/observability.md, "monitor".
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace tessera {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), continuing `crc`.
uint32_t crc32c(const void *data, size_t n, uint32_t crc = 0);
// TFRecord's masked form: ((crc >> 15) | (crc << 17)) + 0xa282ead8, so that
// a CRC stored next to the data it covers does not checksum to itself.
uint32_t masked_crc32c(const void *data, size_t n);

// One event file in a log directory. The first record is the file-version
// event TensorBoard expects; every scalar is flushed as it is written, so a
// TensorBoard watching the directory sees a live run.
class EventFileWriter {
 public:
  // Creates `dir` (and parents) and opens
  // dir/events.out.tfevents.<unix time>.<host>.<pid>.0 (the name PyTorch's
  // SummaryWriter uses). Throws tessera::Error naming the file on failure.
  explicit EventFileWriter(const std::string &dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter &) = delete;
  EventFileWriter &operator=(const EventFileWriter &) = delete;

  void add_scalar(const std::string &tag, double value, int64_t step);
  const std::string &path() const { return path_; }

 private:
  void write_record(const std::string &payload);
  std::string path_;
  FILE *file_ = nullptr;
};

// The encodings, exposed for the tests: an Event with a file_version, and
// an Event with one scalar Summary.Value.
std::string encode_version_event(double wall_time);
std::string encode_scalar_event(double wall_time, int64_t step, const std::string &tag,
                                float value);
// One TFRecord around `payload`.
std::string tfrecord(const std::string &payload);

}  // namespace tessera

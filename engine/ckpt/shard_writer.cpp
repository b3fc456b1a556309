#include "ckpt/shard_writer.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "backend/cpu/cpu_pool.hpp"
#include "util/error.hpp"

namespace tessera {

namespace {

// O_DIRECT wants buffer addresses, file offsets and lengths aligned to the
// device's logical block; 4 KiB covers every common one.
constexpr size_t kAlign = 4096;

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

std::string sys_error(const std::string &path, const char *call, int err) {
  return path + ": " + call + " failed: " + std::strerror(err);
}

// A part of one checksum block inside one chunk.
struct Piece {
  size_t tensor, block;
  const char *data;
  size_t len;
  uint32_t crc;
};

struct WriteJob {
  int buf;
  size_t chunk, len;  // chunk index, bytes of file data in it
};

// The pipeline's shared state: buffers free for filling, chunks waiting for
// their checksums and for the disk.
class Ring {
 public:
  explicit Ring(int n) : pending_(static_cast<size_t>(n), 0) {
    for (int i = 0; i < n; ++i) free_.push_back(i);
  }
  // A free buffer, or -1 once the pipeline has failed.
  int take() {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return !free_.empty() || !error_.empty(); });
    if (!error_.empty()) return -1;
    int b = free_.front();
    free_.pop_front();
    return b;
  }
  void submit(const WriteJob &j) {
    std::lock_guard<std::mutex> lk(m_);
    pending_[static_cast<size_t>(j.buf)] = 2;
    crc_.push_back(j);
    write_.push_back(j);
    cv_.notify_all();
  }
  // The next job of a queue, or false once it is empty and closed.
  bool next(bool crc_queue, WriteJob *out) {
    std::unique_lock<std::mutex> lk(m_);
    auto &q = crc_queue ? crc_ : write_;
    cv_.wait(lk, [&] { return !q.empty() || closed_; });
    if (q.empty()) return false;
    *out = q.front();
    q.pop_front();
    return true;
  }
  void done(int buf) {
    std::lock_guard<std::mutex> lk(m_);
    if (--pending_[static_cast<size_t>(buf)] == 0) free_.push_back(buf);
    cv_.notify_all();
  }
  void fail(const std::string &why) {
    std::lock_guard<std::mutex> lk(m_);
    if (error_.empty()) error_ = why;
    cv_.notify_all();
  }
  bool failed() {
    std::lock_guard<std::mutex> lk(m_);
    return !error_.empty();
  }
  void close() {
    std::lock_guard<std::mutex> lk(m_);
    closed_ = true;
    cv_.notify_all();
  }
  std::string error() {
    std::lock_guard<std::mutex> lk(m_);
    return error_;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<int> free_;
  std::deque<WriteJob> crc_, write_;
  std::vector<int> pending_;
  bool closed_ = false;
  std::string error_;
};

// The file: O_DIRECT where it can, a plain descriptor otherwise (tmpfs and
// some network filesystems refuse O_DIRECT at open or at the first write).
struct ShardFile {
  std::string path;
  int fd = -1;
  bool direct = false;

  ShardFile(const std::string &p, bool want_direct) : path(p) {
    const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    if (want_direct) {
      fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
      direct = fd >= 0;
    }
    if (fd < 0) fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) throw Error(TSR_ERR_IO, sys_error(path, "open", errno));
  }
  ~ShardFile() {
    if (fd >= 0) ::close(fd);
  }
  ShardFile(const ShardFile &) = delete;
  ShardFile &operator=(const ShardFile &) = delete;

  // Drops O_DIRECT (after the filesystem refused an aligned direct write).
  void go_buffered() {
    int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0 && ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) == 0) direct = false;
  }

  // Writes `len` bytes at `offset`; returns 0 or an errno.
  int write_at(const char *data, size_t len, size_t offset) {
    while (len > 0) {
      const ssize_t n = ::pwrite(fd, data, len, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL && direct) {
        go_buffered();
        if (!direct) continue;
      }
      if (n < 0) return errno;
      if (n == 0) return EIO;
      data += n;
      len -= static_cast<size_t>(n);
      offset += static_cast<size_t>(n);
    }
    return 0;
  }
};

// Where each tensor's bytes start in the file, after the safetensors prefix.
std::vector<size_t> tensor_starts(const std::vector<StTensor> &tensors, size_t prefix_bytes,
                                  size_t *total) {
  std::vector<size_t> start(tensors.size());
  *total = prefix_bytes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    start[i] = *total;
    *total += tensors[i].bytes;
  }
  return start;
}

// The ring's buffers, `chunk` bytes each, from opts.memory (else aligned
// heap memory); released when the writer is done with them.
struct ChunkBuffers {
  const ShardBuffers &memory;
  std::vector<char *> bufs;
  ChunkBuffers(const ShardBuffers &m, const std::string &path, int n, size_t chunk) : memory(m) {
    for (int i = 0; i < n; ++i) {
      void *p = nullptr;
      if (memory.alloc) {
        p = memory.alloc(chunk);
      } else if (::posix_memalign(&p, kAlign, chunk) != 0) {
        p = nullptr;
      }
      if (!p) {
        release();
        throw Error(TSR_ERR_NO_MEMORY, path + ": cannot allocate the checkpoint writer's " +
                                           std::to_string(n) + " buffers of " +
                                           std::to_string(chunk >> 20) + " MiB");
      }
      bufs.push_back(static_cast<char *>(p));
    }
  }
  ChunkBuffers(const ChunkBuffers &) = delete;
  ChunkBuffers &operator=(const ChunkBuffers &) = delete;
  ~ChunkBuffers() { release(); }
  void release() {
    for (char *b : bufs) {
      if (memory.release)
        memory.release(b);
      else
        std::free(b);
    }
    bufs.clear();
  }
};

// One shard on its way to disk: the file's tensors and where they start,
// the chunks the file is cut into, and the ring that passes each chunk's
// buffer from the filler to the checksum and write threads.
struct ShardPipe {
  const std::string &path;
  const std::vector<StTensor> &tensors;
  const std::vector<size_t> &start;
  size_t total, chunk, block;
  ChunkBuffers &buffers;
  Ring &ring;
};

// The checksum thread: each chunk's pieces of blocks in parallel, then
// folded into the blocks in file order (chunks leave the queue in order).
void checksum_chunks(ShardPipe &pipe, std::vector<std::vector<uint32_t>> &blocks) {
  WriteJob j;
  std::vector<Piece> pieces;
  while (pipe.ring.next(true, &j)) {
    pieces.clear();
    const size_t a = j.chunk * pipe.chunk, b = a + j.len;
    for (size_t i = 0; i < pipe.tensors.size(); ++i) {
      const size_t start = pipe.start[i];
      const size_t lo = std::max(a, start), hi = std::min(b, start + pipe.tensors[i].bytes);
      for (size_t p = lo; p < hi;) {
        const size_t in_tensor = p - start, blk = in_tensor / pipe.block;
        const size_t end = std::min(hi, start + (blk + 1) * pipe.block);
        pieces.push_back(
            Piece{i, blk, pipe.buffers.bufs[static_cast<size_t>(j.buf)] + (p - a), end - p, 0});
        p = end;
      }
    }
    cpu::parallel_for(static_cast<int64_t>(pieces.size()), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t k = lo; k < hi; ++k) {
        Piece &pc = pieces[static_cast<size_t>(k)];
        pc.crc = crc32_of(pc.data, pc.len);
      }
    });
    for (const Piece &pc : pieces) {
      uint32_t &c = blocks[pc.tensor][pc.block];
      c = static_cast<uint32_t>(crc32_combine(c, pc.crc, static_cast<z_off_t>(pc.len)));
    }
    pipe.ring.done(j.buf);
  }
}

// The write thread: each chunk to its place in the file.
void write_chunks(ShardPipe &pipe, ShardFile &file) {
  WriteJob j;
  while (pipe.ring.next(false, &j)) {
    if (!pipe.ring.failed()) {
      // Direct writes go out in whole 4 KiB units; the last chunk's tail
      // past the data is zero and cut off by the ftruncate in write_shard.
      const size_t len = file.direct ? round_up(j.len, kAlign) : j.len;
      if (int err = file.write_at(pipe.buffers.bufs[static_cast<size_t>(j.buf)], len,
                                  j.chunk * pipe.chunk))
        pipe.ring.fail(err == ENOSPC ? pipe.path + ": no space left on the device"
                                     : sys_error(pipe.path, "write", err));
    }
    pipe.ring.done(j.buf);
  }
}

// The calling thread fills each chunk: the prefix, then each tensor's bytes
// from `fill`. Returns fill's exception, passed on as it is (a plugin's
// status and message) once the other threads have stopped.
std::exception_ptr fill_chunks(ShardPipe &pipe, const std::string &prefix, const ShardFill &fill) {
  const std::vector<StTensor> &tensors = pipe.tensors;
  const size_t chunks = (pipe.total + pipe.chunk - 1) / pipe.chunk;
  size_t first = 0;  // the first tensor not wholly before this chunk
  for (size_t k = 0; k < chunks; ++k) {
    const int b = pipe.ring.take();
    if (b < 0) break;
    char *buf = pipe.buffers.bufs[static_cast<size_t>(b)];
    const size_t a = k * pipe.chunk, len = std::min(pipe.chunk, pipe.total - a);
    try {
      if (a < prefix.size()) std::memcpy(buf, prefix.data() + a, std::min(len, prefix.size() - a));
      while (first < tensors.size() && pipe.start[first] + tensors[first].bytes <= a) ++first;
      for (size_t i = first; i < tensors.size() && pipe.start[i] < a + len; ++i) {
        const size_t lo = std::max(a, pipe.start[i]),
                     hi = std::min(a + len, pipe.start[i] + tensors[i].bytes);
        if (lo < hi) fill(i, lo - pipe.start[i], hi - lo, buf + (lo - a));
      }
      if (len < pipe.chunk) std::memset(buf + len, 0, round_up(len, kAlign) - len);
    } catch (...) {
      pipe.ring.fail(pipe.path + ": filling the checkpoint buffer failed");
      return std::current_exception();
    }
    pipe.ring.submit(WriteJob{b, k, len});
  }
  return nullptr;
}

// The CRC-32 of the whole file, from the prefix's and the blocks' own.
uint32_t file_crc(const std::string &prefix, const std::vector<StTensor> &tensors,
                  const std::vector<std::vector<uint32_t>> &blocks, size_t block) {
  uLong c = crc32_of(prefix.data(), prefix.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    uLong t = crc32(0L, Z_NULL, 0);
    for (size_t blk = 0; blk < blocks[i].size(); ++blk) {
      const size_t len = std::min(block, tensors[i].bytes - blk * block);
      t = crc32_combine(t, blocks[i][blk], static_cast<z_off_t>(len));
    }
    c = crc32_combine(c, t, static_cast<z_off_t>(tensors[i].bytes));
  }
  return static_cast<uint32_t>(c);
}

}  // namespace

uint32_t crc32_of(const void *data, size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  const auto *p = static_cast<const Bytef *>(data);
  while (n > 0) {  // zlib takes at most 4 GiB - 1 per call
    const uInt part = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = crc32(c, p, part);
    p += part;
    n -= part;
  }
  return static_cast<uint32_t>(c);
}

ShardWritten write_shard(const std::string &path, const std::vector<StTensor> &tensors,
                         const std::map<std::string, std::string> &metadata, const ShardFill &fill,
                         const ShardWriteOptions &opts) {
  if (opts.block == 0 || opts.buffers < 1)
    throw Error(TSR_ERR_INVALID, path + ": checkpoint writer: bad block size or buffer count");
  const std::string prefix = safetensors_prefix(tensors, metadata, kAlign);
  ShardWritten w;
  w.data_start = prefix.size();
  size_t total = 0;
  const std::vector<size_t> start = tensor_starts(tensors, prefix.size(), &total);
  for (const StTensor &t : tensors)
    w.blocks.emplace_back((t.bytes + opts.block - 1) / opts.block, 0u);
  w.bytes = total;

  ShardFile file(path, opts.direct);
  // Reserve the space first: a full disk fails here, before any work.
  if (int err = ::posix_fallocate(file.fd, 0, static_cast<off_t>(total)); err == ENOSPC)
    throw Error(TSR_ERR_IO, path + ": no space left for the " + std::to_string(total) +
                                " bytes of this checkpoint shard");

  const size_t chunk =
      std::min(round_up(std::max(opts.chunk, kAlign), kAlign), round_up(total, kAlign));
  const size_t chunks = (total + chunk - 1) / chunk;
  const int nbuf = static_cast<int>(std::min<size_t>(static_cast<size_t>(opts.buffers), chunks));
  ChunkBuffers buffers(opts.memory, path, nbuf, chunk);
  Ring ring(nbuf);
  ShardPipe pipe{path, tensors, start, total, chunk, opts.block, buffers, ring};
  std::thread crc_thread([&] { checksum_chunks(pipe, w.blocks); });
  std::thread write_thread([&] { write_chunks(pipe, file); });
  const std::exception_ptr fill_error = fill_chunks(pipe, prefix, fill);
  ring.close();
  crc_thread.join();
  write_thread.join();
  buffers.release();
  if (fill_error) std::rethrow_exception(fill_error);
  if (std::string why = ring.error(); !why.empty()) throw Error(TSR_ERR_IO, why);

  if (file.direct && total % kAlign != 0 && ::ftruncate(file.fd, static_cast<off_t>(total)) != 0)
    throw Error(TSR_ERR_IO, sys_error(path, "ftruncate", errno));
  if (::fsync(file.fd) != 0) throw Error(TSR_ERR_IO, sys_error(path, "fsync", errno));
  w.direct = file.direct;
  w.crc = file_crc(prefix, tensors, w.blocks, opts.block);
  return w;
}

}  // namespace tessera

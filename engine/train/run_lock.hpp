// One job per run directory and per checkpoint directory (docs/security.md):
// two jobs writing the same checkpoints or metrics.jsonl would interleave
// their steps and lines, all passing verify. Rank 0 holds an exclusive lock
// on each directory for its life; a second job is refused, naming the
// holder. The lock is flock(2) on DIR/.tessera.lock: the kernel drops it
// when its holder dies however it dies, so a dead job's lock is taken over
// by the next without any cleanup (the file stays, with the last holder).
#pragma once

#include <string>
#include <vector>

#include "util/error.hpp"

namespace tessera {

// The refusal of a directory another job holds: what a refused job must
// not record in that directory (it is the other job's).
class RunDirInUse : public Error {
 public:
  using Error::Error;
};

class RunLock {
 public:
  RunLock() = default;
  // Creates each directory if needed, checks it is writable (a test file,
  // then removed) and locks it; `roles` name them in messages ("run.dir",
  // "checkpoint.dir"). A directory named twice (or the same by another
  // path) is locked once. Throws Error when one is held by another job.
  RunLock(const std::vector<std::string> &dirs, const std::vector<std::string> &roles);
  ~RunLock();
  RunLock(const RunLock &) = delete;
  RunLock &operator=(const RunLock &) = delete;
  RunLock(RunLock &&o) noexcept : fds_(std::move(o.fds_)) { o.fds_.clear(); }

 private:
  std::vector<int> fds_;
};

// True when another process holds `dir`'s lock now (a job running there).
// A process that holds it itself through a RunLock gets true as well
// (flock locks belong to open files): ask after releasing it.
bool run_dir_held_by_another(const std::string &dir);

}  // namespace tessera

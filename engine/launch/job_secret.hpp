// The per-job secret of the rendezvous store (docs/security.md,
// "Rendezvous"): made by the launcher, handed to its workers in
// TESSERA_JOB_SECRET, never printed.
#pragma once

#include <string>

namespace tessera {

// 32 random bytes from the kernel, as 64 hex digits.
std::string new_job_secret();

// The secret in `path`: the file must be a regular file owned by this user
// and readable by nobody else (mode 0600 or stricter); surrounding white
// space is dropped; at least 16 characters. Throws Error naming the file.
std::string read_job_secret_file(const std::string &path);

// Throws Error (naming `origin`) when `secret` is too short to be one.
void check_job_secret(const std::string &secret, const std::string &origin);

// The secret a launcher uses, in order: `file` (--job-secret-file), the
// TESSERA_JOB_SECRET it was started with, a "secret VALUE" first line on its
// standard input (`from_stdin`: a node launcher of a --hostfile job, whose
// head sends it over ssh), or a new one when the job has one node. Several
// nodes without any of these: an Error saying how to give one.
std::string launcher_job_secret(const std::string &file, bool from_stdin, int nnodes);

}  // namespace tessera

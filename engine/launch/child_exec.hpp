// What a forked child needs to exec, built before the fork. The launcher
// has threads (its store server, the pipes' readers), and after fork() in
// a multi-threaded process the child may only make async-signal-safe
// calls: an allocation there can wait for ever for a lock another thread
// held at the fork (seen under ASan: a worker's putenv, whose realloc spun
// on the sanitizer's allocator lock, hung a 2-rank test one run in ten).
// So the argument and environment arrays are made here, and the child only
// dup2s, execs and, if that fails, writes the prepared message and exits.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace tessera {

class ChildExec {
 public:
  // argv as given; the environment is this process's with `env`'s
  // NAME=VALUE entries replacing (or adding to) it.
  ChildExec(std::vector<std::string> argv, const std::vector<std::string> &env,
            std::string fail_prefix)
      : args_(std::move(argv)), fail_(std::move(fail_prefix)) {
    for (char **e = environ; e && *e; ++e) {
      const std::string_view kv(*e);
      bool replaced = false;
      for (const auto &o : env)
        if (name_of(o) == name_of(kv)) replaced = true;
      if (!replaced) env_.emplace_back(kv);
    }
    env_.insert(env_.end(), env.begin(), env.end());
    for (auto &a : args_) argv_.push_back(a.data());
    argv_.push_back(nullptr);
    for (auto &e : env_) envp_.push_back(e.data());
    envp_.push_back(nullptr);
  }

  // In the child: execs `path` (execvpe: searched in PATH when it has no
  // slash); on failure writes the message and exits 127. Never returns.
  [[noreturn]] void run(const char *path) {
    ::execvpe(path, argv_.data(), envp_.data());
    const char *why = std::strerror(errno);  // glibc: a static table, no allocation
    (void)!::write(2, fail_.data(), fail_.size());
    (void)!::write(2, why, std::strlen(why));
    (void)!::write(2, "\n", 1);
    ::_exit(127);
  }

 private:
  static std::string_view name_of(std::string_view kv) { return kv.substr(0, kv.find('=')); }
  std::vector<std::string> args_, env_;
  std::vector<char *> argv_, envp_;
  std::string fail_;
};

}  // namespace tessera

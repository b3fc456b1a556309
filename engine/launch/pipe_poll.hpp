// A supervising launcher's handling of its children, shared by the local
// launcher (workers) and the ssh launcher (nodes): its own stop signals,
// starting a child tied to its parent's life, the wait on their pipes, and
// moving whole lines from a pipe to where they go.
#pragma once

#include <poll.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "util/error.hpp"

namespace tessera {

// Routes SIGINT and SIGTERM to `on_stop`, which only records the signal:
// the supervising loop sees it and stops its children in order (they save a
// checkpoint first) before the launcher exits. Without SA_RESTART, a
// blocking call the signal interrupts returns EINTR, so the loop sees it at
// once. SIGPIPE is ignored: a write to a closed pipe (a child's stdin, or
// our own output whose reader quit) fails with EPIPE instead of killing the
// launcher, and with it (fork_tied_child) every child, unsaved.
inline void install_stop_signals(void (*on_stop)(int)) {
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

// fork(), with the child killed (SIGKILL) when its parent dies, so that no
// child outlives its launcher; a child whose parent died before that took
// hold exits at once. Returns fork's value; throws Error naming the cause
// when there is no child.
inline pid_t fork_tied_child() {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(TSR_ERR_IO, std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
  }
  return pid;
}

// Polls the open stdout and stderr pipes of `kids` (members out_fd and
// err_fd, -1 once closed) and `extra` when >= 0, for up to 100 ms (a 50 ms
// sleep when nothing is open), then calls on_extra() if `extra` is readable
// or closed, and on_pipe(kid, is_err) for each pipe that is, in kid order.
// The callbacks may close what they read (the fds were taken before).
template <typename Kid, typename OnExtra, typename OnPipe>
void poll_child_pipes(std::vector<Kid> &kids, int extra, OnExtra on_extra, OnPipe on_pipe) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Kid *, bool>> owners;  // nullptr: extra; bool: stderr
  if (extra >= 0) {
    fds.push_back({extra, POLLIN, 0});
    owners.push_back({nullptr, false});
  }
  for (Kid &k : kids) {
    if (k.out_fd >= 0) {
      fds.push_back({k.out_fd, POLLIN, 0});
      owners.push_back({&k, false});
    }
    if (k.err_fd >= 0) {
      fds.push_back({k.err_fd, POLLIN, 0});
      owners.push_back({&k, true});
    }
  }
  if (!fds.empty())
    ::poll(fds.data(), fds.size(), 100);
  else
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    if (!owners[i].first)
      on_extra();
    else
      on_pipe(*owners[i].first, owners[i].second);
  }
}

// Reads what a child's pipe `fd` has into `buf` and hands each whole line
// (without its newline) to emit(std::string_view); at the end of the pipe
// (fd is then closed and set to -1), or with flush_all, the unfinished rest
// too.
template <typename Emit>
void pump_lines(int &fd, std::string &buf, bool flush_all, Emit emit) {
  if (fd >= 0) {
    char tmp[65536];
    ssize_t n = ::read(fd, tmp, sizeof tmp);
    if (n > 0) {
      buf.append(tmp, static_cast<size_t>(n));
    } else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
      ::close(fd);
      fd = -1;
      flush_all = true;
    }
  }
  size_t start = 0;
  for (size_t nl; (nl = buf.find('\n', start)) != std::string::npos; start = nl + 1)
    emit(std::string_view(buf).substr(start, nl - start));
  buf.erase(0, start);
  if (flush_all && !buf.empty()) {
    emit(std::string_view(buf));
    buf.clear();
  }
}

}  // namespace tessera

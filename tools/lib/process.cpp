#include "process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string_view>

extern char** environ;

namespace deepio::cli {

namespace {

/// Two pipes (stdout, stderr); both ends O_CLOEXEC, closed by the destructor.
struct Pipes {
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  ~Pipes() {
    for (int fd : {out[0], out[1], err[0], err[1]}) {
      if (fd >= 0) ::close(fd);
    }
  }
  bool open() { return ::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0; }
  static void close_fd(int& fd) {
    ::close(fd);
    fd = -1;
  }
};

/// posix_spawnp with the child's stdout/stderr on the pipes' write ends; returns 0 or errno.
int spawn(const std::vector<std::string>& argv, const Pipes& p, pid_t& pid) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  if (int e = ::posix_spawn_file_actions_init(&actions); e != 0) return e;
  int e = ::posix_spawn_file_actions_adddup2(&actions, p.out[1], STDOUT_FILENO);
  if (e == 0) e = ::posix_spawn_file_actions_adddup2(&actions, p.err[1], STDERR_FILENO);
  if (e == 0) e = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  return e;
}

/// Reads both pipes until the child closes them.
void drain(Pipes& p, std::string& out, std::string& err) {
  pollfd fds[2] = {{p.out[0], POLLIN, 0}, {p.err[0], POLLIN, 0}};
  std::string* sinks[2] = {&out, &err};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int k = 0; k < 2; ++k) {
      if (fds[k].fd < 0 || fds[k].revents == 0) continue;
      const ssize_t n = ::read(fds[k].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[k]->append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        fds[k].fd = -1;  // the Pipes destructor closes it
        --open_fds;
      }
    }
  }
}

int wait_status(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv) {
  ProcessResult r;
  if (argv.empty()) {
    r.spawn_errno = EINVAL;
    return r;
  }
  Pipes p;
  if (!p.open()) {
    r.spawn_errno = errno;
    return r;
  }
  pid_t pid = -1;
  if (const int e = spawn(argv, p, pid); e != 0) {
    r.spawn_errno = e;
    return r;
  }
  Pipes::close_fd(p.out[1]);  // the child holds the write ends now
  Pipes::close_fd(p.err[1]);
  drain(p, r.out, r.err);
  r.status = wait_status(pid);
  return r;
}

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return {};
  std::string_view rest(path);
  while (!rest.empty()) {
    const auto colon = rest.find(':');
    const std::string_view dir = rest.substr(0, colon);
    rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
    // Built by appending: GCC 12 warns (-Wrestrict, a false positive) on `dir = "."`.
    std::string cand(dir.empty() ? std::string_view(".") : dir);
    cand += '/';
    cand += name;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
  }
  return {};
}

}  // namespace deepio::cli

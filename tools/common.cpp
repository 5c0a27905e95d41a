#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cli_util.hpp"
#include "commands.hpp"

namespace deepio::cli {

std::string pick_disk_folder(std::string* why) {
  std::vector<std::string> candidates;
  for (const char* var : {"DEEPIO_BENCH_DIR", "TMPDIR"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') candidates.emplace_back(v);
  }
  candidates.insert(candidates.end(), {"/var/tmp", "/tmp", "."});
  std::string rejected;
  for (const auto& c : candidates) {
    std::string problem = folder_problem(c);
    if (problem.empty() && is_memory_filesystem(c)) problem = c + " is " + filesystem_of(c) + " (in memory)";
    if (problem.empty()) return c;
    rejected += (rejected.empty() ? "" : "; ") + problem;
  }
  if (why != nullptr) *why = rejected;
  return {};
}

// ---- temporary files, removed on every way out -------------------------------------------
// The signal handler may only call async-signal-safe functions, so the paths live in fixed
// arrays written before any I/O starts.

namespace {
constexpr int kMaxTemp = 64;
char g_temp_files[kMaxTemp][1024];
volatile sig_atomic_t g_temp_count = 0;
constexpr int kMaxDirs = 16;
char g_temp_dirs[kMaxDirs][1024];
volatile sig_atomic_t g_dir_count = 0;
bool g_handlers_installed = false;

void remove_all() noexcept {
  for (int i = 0; i < g_temp_count; ++i) ::unlink(g_temp_files[i]);
  for (int i = 0; i < g_dir_count; ++i) ::rmdir(g_temp_dirs[i]);
}

extern "C" void on_signal(int sig) {
  remove_all();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}
}  // namespace

std::string make_temp_dir(const std::string& parent, const std::string& tag) {
  std::string tmpl = parent + "/deepio-" + tag + "-XXXXXX";
  if (tmpl.size() >= sizeof g_temp_dirs[0] - 64) throw std::runtime_error("folder path too long: " + parent);
  if (g_dir_count >= kMaxDirs) throw std::runtime_error("too many folders (at most 16)");
  if (::mkdtemp(tmpl.data()) == nullptr) {
    throw std::runtime_error("cannot create a folder in " + parent + ": " + std::strerror(errno));
  }
  std::snprintf(g_temp_dirs[g_dir_count], sizeof g_temp_dirs[0], "%s", tmpl.c_str());
  g_dir_count = g_dir_count + 1;
  if (!g_handlers_installed) {
    g_handlers_installed = true;
    std::atexit(remove_all);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  }
  return tmpl;
}

void register_temp_file(const std::string& path) {
  if (g_temp_count >= kMaxTemp || path.size() >= sizeof g_temp_files[0]) return;
  std::snprintf(g_temp_files[g_temp_count], sizeof g_temp_files[0], "%s", path.c_str());
  g_temp_count = g_temp_count + 1;
}

void remove_temp_dir() {
  remove_all();
  g_temp_count = 0;
  g_dir_count = 0;
}

// ---- progress ----------------------------------------------------------------------------

Progress::Progress(std::size_t total, bool enabled) : total_(total), enabled_(enabled && stderr_is_tty()) {}

Progress::~Progress() { done(); }

void Progress::step(const std::string& what) {
  ++current_;
  if (!enabled_) return;
  constexpr std::size_t kWidth = 24;
  const std::size_t filled = total_ ? std::min(kWidth, current_ * kWidth / total_) : kWidth;
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r\033[K[%s] %zu/%zu %s", bar.c_str(), current_, total_, what.c_str());
  std::fflush(stderr);
}

void Progress::done() {
  if (!enabled_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  enabled_ = false;
}

}  // namespace deepio::cli

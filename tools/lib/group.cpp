#include "group.hpp"

#include <dlfcn.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

#include "mpi_plugin.hpp"

namespace deepio::cli {

Launch detect_launch() {
  Launch l;
  static constexpr const char* kSizeVars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"};
  for (const char* var : kSizeVars) {
    const char* v = std::getenv(var);
    if (v == nullptr) continue;
    // SLURM_NTASKS alone only says we are inside an allocation; require a PMI rank too.
    if (std::strcmp(var, "SLURM_NTASKS") == 0 && std::getenv("PMI_RANK") == nullptr &&
        std::getenv("PMIX_RANK") == nullptr) {
      continue;
    }
    l.world_size = std::atoi(v);
    l.launcher = var;
    break;
  }
  if (l.launcher.empty() && std::getenv("PMIX_RANK") != nullptr) {
    l.launcher = "PMIX_RANK";
    l.world_size = 0;  // unknown until MPI_Init
  }
  l.mpi = !l.launcher.empty() && l.world_size != 1;
  return l;
}

// ---- local processes ---------------------------------------------------------------------

namespace {

struct SharedState {
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  int n;
  int waiting;
  unsigned generation;
  int aborted;
  ProcReport reports[1];  // n of them (flexible tail)
};

class LocalGroup final : public Group {
 public:
  LocalGroup(SharedState* s, int rank) : s_(s), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_ != nullptr ? s_->n : 1; }
  bool barrier() override {
    if (s_ == nullptr) return true;
    pthread_mutex_lock(&s_->mutex);
    const unsigned gen = s_->generation;
    if (!s_->aborted && ++s_->waiting == s_->n) {
      s_->waiting = 0;
      ++s_->generation;
      pthread_cond_broadcast(&s_->cond);
    } else {
      while (s_->generation == gen && !s_->aborted) pthread_cond_wait(&s_->cond, &s_->mutex);
    }
    const bool ok = !s_->aborted;
    pthread_mutex_unlock(&s_->mutex);
    return ok;
  }
  void abort() override {
    if (s_ == nullptr) return;
    pthread_mutex_lock(&s_->mutex);
    s_->aborted = 1;
    pthread_cond_broadcast(&s_->cond);
    pthread_mutex_unlock(&s_->mutex);
  }

 private:
  SharedState* s_;
  int rank_;
};

ProcReport run_guarded(const std::function<ProcReport(Group&)>& body, Group& g) {
  ProcReport r;
  try {
    r = body(g);
  } catch (const std::exception& e) {
    r.failed = 1;
    std::snprintf(r.error, sizeof r.error, "%s", e.what());
  }
  if (r.failed) g.abort();
  return r;
}

}  // namespace

namespace {

/// An anonymous shared mapping with a process-shared mutex and condition variable and n
/// empty report slots; unmapped by the destructor.
class SharedMapping {
 public:
  explicit SharedMapping(int n) : bytes_(sizeof(SharedState) + sizeof(ProcReport) * static_cast<std::size_t>(n)) {
    mem_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem_ == MAP_FAILED) throw std::runtime_error(std::string("cannot map shared memory: ") + std::strerror(errno));
    state_ = new (mem_) SharedState{};
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&state_->mutex, &ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_cond_init(&state_->cond, &ca);
    state_->n = n;
    for (int i = 0; i < n; ++i) new (&state_->reports[i]) ProcReport{};
  }
  ~SharedMapping() {
    pthread_cond_destroy(&state_->cond);
    pthread_mutex_destroy(&state_->mutex);
    ::munmap(mem_, bytes_);
  }
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  [[nodiscard]] SharedState* state() const { return state_; }

 private:
  std::size_t bytes_;
  void* mem_ = nullptr;
  SharedState* state_ = nullptr;
};

/// Forks one worker per rank; a worker runs `body`, stores its report and exits. Returns the
/// pids (-1 for ranks not started: a failed fork aborts the run and stops forking).
std::vector<pid_t> fork_workers(SharedState* s, const std::function<ProcReport(Group&)>& body) {
  const int n = s->n;
  std::fflush(nullptr);  // children must not re-flush the parent's buffered output
  std::vector<pid_t> pids(static_cast<std::size_t>(n), -1);
  LocalGroup parent_view(s, -1);
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      LocalGroup g(s, i);
      s->reports[i] = run_guarded(body, g);
      std::fflush(nullptr);
      _exit(s->reports[i].failed ? 1 : 0);
    }
    if (pid < 0) {
      std::snprintf(s->reports[i].error, sizeof s->reports[i].error, "fork failed: %s", std::strerror(errno));
      s->reports[i].failed = 1;
      parent_view.abort();
      break;
    }
    pids[static_cast<std::size_t>(i)] = pid;
  }
  return pids;
}

/// Reaps the workers in the order they end, so a crash aborts the barrier its peers wait in;
/// a worker that died or failed without saying why gets a report saying how it ended.
void reap_workers(SharedState* s, const std::vector<pid_t>& pids) {
  LocalGroup parent_view(s, -1);
  int alive = 0;
  for (pid_t p : pids) alive += p > 0 ? 1 : 0;
  while (alive > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    int i = 0;
    while (i < s->n && pids[static_cast<std::size_t>(i)] != pid) ++i;
    if (i == s->n) continue;
    --alive;
    ProcReport& r = s->reports[i];
    if (WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0 && !r.failed)) {
      r.failed = 1;
      std::snprintf(r.error, sizeof r.error, "process %d %s %d", i,
                    WIFSIGNALED(status) ? "was killed by signal" : "exited with status",
                    WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    }
    if (r.failed) parent_view.abort();
  }
}

}  // namespace

std::vector<ProcReport> run_local(int n, const std::function<ProcReport(Group&)>& body) {
  if (n <= 1) {
    LocalGroup g(nullptr, 0);
    return {run_guarded(body, g)};
  }
  SharedMapping shared(n);
  SharedState* s = shared.state();
  reap_workers(s, fork_workers(s, body));
  return std::vector<ProcReport>(s->reports, s->reports + n);
}

// ---- MPI ---------------------------------------------------------------------------------

namespace {

std::string self_dir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<std::size_t>(n));
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

std::vector<std::string> plugin_candidates() {
  std::vector<std::string> c;
  if (const char* e = std::getenv("DEEPIO_CLI_MPI_PLUGIN")) c.emplace_back(e);
  const std::string dir = self_dir();
  c.push_back(dir + "/libdeepio_cli_mpi.so");
  c.push_back(dir + "/../lib/libdeepio_cli_mpi.so");
  c.push_back(dir + "/../lib/deepio/libdeepio_cli_mpi.so");
  return c;
}

const deepio_cli_mpi_api* load_plugin(std::string& why) {
  for (const auto& path : plugin_candidates()) {
    if (::access(path.c_str(), R_OK) != 0) continue;
    // RTLD_GLOBAL: Open MPI loads its own components with dlopen and needs libmpi's symbols.
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) {
      const char* e = ::dlerror();
      why = e ? e : path + ": dlopen failed";
      continue;
    }
    auto entry = reinterpret_cast<deepio_cli_mpi_entry>(::dlsym(h, DEEPIO_CLI_MPI_SYMBOL));
    const deepio_cli_mpi_api* api = entry ? entry() : nullptr;
    if (api == nullptr || api->abi != DEEPIO_CLI_MPI_ABI) {
      why = path + ": not a compatible deepio MPI plugin";
      continue;
    }
    return api;  // never dlclose()d: MPI must stay loaded until exit
  }
  if (why.empty()) why = "libdeepio_cli_mpi.so not found next to the deepio executable (built without MPI?)";
  return nullptr;
}

class MpiGroup final : public Group {
 public:
  explicit MpiGroup(const deepio_cli_mpi_api* api) : api_(api), rank_(api->rank()), size_(api->size()) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool barrier() override { return api_->barrier() == 0; }
  void abort() override { failed_ = true; }
  [[nodiscard]] bool failed() const { return failed_; }

 private:
  const deepio_cli_mpi_api* api_;
  int rank_, size_;
  bool failed_ = false;
};

}  // namespace

std::string mpi_plugin_status() {
  std::string why;
  const deepio_cli_mpi_api* api = load_plugin(why);
  return api != nullptr ? "plugin found (libdeepio_cli_mpi.so)" : why;
}

MpiRun run_mpi(int* argc, char*** argv, const std::function<ProcReport(Group&)>& body) {
  std::string why;
  const deepio_cli_mpi_api* api = load_plugin(why);
  if (api == nullptr) throw std::runtime_error("started by an MPI launcher but MPI support is missing: " + why);
  if (api->init(argc, argv) != 0) throw std::runtime_error("MPI_Init_thread failed");
  MpiGroup g(api);
  MpiRun run;
  run.rank = g.rank();
  run.size = g.size();
  run.library = api->library_version();
  ProcReport mine = run_guarded(body, g);
  if (mine.failed) {
    // The other ranks may be waiting in a barrier: MPI has no way to abort one, so end all.
    std::fprintf(stderr, "deepio bench: error: rank %d: %s\n", run.rank, mine.error);
    std::fflush(stderr);
    api->abort_all(1);
  }
  std::vector<ProcReport> all(static_cast<std::size_t>(run.rank == 0 ? run.size : 1));
  if (api->gather(&mine, sizeof mine, all.data()) != 0) throw std::runtime_error("MPI_Gather failed");
  if (run.rank == 0) run.reports = std::move(all);
  api->finalize();
  return run;
}

}  // namespace deepio::cli

// libdeepio_cli_mpi.so: the MPI calls `deepio bench` makes under mpirun, behind a C ABI so
// the executable itself never links MPI (see lib/group.hpp). Built only when CMake finds MPI.
// The C API only: Open MPI's and MPICH's deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <climits>
#include <cstring>

#include "mpi_plugin.hpp"

namespace {

int init(int* argc, char*** argv) {
  int provided = 0;
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return 0;
  return MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS ? 0 : 1;
}
int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
int barrier() { return MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS ? 0 : 1; }
int gather(const void* send, std::size_t n, void* recv) {
  if (n > static_cast<std::size_t>(INT_MAX)) return 1;
  return MPI_Gather(send, static_cast<int>(n), MPI_BYTE, recv, static_cast<int>(n), MPI_BYTE, 0, MPI_COMM_WORLD) ==
                 MPI_SUCCESS
             ? 0
             : 1;
}
void abort_all(int code) { MPI_Abort(MPI_COMM_WORLD, code); }
int finalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized ? 0 : (MPI_Finalize() == MPI_SUCCESS ? 0 : 1);
}
const char* library_version() {
  static char buf[MPI_MAX_LIBRARY_VERSION_STRING + 1];
  int len = 0;
  MPI_Get_library_version(buf, &len);
  buf[len < 0 ? 0 : len] = '\0';
  if (char* nl = std::strchr(buf, '\n')) *nl = '\0';
  if (char* comma = std::strchr(buf, ',')) *comma = '\0';
  return buf;
}

const deepio_cli_mpi_api kApi = {DEEPIO_CLI_MPI_ABI, init,     rank,           size, barrier, gather,
                                 abort_all,          finalize, library_version};

}  // namespace

extern "C" __attribute__((visibility("default"))) const deepio_cli_mpi_api* deepio_cli_mpi_api_v1() { return &kApi; }

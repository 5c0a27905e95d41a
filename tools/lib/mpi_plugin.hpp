// The C ABI between the `deepio` executable and libdeepio_cli_mpi.so (tools/mpi_plugin.cpp).
// The executable never links MPI; it dlopen()s the plugin only when an MPI launcher started it.
#pragma once

#include <cstddef>

extern "C" {

struct deepio_cli_mpi_api {
  int abi;  ///< DEEPIO_CLI_MPI_ABI
  /// MPI_Init_thread(FUNNELED); returns 0 on success.
  int (*init)(int* argc, char*** argv);
  int (*rank)(void);
  int (*size)(void);
  /// MPI_Barrier(COMM_WORLD); returns 0 on success.
  int (*barrier)(void);
  /// MPI_Gather of n bytes from every rank into recv (n * size bytes, rank 0 only).
  int (*gather)(const void* send, std::size_t n, void* recv);
  /// MPI_Abort(COMM_WORLD, code): ends every rank.
  void (*abort_all)(int code);
  int (*finalize)(void);
  /// MPI_Get_library_version, first line.
  const char* (*library_version)(void);
};

#define DEEPIO_CLI_MPI_ABI 1
#define DEEPIO_CLI_MPI_SYMBOL "deepio_cli_mpi_api_v1"
typedef const deepio_cli_mpi_api* (*deepio_cli_mpi_entry)(void);
}

# Cross-compiling deepio for aarch64 (Grace) on an x86-64 Debian 12 machine (issue 49), with
# Debian's cross compiler (g++-aarch64-linux-gnu) and an arm64 sysroot unpacked from Debian's arm64
# packages (scripts/aarch64-sysroot.sh: glibc, liburing, libaio, GoogleTest, Google Benchmark,
# Open MPI). scripts/cross-aarch64.sh makes both and builds every target with it:
#
#   cmake -B build/aarch64/cmake -G Ninja --toolchain cmake/aarch64-linux-gnu.cmake \
#         [-DDEEPIO_AARCH64_SYSROOT=DIR]        (default build/aarch64/sysroot)
#
# Test programs run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR), so ctest and GoogleTest's
# discovery work too where the emulator allows what a test does.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

if(NOT DEEPIO_AARCH64_SYSROOT)
  get_filename_component(DEEPIO_AARCH64_SYSROOT "${CMAKE_CURRENT_LIST_DIR}/../build/aarch64/sysroot" ABSOLUTE)
endif()
if(NOT EXISTS "${DEEPIO_AARCH64_SYSROOT}/usr/include/aarch64-linux-gnu")
  message(FATAL_ERROR "deepio: no arm64 sysroot at ${DEEPIO_AARCH64_SYSROOT} (bash scripts/aarch64-sysroot.sh)")
endif()
# try_compile projects read this file again: they get the same sysroot.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES DEEPIO_AARCH64_SYSROOT)
set(CMAKE_SYSROOT "${DEEPIO_AARCH64_SYSROOT}")
# Headers, libraries and CMake packages from the sysroot only; programs (pkg-config, python3,
# mpiexec for the test definitions) are this machine's.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${CMAKE_SYSROOT}")
set(ENV{PKG_CONFIG_LIBDIR} "${CMAKE_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${CMAKE_SYSROOT}/usr/share/pkgconfig")
# Open MPI's compiler wrappers here are x86-64's: FindMPI takes the arm64 headers and library.
set(MPI_SKIP_COMPILER_WRAPPER ON)
set(MPI_C_HEADER_DIR "${CMAKE_SYSROOT}/usr/lib/aarch64-linux-gnu/openmpi/include" CACHE PATH "")
set(MPI_C_LIB_NAMES mpi CACHE STRING "")
set(MPI_mpi_LIBRARY "${CMAKE_SYSROOT}/usr/lib/aarch64-linux-gnu/openmpi/lib/libmpi.so" CACHE FILEPATH "")
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -cpu max -L "${CMAKE_SYSROOT}")

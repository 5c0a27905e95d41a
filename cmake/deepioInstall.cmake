# install(): deepio's C++ package, for find_package(deepio) (examples/downstream shows the use).
#   <prefix>/include/deepio/*.hpp                    the public API (comm.hpp only with comm)
#   <prefix>/lib/libdeepio.so* (or libdeepio.a)       deepio::deepio
#   <prefix>/lib/libdeepio_comm.a                     deepio::comm, when MPI was found
#   <prefix>/lib/cmake/deepio/deepioConfig.cmake ...  the package: targets, version, dependencies
# Nothing of src/ is installed: the internals are compiled into the library and hidden there.
include(CMakePackageConfigHelpers)
set(DEEPIO_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/deepio)

install(TARGETS deepio EXPORT deepioTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# comm.hpp includes <mpi.h> and declares what only libdeepio_comm defines: installed with comm.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/deepio DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp" PATTERN "comm.hpp" EXCLUDE)
install(EXPORT deepioTargets NAMESPACE deepio:: DESTINATION ${DEEPIO_INSTALL_CMAKEDIR})

# deepio::comm in its own export set, so that the package stays usable without MPI for users
# who do not ask for the comm component (deepioConfig.cmake loads it only when MPI is found).
set(DEEPIO_HAVE_COMM OFF)
if(TARGET deepio_comm)
  set(DEEPIO_HAVE_COMM ON)
  set_target_properties(deepio_comm PROPERTIES EXPORT_NAME comm)
  install(TARGETS deepio_comm EXPORT deepioCommTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(FILES ${PROJECT_SOURCE_DIR}/include/deepio/comm.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/deepio)
  install(EXPORT deepioCommTargets NAMESPACE deepio:: DESTINATION ${DEEPIO_INSTALL_CMAKEDIR})
else()
  message(STATUS "deepio: C++ package without deepio::comm and <deepio/comm.hpp>: comm not built")
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/deepioConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cmake/deepioConfig.cmake
                              INSTALL_DESTINATION ${DEEPIO_INSTALL_CMAKEDIR})
# 0.x: a new minor version may change the API, so only the same MAJOR.MINOR satisfies a request.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/deepioConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/deepioConfig.cmake ${PROJECT_BINARY_DIR}/cmake/deepioConfigVersion.cmake
        DESTINATION ${DEEPIO_INSTALL_CMAKEDIR})

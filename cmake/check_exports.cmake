# cmake -DLIBRARY=<libdeepio.so> [-DNM=nm] -P check_exports.cmake
# Fails unless the shared library exports the public API (a function, a class's members, the
# exception's typeinfo, which `catch (const deepio::Error&)` in a user's program needs) and
# nothing of the internals (namespace deepio::detail, compiled with hidden visibility).
if(NOT LIBRARY)
  message(FATAL_ERROR "check_exports: pass -DLIBRARY=<path of libdeepio.so>")
endif()
if(NOT NM)
  set(NM nm)
endif()
execute_process(COMMAND ${NM} -D -C --defined-only ${LIBRARY} OUTPUT_VARIABLE symbols
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_exports: ${NM} failed on ${LIBRARY}: ${err}")
endif()
string(REPLACE "\n" ";" lines "${symbols}")
set(internal "")
set(public 0)
foreach(line IN LISTS lines)
  # "<address> <type> <name>": the name starts after the second space.
  string(REGEX REPLACE "^[0-9a-fA-F]+ [A-Za-z] " "" name "${line}")
  if(name MATCHES "^deepio::detail::" OR name MATCHES "^(typeinfo|typeinfo name|vtable) for deepio::detail::")
    list(APPEND internal "${name}")
  elseif(name MATCHES "^deepio::")
    math(EXPR public "${public} + 1")
  endif()
endforeach()
foreach(required "deepio::version()" "deepio::Handle::Handle(deepio::HandleOptions const&)"
                 "deepio::Handle::wait()" "deepio::Error::Error(" "typeinfo for deepio::Error"
                 "typeinfo for deepio::InvalidArgument" "deepio::allocate_locked(unsigned long)")
  string(FIND "${symbols}" "${required}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "check_exports: ${LIBRARY} does not export ${required}")
  endif()
endforeach()
list(LENGTH internal n_internal)
if(n_internal GREATER 0)
  list(JOIN internal "\n  " shown)
  message(FATAL_ERROR "check_exports: ${LIBRARY} exports ${n_internal} internal symbols:\n  ${shown}")
endif()
message(STATUS "check_exports: ${LIBRARY} exports ${public} deepio:: symbols, none of deepio::detail")

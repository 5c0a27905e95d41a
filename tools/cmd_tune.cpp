#include <cstdio>

#include "commands.hpp"

namespace deepio::cli {
int cmd_tune(int, char**) {
  std::fprintf(stderr, "deepio tune: error: not implemented yet\n");
  return 1;
}
}  // namespace deepio::cli

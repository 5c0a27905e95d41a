// deepio::comm from an installed deepio, without starting MPI: the sign packing round trip
// and an argument error that must be caught as deepio::InvalidArgument (thrown by the static
// comm library, typeinfo from libdeepio). Exit status 0 only when both hold.
#include <deepio/comm.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
  const std::vector<float> x = {1.0f, -2.0f, 0.0f, -0.5f, 3.0f, -1.0f, 2.0f, -4.0f, 5.0f};
  std::vector<std::uint8_t> packed(2);
  deepio::comm::pack_signs(x, packed);
  if (packed[0] != 0xAA || packed[1] != 0x80) {
    std::fprintf(stderr, "deepio_downstream_comm: packed signs %02x %02x, expected aa 80\n", packed[0], packed[1]);
    return 1;
  }
  try {
    std::vector<std::uint8_t> too_small(1);
    deepio::comm::pack_signs(x, too_small);
    std::fprintf(stderr, "deepio_downstream_comm: a too small output did not throw\n");
    return 1;
  } catch (const deepio::InvalidArgument&) {
  }
  std::printf("deepio::comm: padded_size(9, 2) = %zu: OK\n", deepio::comm::padded_size(9, 2));
  return 0;
}

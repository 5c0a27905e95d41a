// Internal aligned host allocation (bounce and staging buffers). Not registered as locked.
#pragma once

#include <cstddef>

namespace deepio::detail {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  /// Throws deepio::Error(ENOMEM) on failure. alignment must be a power of two.
  AlignedBuffer(std::size_t nbytes, std::size_t alignment);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace deepio::detail

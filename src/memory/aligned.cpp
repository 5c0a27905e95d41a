#include "memory/aligned.hpp"

#include <cerrno>
#include <cstdlib>
#include <utility>

#include "platform/status.hpp"

namespace deepio::detail {

AlignedBuffer::AlignedBuffer(std::size_t nbytes, std::size_t alignment) : size_(nbytes) {
  void* p = nullptr;
  const int rc = ::posix_memalign(&p, alignment, nbytes == 0 ? alignment : nbytes);
  if (rc != 0) throw_error(rc, "cannot allocate an aligned buffer", {}, 0, nbytes);
  data_ = static_cast<std::byte*>(p);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace deepio::detail

#pragma once
#include <memory>
#include "core/backend.hpp"
namespace deepio::detail {
std::unique_ptr<Backend> make_threads_backend(std::size_t queue_depth);
}

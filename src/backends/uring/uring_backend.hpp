#pragma once
#include <memory>
#include "core/backend.hpp"
#include "platform/status.hpp"
namespace deepio::detail {
std::unique_ptr<Backend> make_uring_backend(std::size_t queue_depth, bool single_submit, Status* why);
}

// GdsHandle over given CUDA and cuFile drivers (the process-wide ones, or fakes loaded by
// tests): the engine with a GdsRoute (src/backends/gds/gds_route.hpp).
#pragma once

#include <memory>

#include "deepio/gpu.hpp"
#include "gpu/cuda.hpp"
#include "gpu/cufile.hpp"
#include "platform/status.hpp"

namespace deepio::detail::gpu {

struct GdsParts {
  std::unique_ptr<Engine> engine;
  std::shared_ptr<GdsRoute> route;
};

/// What a GdsHandle is made of: the route, and the engine it is part of.
/// cuda_api null -> throws deepio::Error(cuda_why.errnum or ENOTSUP) with cuda_why's message.
/// cufile_api may be null (cufile_why says why): Auto and Compat then stage through host
/// memory, CuFile throws ENOTSUP. Options are validated as Handle's (EINVAL).
GdsParts make_gds_parts(const GdsOptions& options, const CudaApi* cuda_api, const Status& cuda_why,
                        CuFileApi* cufile_api, const Status& cufile_why);

/// A GdsHandle over make_gds_parts().
GdsHandle make_gds_handle(const GdsOptions& options, const CudaApi* cuda_api, const Status& cuda_why,
                          CuFileApi* cufile_api, const Status& cufile_why);

}  // namespace deepio::detail::gpu

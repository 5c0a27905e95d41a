// Everything of deepio's public C++ I/O API in one include.
#pragma once

#include "deepio/capabilities.hpp"
#include "deepio/error.hpp"
#include "deepio/handle.hpp"
#include "deepio/memory.hpp"
#include "deepio/options.hpp"
#include "deepio/version.hpp"

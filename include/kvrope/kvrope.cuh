// kvrope: fused KV-cache + RoPE kernels. The umbrella header: every public header.
#pragma once

#include "append.cuh"             // IWYU pragma: export
#include "append_params.cuh"      // IWYU pragma: export
#include "backward.cuh"           // IWYU pragma: export
#include "backward_params.cuh"    // IWYU pragma: export
#include "core/dispatch.cuh"      // IWYU pragma: export
#include "core/dtype.cuh"         // IWYU pragma: export
#include "core/rotary.cuh"        // IWYU pragma: export
#include "core/status.cuh"        // IWYU pragma: export
#include "core/tensor.cuh"        // IWYU pragma: export
#include "core/vec.cuh"           // IWYU pragma: export
#include "error_flag.cuh"         // IWYU pragma: export
#include "forward.cuh"            // IWYU pragma: export
#include "forward_params.cuh"     // IWYU pragma: export
#include "mla_append.cuh"         // IWYU pragma: export
#include "mla_append_params.cuh"  // IWYU pragma: export
#include "rope.cuh"               // IWYU pragma: export

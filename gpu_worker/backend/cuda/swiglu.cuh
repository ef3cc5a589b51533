// SwiGLU pieces shared by the SiluMul kernel and DecodeGemm's fused epilogue, so both compute the
// same expression and store the same bits. Device code only (.cu files).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cascade::cuda::internal {

// Rows of the fused gate_up weight (and so columns of its GEMM output) interleave the two
// projections in blocks of 8: gate rows 8b..8b+7, then up rows 8b..8b+7, for b = 0, 1, ... A
// DecodeGemm CTA of 16 or 32 rows then holds both halves of 8 or 16 intermediate features.
constexpr int kGateUpBlock = 8;
// Column of gate feature c in a gate_up output row (up feature c: + kGateUpBlock).
__host__ __device__ __forceinline__ int64_t GateCol(int64_t c) {
  return c / kGateUpBlock * (2 * kGateUpBlock) + c % kGateUpBlock;
}

// silu(g) * u, g and u the bf16 GEMM outputs as floats.
__device__ __forceinline__ float SiluTimes(float g, float u) { return g / (1.f + expf(-g)) * u; }

}  // namespace cascade::cuda::internal

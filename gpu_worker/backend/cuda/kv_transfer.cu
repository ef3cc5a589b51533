// Whole-block KV copies between the paged cache and a dense staging buffer, the device half of
// the host KV tier: one launch moves up to kMaxKvBlocksPerCopy blocks of every layer, so a
// transfer to or from host memory is a few large DMA copies instead of one per (block, layer).
#include <cuda_runtime.h>

#include "gpu_worker/backend/cuda/launchers.h"

namespace cascade::cuda::internal {
namespace {

// CTA (p, b) copies part p (layer l's K or V) of list entry b, 16 bytes per thread per pass.
__global__ void KvBlockCopyKernel(uint4* const* parts, int num_parts, KvBlockList blocks,
                                  int64_t part_units, uint4* stage, bool to_stage) {
  const int p = blockIdx.x, b = blockIdx.y;
  uint4* cache = parts[p] + static_cast<int64_t>(blocks.ids[b]) * part_units;
  uint4* dense = stage + (static_cast<int64_t>(b) * num_parts + p) * part_units;
  for (int64_t i = threadIdx.x; i < part_units; i += blockDim.x) {
    if (to_stage) {
      dense[i] = cache[i];
    } else {
      cache[i] = dense[i];
    }
  }
}

}  // namespace

cudaError_t LaunchKvBlockCopy(void* const* parts, int num_parts, const KvBlockList& blocks, int n,
                              int64_t part_bytes, void* stage, bool to_stage, cudaStream_t stream) {
  const dim3 grid(num_parts, n);
  KvBlockCopyKernel<<<grid, 256, 0, stream>>>(reinterpret_cast<uint4* const*>(parts), num_parts,
                                              blocks, part_bytes / 16, static_cast<uint4*>(stage),
                                              to_stage);
  return cudaGetLastError();
}

}  // namespace cascade::cuda::internal

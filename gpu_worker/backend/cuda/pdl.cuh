// Programmatic dependent launch (Hopper): every kernel of this library is launched with
// programmatic stream serialization, so its CTAs may be scheduled while the previous kernel in
// the stream drains, and its first statement waits (griddepcontrol.wait) until that kernel has
// completed and its writes are visible. Nothing runs earlier than before except the launch itself,
// so results do not change; the launch latency between dependent kernels (a few us each, ~280
// kernels in a decode step) overlaps the previous kernel's tail. Device code only (.cu files).
#pragma once

#include <cuda_runtime.h>

namespace cascade::cuda::internal {

// Process-wide switch (SetProgrammaticLaunch in ops.h); on by default.
bool ProgrammaticLaunchEnabled();

// First statement of every kernel (or, in a thread, its first statement after reading only what
// no kernel writes: ops.h): wait for the grids this one depends on, then let the next kernel in
// the stream be scheduled (it waits for this one the same way before it touches memory), so its
// launch overlaps this kernel's run rather than following its end. The persistent attention
// kernels (PrefillWsKernel, DecodeWsKernel) read their first work's fields, rows, positions and
// cache rows before it: those round trips overlap the previous kernel's tail. The CTA's first
// launch_dependents by any of its threads is the CTA's (PTX ISA: later ones have no effect), and
// the next kernel launches once every CTA has issued one or exited; since each thread issues it
// only after its own wait, "the previous grid had completed when this one let the next launch"
// holds however late other warps of the CTA wait.
__device__ __forceinline__ void WaitForPriorGrids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The two halves of WaitForPriorGrids for a kernel that reads nothing the kernel before it
// writes (only what kernels before that one wrote, which had completed when that one let this one
// launch): LetDependentsLaunch first, so the next kernel can be scheduled, and WaitForPriorGrid as
// the last statement, so this grid completes only after the one before it: a kernel that waits for
// this one (griddepcontrol.wait) then also waits for that one.
__device__ __forceinline__ void LetDependentsLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void WaitForPriorGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic serialization attribute.
template <typename... KArgs, typename... Args>
cudaError_t LaunchKernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = ProgrammaticLaunchEnabled() ? 1 : 0;
  cudaError_t err = cudaLaunchKernelEx(&config, kernel, static_cast<KArgs>(args)...);
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace cascade::cuda::internal

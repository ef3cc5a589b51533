// Hopper warpgroup MMA (wgmma, sm_90a only): shared-memory matrix descriptors for the 128-byte
// swizzled layout and the two instruction shapes the prefill attention kernel uses.
//
// Layout (both operands, bf16): a tile of R rows x 128 columns is two column halves of 64
// elements (128 bytes per row); half h, row r, 16-byte chunk c (0..7) lies at byte
//   h * R * 128 + (r / 8) * 1024 + (r % 8) * 128 + ((c ^ (r % 8)) * 16)
// (SwizzleOffset), every 1024-byte atom 1024-byte aligned. Read as a K-major operand (rows = M or
// N, columns = K) the stride between 8-row groups is 1024 bytes and a k16 step inside a half
// moves the start address by 32 bytes; read as an MN-major operand (V: rows = K = keys, columns =
// N = head dim) the stride between 8-key groups is 1024 bytes and between column halves R * 128.
//
// Accumulator and register-A layouts are those of mma.sync m16n8k16, per warp of the warpgroup
// (warp w owns rows 16 w .. 16 w + 15): d[4 n + 0..1] = row g, columns 8 n + 2 t4 + 0..1;
// d[4 n + 2..3] = row g + 8, same columns.
#pragma once

#include <cstdint>

namespace cascade::cuda::internal {

__device__ __forceinline__ int SwizzleOffset(int rows, int r, int chunk16) {
  const int h = chunk16 >> 3, c = chunk16 & 7;
  return h * rows * 128 + (r >> 3) * 1024 + (r & 7) * 128 + ((c ^ (r & 7)) << 4);
}

// Descriptor of a 128-byte swizzled operand starting at `smem` (a shared-memory address).
__device__ __forceinline__ uint64_t WgmmaDesc(uint32_t smem, uint32_t lbo_bytes,
                                              uint32_t sbo_bytes) {
  uint64_t d = (smem & 0x3FFFFu) >> 4;
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32;
  d |= static_cast<uint64_t>(1) << 62;  // 128-byte swizzle
  return d;
}

// The descriptor d with its start address moved by `bytes` (a multiple of 16; the address stays
// inside shared memory, so its 14-bit field never carries into the next): a 32-bit add on the
// low word, the high word (the stride and swizzle fields) left as it is. A 64-bit add costs two
// instructions and makes both words vary, so each MMA then moves both into uniform registers.
__device__ __forceinline__ uint64_t WgmmaDescAdd(uint64_t d, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(d) + (bytes >> 4);
  const uint32_t hi = static_cast<uint32_t>(d >> 32);
  uint64_t r;
  asm("mov.b64 %0, {%1, %2};" : "=l"(r) : "r"(lo), "r"(hi));
  return r;
}

// mbarrier (shared-memory barrier object, 8 bytes) and the bulk tensor copy (TMA) that completes
// on one. Addresses are shared-memory addresses (__cvta_generic_to_shared).
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes initialized barriers visible to the async proxy (TMA); a CTA barrier follows.
__device__ __forceinline__ void MbarInitFence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival that also expects `bytes` more of asynchronous copies before the phase completes.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Expects `bytes` more of asynchronous copies before the current phase completes (no arrival:
// the phase still waits for its arrivals, so copies issued before them cannot complete it).
__device__ __forceinline__ void MbarExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Waits until the phase with parity `parity` has completed.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// 2-D bulk tensor copy of the box at (x, y) of `map` (a __grid_constant__ CUtensorMap) to `dst`,
// completing `bar`'s transaction count.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const void* map, int x, int y,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
// Named barriers 1..15 (0 is __syncthreads): sync waits for `count` threads (arrivals included),
// arrive counts this thread without waiting.
__device__ __forceinline__ void NamedBarSync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void NamedBarArrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Orders this thread's earlier shared-memory writes (st.shared, cp.async) before reads by the
// async proxy (wgmma operands); then a barrier publishes them to the warpgroup.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of accumulator registers across the
// asynchronous MMA.
template <int N>
__device__ __forceinline__ void FenceRegs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void FenceRegs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
// d (64 x 64, f32) += A (64 x 16, K-major, smem) * B (16 x 64 as 64 rows K-major, smem).
__device__ __forceinline__ void Wgmma64x64SS(float (&d)[32], uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b));
#else
  __trap();
#endif
}
// d[kOff, kOff + 16) (the accumulators of columns kOff * 2 .. kOff * 2 + 31 of a 64 x 64 tile, in
// Wgmma64x64SS's layout) += A (64 x 16, K-major, smem) * B (16 x 32 as 32 rows K-major, smem):
// two of these (kOff 0 and 16, B's rows 0-31 and 32-63) give a 64-column chain's bits (an
// element's k16 chain does not depend on N; bench/kernels/wgmma_swap_probe.cu).
template <int kOff>
__device__ __forceinline__ void Wgmma64x32SS(float (&d)[32], uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(kOff == 0 || kOff == 16, "a half of a 64-column tile");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[kOff + 0]), "+f"(d[kOff + 1]), "+f"(d[kOff + 2]), "+f"(d[kOff + 3]),
        "+f"(d[kOff + 4]), "+f"(d[kOff + 5]), "+f"(d[kOff + 6]), "+f"(d[kOff + 7]),
        "+f"(d[kOff + 8]), "+f"(d[kOff + 9]), "+f"(d[kOff + 10]), "+f"(d[kOff + 11]),
        "+f"(d[kOff + 12]), "+f"(d[kOff + 13]), "+f"(d[kOff + 14]), "+f"(d[kOff + 15])
      : "l"(a), "l"(b));
#else
  __trap();
#endif
}
// d (64 x 64, f32) += A (64 x 16 bf16, registers: the mma.sync A fragment of each warp's 16 rows)
// * B (16 x 64 as 64 rows K-major, smem).
__device__ __forceinline__ void Wgmma64x64RS(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31}, {%32, %33, %34, %35}, %36, p, "
      "1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
#else
  __trap();
#endif
}
// d (64 x 128, f32) += A (64 x 16 bf16, registers: the mma.sync A fragment of each warp's 16
// rows) * B (16 x 128, MN-major in smem: rows = K).
__device__ __forceinline__ void Wgmma64x128RS(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%"
      "48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64, %65, %66, %67}, %68, "
      "p, 1, "
      "1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
#else
  __trap();
#endif
}

// d (64 x 8, f32) += A (64 x 16) * B (16 x 8 as 8 rows K-major), both from shared memory; kTransA
// 1: A is MN-major (its M side contiguous: V^T read from a V tile), 0: K-major. With the keys or
// the head dims as M these give the bits of the m64n64 / m64n128 chains above
// (bench/kernels/wgmma_swap_probe.cu, 0 of 92160 elements differing on an H200).
template <int kTransA>
__device__ __forceinline__ void Wgmma64x8SS(float (&d)[4], uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, %6, "
      "0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(a), "l"(b), "n"(kTransA));
#else
  __trap();
#endif
}

}  // namespace cascade::cuda::internal

// Probe (one GPU call; bench/kernels/NOTES.md, session 33): what does it cost to hand a wide
// chain tile's partial from one CTA of a cluster pair to the other through distributed shared
// memory? The three-level tree's step is bound by its wide chains (48 tiles a work at ~0.8 us a
// tile on one warpgroup, which is about an SM's whole tensor rate: two warpgroups of one CTA gain
// nothing, experiments/wide_split_runs.patch). A pair of CTAs on two SMs could split a chain:
// the helper computes the odd tiles' partials (O_t of 64 q-rows x 128 dims in f32, 32 KB, and a
// (ms, lt) a row), pushes each into the folder's shared memory and arrives on the folder's
// mbarrier; the folder computes the even tiles and folds every tile in order (the same
// operations on the same values: the same bits). That halves the chain only if a hand-off costs
// well under a tile (~0.8 us).
//
// Here each pair runs `iters` hand-offs of 32 KB + 512 bytes (128 threads, 64 floats and one
// float a thread) in two forms: "st", pushed as float4 stores to the peer's shared memory with a
// remote arrival a thread; "bulk", written to the helper's own shared memory and handed over by
// one bulk copy (cp.async.bulk shared::cta -> shared::cluster, completing on the folder's
// barrier). kSlots slots (full barriers on the folder, empty barriers on the helper), each side
// spinning `work` cycles a hand-off first (a tile's compute, emulated). The folder checks every
// value and times its loop. Printed: ns per hand-off for 1 pair and for 64 pairs (a tree's
// chains), with and without work, against the same loops with no hand-off (work alone). Exit 1
// if a value arrived wrong.
//   cuda_dsmem_probe [iters (default 480)]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "gpu_worker/backend/cuda/wgmma.cuh"

namespace {
using cascade::cuda::internal::MbarArriveExpectTx;
using cascade::cuda::internal::MbarInit;

constexpr int kThreads = 128;
constexpr int kF4 = 16;                                // float4s a thread: 64 floats of O_t
constexpr int kSlotBytes = kThreads * (kF4 * 16 + 4);  // O_t, then one float a thread (ms, lt)

#define CUDA_OK(x)                                                                            \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// The shared::cluster address of local shared address `a` in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t Mapa(uint32_t a, uint32_t rank) {
  uint32_t d;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(rank));
  return d;
}
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}
// One arrival on a barrier of another CTA of the cluster (its shared::cluster address), releasing
// this thread's earlier writes to cluster scope.
__device__ __forceinline__ void MbarArriveRemote(uint32_t cluster_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_bar)
               : "memory");
}
// Waits for phase `parity` of a local barrier, acquiring what the arrivals released (cluster
// scope: wgmma.cuh's MbarWait acquires at CTA scope).
__device__ __forceinline__ void MbarWaitCluster(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void StRemote4(uint32_t addr, float4 v) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v.x),
               "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}
__device__ __forceinline__ void StRemote(uint32_t addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
// The async proxy's bulk copy of `bytes` from this CTA's shared memory to another CTA's
// (shared::cluster addresses dst and bar), completing `bytes` of transactions on that CTA's
// barrier; one thread issues it.
__device__ __forceinline__ void BulkToPeer(uint32_t dst, uint32_t src, uint32_t bytes,
                                           uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, "
      "[%3];\n" ::"r"(dst),
      "r"(src), "r"(bytes), "r"(bar)
      : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Until at most N of this thread's bulk copies still read their source.
template <int N>
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void Spin(int cycles) {
  if (cycles <= 0) return;
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
__device__ __forceinline__ uint64_t GlobalNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// The value thread t pushes as float e of hand-off i (exact in f32).
__device__ __forceinline__ float Value(int i, int e, int t) {
  return static_cast<float>((i * 131 + e * 7 + t) & 0xffff);
}
#endif

// kSlots slots of kSlotBytes in dynamic shared memory (used on the folder, rank 0). handoff 0:
// no hand-off at all (each side only spins `work` a step: the loop's own cost).
// kBulk: the helper writes each partial into a slot of its own shared memory and one thread
// hands it over by one bulk copy (the async proxy; the folder's full barrier counts its bytes),
// the folder gives a slot back with one remote arrival; else every helper thread pushes its
// values with st.shared::cluster and arrives remotely.
template <int kSlots, bool kBulk>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads)
    Handoff(int iters, int work, int handoff, unsigned long long* ns, int* errors) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char slots[];
  __shared__ __align__(8) uint64_t full[kSlots];   // the folder's: a slot was pushed
  __shared__ __align__(8) uint64_t empty[kSlots];  // the helper's: the folder read a slot
  const int t = threadIdx.x;
  const uint32_t rank = ClusterRank();
  if (t == 0) {
    for (int s = 0; s < kSlots; ++s) {
      MbarInit(SmemAddr(&full[s]), kBulk ? 1 : kThreads);
      MbarInit(SmemAddr(&empty[s]), kBulk ? 1 : kThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  ClusterSync();  // both CTAs' barriers initialized before any remote arrival
  const uint64_t t0 = GlobalNs();
  if (rank == 1) {  // helper: computes (spins), pushes O_t and the row stats, arrives
    for (int i = 0; i < iters; ++i) {
      const int s = i % kSlots;
      Spin(work);
      if (!handoff) continue;
      if (i >= kSlots) MbarWaitCluster(SmemAddr(&empty[s]), ((i / kSlots) - 1) & 1);
      const uint32_t dst = Mapa(SmemAddr(slots + s * kSlotBytes), 0);
      if constexpr (kBulk) {
        // Slot s of this CTA is the staging buffer: its last copy has read it (wait_group.read
        // by the issuing thread, then the CTA barrier) before it is written again.
        if (t == 0) BulkWaitRead<kSlots - 1>();
        __syncthreads();
        float4* local = reinterpret_cast<float4*>(slots + s * kSlotBytes);
#pragma unroll
        for (int e = 0; e < kF4; ++e) {
          local[e * kThreads + t] = make_float4(Value(i, 4 * e, t), Value(i, 4 * e + 1, t),
                                                Value(i, 4 * e + 2, t), Value(i, 4 * e + 3, t));
        }
        reinterpret_cast<float*>(slots + s * kSlotBytes + kThreads * kF4 * 16)[t] = Value(i, 64, t);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // for the bulk copy
        __syncthreads();
        if (t == 0) {
          BulkToPeer(dst, SmemAddr(slots + s * kSlotBytes), kSlotBytes,
                     Mapa(SmemAddr(&full[s]), 0));
        }
      } else {
#pragma unroll
        for (int e = 0; e < kF4; ++e) {
          StRemote4(dst + (e * kThreads + t) * 16,
                    make_float4(Value(i, 4 * e, t), Value(i, 4 * e + 1, t), Value(i, 4 * e + 2, t),
                                Value(i, 4 * e + 3, t)));
        }
        StRemote(dst + kThreads * kF4 * 16 + 4 * t, Value(i, 64, t));
        MbarArriveRemote(Mapa(SmemAddr(&full[s]), 0));
      }
    }
    if (kBulk && t == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  } else {  // folder: computes (spins), waits for the slot, folds it, gives it back
    float acc = 0.f;
    int bad = 0;
    for (int i = 0; i < iters; ++i) {
      const int s = i % kSlots;
      Spin(work);
      if (!handoff) continue;
      if (kBulk && t == 0) MbarArriveExpectTx(SmemAddr(&full[s]), kSlotBytes);
      MbarWaitCluster(SmemAddr(&full[s]), (i / kSlots) & 1);
      const unsigned char* src = slots + s * kSlotBytes;
#pragma unroll
      for (int e = 0; e < kF4; ++e) {
        const float4 v = reinterpret_cast<const float4*>(src)[e * kThreads + t];
        bad += v.x != Value(i, 4 * e, t) || v.y != Value(i, 4 * e + 1, t) ||
               v.z != Value(i, 4 * e + 2, t) || v.w != Value(i, 4 * e + 3, t);
        acc = __fmaf_rn(acc, 0.5f, v.x + v.y + v.z + v.w);
      }
      const float r = reinterpret_cast<const float*>(src + kThreads * kF4 * 16)[t];
      bad += r != Value(i, 64, t);
      acc += r;
      if constexpr (kBulk) {
        __syncthreads();  // every thread has read slot s
        if (t == 0) MbarArriveRemote(Mapa(SmemAddr(&empty[s]), 1));
      } else {
        MbarArriveRemote(Mapa(SmemAddr(&empty[s]), 1));
      }
    }
    const uint64_t t1 = GlobalNs();
    if (t == 0) ns[blockIdx.x / 2] = t1 - t0;
    if (bad != 0 || acc == -1.f) atomicAdd(errors, bad + (acc == -1.f));
  }
  ClusterSync();  // no CTA leaves while its peer may still write its shared memory
#endif
}

template <int kSlots, bool kBulk>
double Run(int pairs, int iters, int work, int handoff, int* errors_out) {
  const size_t smem = static_cast<size_t>(kSlots) * kSlotBytes;
  CUDA_OK(cudaFuncSetAttribute(Handoff<kSlots, kBulk>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)));
  unsigned long long* ns = nullptr;
  int* errors = nullptr;
  CUDA_OK(cudaMalloc(&ns, pairs * sizeof(unsigned long long)));
  CUDA_OK(cudaMalloc(&errors, sizeof(int)));
  CUDA_OK(cudaMemset(errors, 0, sizeof(int)));
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    Handoff<kSlots, kBulk><<<2 * pairs, kThreads, smem>>>(iters, work, handoff, ns, errors);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<unsigned long long> h(pairs);
    CUDA_OK(cudaMemcpy(h.data(), ns, pairs * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    unsigned long long worst = 0;
    for (unsigned long long v : h) worst = v > worst ? v : worst;
    const double per = static_cast<double>(worst) / iters;
    if (rep > 0 && per < best) best = per;  // the first launch warms up
  }
  int errors_h = 0;
  CUDA_OK(cudaMemcpy(&errors_h, errors, sizeof(int), cudaMemcpyDeviceToHost));
  *errors_out += errors_h;
  CUDA_OK(cudaFree(ns));
  CUDA_OK(cudaFree(errors));
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 480;
  if (iters < 4) {
    std::fprintf(stderr, "usage: cuda_dsmem_probe [iters >= 4]\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major < 9) {
    std::printf("%s (sm_%d%d): no clusters before sm_90; nothing to probe\n", prop.name, prop.major,
                prop.minor);
    return 0;
  }
  int khz = 0;  // (cudaDeviceProp lost clockRate in CUDA 13)
  CUDA_OK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  // ~0.8 us at the SM clock (1.98 GHz on an H200): a wide chain's tile on one warpgroup.
  const int tile_cycles = static_cast<int>(0.8e-6 * khz * 1e3);
  std::printf(
      "%s, %d SMs, %d kHz; hand-off of %d bytes (O_t of 64 q-rows x 128 dims f32 and a "
      "float a thread), %d a pair; tile emulated as %d cycles\n",
      prop.name, prop.multiProcessorCount, khz, kSlotBytes, iters, tile_cycles);
  std::printf("%-8s %-6s %-6s %-6s %14s %14s %14s\n", "pairs", "form", "slots", "work",
              "handoff ns", "no-handoff ns", "added ns");
  int errors = 0;
  for (int pairs : {1, 64}) {
    for (int work : {0, tile_cycles}) {
      const double alone = Run<2, false>(pairs, iters, work, 0, &errors);
      const double rows[4] = {Run<1, false>(pairs, iters, work, 1, &errors),
                              Run<2, false>(pairs, iters, work, 1, &errors),
                              Run<1, true>(pairs, iters, work, 1, &errors),
                              Run<2, true>(pairs, iters, work, 1, &errors)};
      for (int r = 0; r < 4; ++r) {
        std::printf("%-8d %-6s %-6d %-6s %14.1f %14.1f %14.1f\n", pairs, r < 2 ? "st" : "bulk",
                    1 + r % 2, work == 0 ? "none" : "tile", rows[r], alone, rows[r] - alone);
      }
    }
  }
  std::printf("values wrong: %d\n", errors);
  return errors == 0 ? 0 : 1;
}

// Probe (bench/engine/probes/cublas_pdl.sh runs it on the device): can a captured decode graph
// launch cuBLASLt's GEMM kernels early, under a programmatic edge from the kernel before them, as
// our own kernels are (programmatic dependent launch)? cuBLASLt does not set the launch attribute
// itself, so in a captured step every edge into its kernels is a full one and each GEMM adds its
// whole launch latency (bench/engine/NOTES.md run 22). An edge may be made programmatic only if
// the kernel waits for the previous grid (griddepcontrol.wait) before it reads its inputs.
//
// For each shape (qwen3-0.6b's projections) and m, with the algorithm cuBLASLt's heuristic picks
// at m = 256 (how gemm.cc pins them):
//  1. capture [producer -> GEMM -> consumer]: the producer (launched programmatically) lets its
//     dependents launch at once, spins ~spin_us, then writes x; print the GEMM kernel's name and
//     the edge types into it;
//  2. make the edge into the GEMM programmatic, fill x with NaNs before each replay, replay: if the
//     GEMM read x before the producer's write, y differs from the reference (it would read NaNs);
//  3. time a chain of 28 [short producer -> GEMM] pairs replayed, full vs programmatic edges.
// Prints one line per case. Not part of the build: nvcc -arch=sm_90a ... -lcublasLt -lcuda.
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)
#define CB(x)                                                                 \
  do {                                                                        \
    cublasStatus_t s_ = (x);                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                        \
      std::printf("cuBLAS error %d at %s:%d\n", int(s_), __FILE__, __LINE__); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

__global__ void Producer(__nv_bfloat16* x, const __nv_bfloat16* src, int n, long long spin) {
  asm volatile("griddepcontrol.launch_dependents;");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] = src[i];
}
__global__ void Fill(__nv_bfloat16* p, int n, unsigned short bits) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = __ushort_as_bfloat16(bits);
}

static void LaunchPdl(cudaStream_t s,
                      void (*k)(__nv_bfloat16*, const __nv_bfloat16*, int, long long),
                      __nv_bfloat16* x, const __nv_bfloat16* src, int n, long long spin, int grid) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(256);
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, k, x, src, n, spin));
}

struct Gemm {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
  void* ws;
  size_t ws_bytes = 32 << 20;
  // y[m, n] = x[m, k] w[n, k]^T, row-major: column-major y^T[n, m] = w^T... as gemm.cc: A = w
  // (k x n col-major = [n, k] row-major, transposed), B = x (k x m col-major).
  void Layouts(int m, int n, int k) {
    CB(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, n, k));
    CB(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, m, k));
    CB(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, n, m, n));
  }
  void Free() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
  }
  void Run(const void* w, const void* x, void* y, cudaStream_t s) {
    const float one = 1.f, zero = 0.f;
    CB(cublasLtMatmul(lt, op, &one, w, a, x, b, &zero, y, c, y, c, &algo, ws, ws_bytes, s));
  }
};

static std::string KernelName(cudaGraphNode_t node) {
  CUgraphNode cn = reinterpret_cast<CUgraphNode>(node);
  CUDA_KERNEL_NODE_PARAMS p;
  std::memset(&p, 0, sizeof(p));
  if (cuGraphKernelNodeGetParams(cn, &p) != CUDA_SUCCESS) return "?";
  const char* name = nullptr;
  if (p.func != nullptr && cuFuncGetName(&name, p.func) == CUDA_SUCCESS && name) return name;
  if (p.kern != nullptr) {
    CUfunction f;
    if (cuKernelGetFunction(&f, p.kern) == CUDA_SUCCESS && cuFuncGetName(&name, f) == CUDA_SUCCESS)
      return name;
  }
  return "?";
}

// Every kernel node of g that is not ours (Producer / Fill): its incoming edges made
// programmatic where they come from a kernel node. Returns how many edges changed.
static int ProgrammaticIntoForeign(cudaGraph_t g, bool print) {
  size_t n = 0;
  CK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CK(cudaGraphGetNodes(g, nodes.data(), &n));
  int changed = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    CK(cudaGraphNodeGetType(node, &t));
    if (t != cudaGraphNodeTypeKernel) continue;
    const std::string name = KernelName(node);
    if (name.find("Producer") != std::string::npos || name.find("Fill") != std::string::npos)
      continue;
    size_t nd = 0;
    CK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &nd));
    std::vector<cudaGraphNode_t> deps(nd);
    std::vector<cudaGraphEdgeData> ed(nd);
    CK(cudaGraphNodeGetDependencies(node, deps.data(), ed.data(), &nd));
    for (size_t i = 0; i < nd; ++i) {
      cudaGraphNodeType dt;
      CK(cudaGraphNodeGetType(deps[i], &dt));
      if (print) {
        std::printf("    kernel %s: edge from %s port %d type %d\n", name.c_str(),
                    dt == cudaGraphNodeTypeKernel ? KernelName(deps[i]).c_str() : "non-kernel",
                    ed[i].from_port, ed[i].type);
      }
      if (dt != cudaGraphNodeTypeKernel || ed[i].type == cudaGraphDependencyTypeProgrammatic)
        continue;
      CK(cudaGraphRemoveDependencies(g, &deps[i], &node, &ed[i], 1));
      cudaGraphEdgeData pe = {};
      pe.from_port = cudaGraphKernelNodePortProgrammatic;
      pe.type = cudaGraphDependencyTypeProgrammatic;
      CK(cudaGraphAddDependencies(g, &deps[i], &node, &pe, 1));
      ++changed;
    }
  }
  return changed;
}

int main() {
  CK(cudaFree(nullptr));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  std::printf("# %s, cuBLASLt %zu\n", prop.name, cublasLtGetVersion());
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Gemm gm;
  CB(cublasLtCreate(&gm.lt));
  CB(cublasLtMatmulDescCreate(&gm.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CB(cublasLtMatmulDescSetAttribute(gm.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CB(cublasLtMatmulDescSetAttribute(gm.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  CK(cudaMalloc(&gm.ws, gm.ws_bytes));
  const int shapes[4][2] = {{4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}};
  const char* names[4] = {"qkv", "o_proj", "gate_up", "down_proj"};
  const int ms[3] = {1, 64, 256};
  const long long spin = static_cast<long long>(clock_khz) * 50 / 1000;  // ~50 us
  int unsafe = 0;
  for (int si = 0; si < 4; ++si) {
    const int n = shapes[si][0], k = shapes[si][1];
    // The algorithm the heuristic picks at m = 256, split-K off: the pinned one's way.
    gm.Layouts(256, n, k);
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &gm.ws_bytes, sizeof(gm.ws_bytes)));
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;  // split-K off, as gemm.cc pins
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &none,
                                            sizeof(none)));
    cublasLtMatmulHeuristicResult_t hr[1];
    int found = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(gm.lt, gm.op, gm.a, gm.b, gm.c, gm.c, pref, 1, hr, &found));
    gm.Free();
    if (found == 0) {
      std::printf("%s: no algorithm\n", names[si]);
      continue;
    }
    gm.algo = hr[0].algo;
    for (int m : ms) {
      gm.Layouts(m, n, k);
      __nv_bfloat16 *x, *src, *w, *y, *yref;
      CK(cudaMalloc(&x, sizeof(__nv_bfloat16) * m * k));
      CK(cudaMalloc(&src, sizeof(__nv_bfloat16) * m * k));
      CK(cudaMalloc(&w, sizeof(__nv_bfloat16) * n * k));
      CK(cudaMalloc(&y, sizeof(__nv_bfloat16) * m * n));
      CK(cudaMalloc(&yref, sizeof(__nv_bfloat16) * m * n));
      std::vector<__nv_bfloat16> h(static_cast<size_t>(n) * k);
      for (size_t i = 0; i < h.size(); ++i)
        h[i] = __float2bfloat16(((i * 2654435761u) % 1000) / 1000.f - 0.5f);
      CK(cudaMemcpy(w, h.data(), sizeof(__nv_bfloat16) * n * k, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(src, h.data(), sizeof(__nv_bfloat16) * m * k, cudaMemcpyHostToDevice));
      // Reference, eager and serialized.
      CK(cudaMemcpy(x, src, sizeof(__nv_bfloat16) * m * k, cudaMemcpyDeviceToDevice));
      gm.Run(w, x, yref, s);
      CK(cudaStreamSynchronize(s));
      // 1 + 2: the race check.
      cudaGraph_t g;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      LaunchPdl(s, Producer, x, src, m * k, spin, 1);
      gm.Run(w, x, y, s);
      CK(cudaStreamEndCapture(s, &g));
      std::printf("%s n=%d k=%d m=%d:\n", names[si], n, k, m);
      std::vector<__nv_bfloat16> hy(static_cast<size_t>(m) * n), hr2(hy.size());
      CK(cudaMemcpy(hr2.data(), yref, sizeof(__nv_bfloat16) * m * n, cudaMemcpyDeviceToHost));
      auto wrong_replays = [&](cudaGraph_t graph) {  // of 5, x NaN before each
        cudaGraphExec_t ge;
        CK(cudaGraphInstantiate(&ge, graph, 0));
        int wrong = 0;
        for (int rep = 0; rep < 5; ++rep) {
          Fill<<<132, 256, 0, s>>>(x, m * k, 0x7fc0);  // NaN
          Fill<<<132, 256, 0, s>>>(y, m * n, 0);
          CK(cudaGraphLaunch(ge, s));
          CK(cudaStreamSynchronize(s));
          CK(cudaMemcpy(hy.data(), y, sizeof(__nv_bfloat16) * m * n, cudaMemcpyDeviceToHost));
          if (std::memcmp(hy.data(), hr2.data(), hy.size() * sizeof(__nv_bfloat16)) != 0) ++wrong;
        }
        cudaGraphExecDestroy(ge);
        return wrong;
      };
      const int control = wrong_replays(g);  // full edges: must be 0, or the check is broken
      const int changed = ProgrammaticIntoForeign(g, true);
      const int bad = wrong_replays(g);
      unsafe += bad != 0;
      // 3: timing, 28 pairs of [short producer -> GEMM] a graph.
      auto chain = [&](bool programmatic) {
        cudaGraph_t cg;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < 28; ++l) {
          LaunchPdl(s, Producer, x, src, std::min(m * k, 4096), 0, 8);  // short, as a norm
          gm.Run(w, x, y, s);
        }
        CK(cudaStreamEndCapture(s, &cg));
        if (programmatic) ProgrammaticIntoForeign(cg, false);
        cudaGraphExec_t ce;
        CK(cudaGraphInstantiate(&ce, cg, 0));
        for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(ce, s));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < 50; ++i) CK(cudaGraphLaunch(ce, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms_ = 0;
        CK(cudaEventElapsedTime(&ms_, e0, e1));
        cudaGraphExecDestroy(ce);
        cudaGraphDestroy(cg);
        return ms_ * 1000.f / 50 / 28;  // us per pair
      };
      const float full = chain(false), prog = chain(true), full2 = chain(false),
                  prog2 = chain(true);
      std::printf(
          "  replays wrong of 5 (x NaN until the producer's late write): full edges %d "
          "(the control), %d edges made programmatic %d; us per [producer + GEMM]: full "
          "%.2f / %.2f, programmatic %.2f / %.2f\n",
          control, changed, bad, full, full2, prog, prog2);
      cudaGraphDestroy(g);
      cudaFree(x);
      cudaFree(src);
      cudaFree(w);
      cudaFree(y);
      cudaFree(yref);
      gm.Free();
    }
    cublasLtMatmulPreferenceDestroy(pref);
  }
  std::printf("cases with a wrong replay: %d\n", unsafe);
  return 0;
}

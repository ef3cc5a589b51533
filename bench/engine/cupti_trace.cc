// A per-kernel timeline of a CUDA program, including the kernels that CUDA graph replays launch,
// for the device machine where neither nsys nor a timeline tool runs (ncu serializes kernels,
// so it cannot say what a kernel adds to a decode step under programmatic launch). Loaded by the
// CUDA driver as an injection library; it asks CUPTI for its concurrent-kernel activity records
// (start and end of every kernel in GPU time, not serialized) and writes one CSV line per kernel.
//
//   g++ -shared -fPIC -O2 -DKERNEL_RECORD=CUpti_ActivityKernel9 -I$CUDA/include \
//       -I$CUDA/extras/CUPTI/include bench/engine/cupti_trace.cc \
//       -L$CUDA/extras/CUPTI/lib64 -lcupti -o libcupti_trace.so
//   CUDA_INJECTION64_PATH=$PWD/libcupti_trace.so CUPTI_TRACE_OUT=trace.csv ./program ...
//   python3 bench/engine/cupti_steps.py trace.csv
//
// KERNEL_RECORD: the newest CUpti_ActivityKernelN the installed cupti_activity.h defines
// (bench/engine/device_timeline.sh finds it). Columns: start_ns, end_ns, graph_id,
// graph_node_id, stream_id, correlation_id, grid_x, grid_y, grid_z, name. Kernels of one graph
// launch share its correlation id. Not part of the CMake build: CUPTI is not on CI's machine.
#include <cupti.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#ifndef KERNEL_RECORD
#error "define KERNEL_RECORD as the newest CUpti_ActivityKernelN of cupti_activity.h"
#endif

namespace {

std::mutex g_mu;
FILE* g_out = nullptr;
std::atomic<uint64_t> g_records{0};

void Check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "cupti_trace: %s failed: %s\n", what, msg ? msg : "?");
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = 4u << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = *buffer ? kBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    const auto* k = reinterpret_cast<const KERNEL_RECORD*>(rec);
    if (g_out) {
      std::fprintf(g_out, "%llu,%llu,%u,%llu,%u,%u,%d,%d,%d,%s\n",
                   static_cast<unsigned long long>(k->start),
                   static_cast<unsigned long long>(k->end), k->graphId,
                   static_cast<unsigned long long>(k->graphNodeId), k->streamId, k->correlationId,
                   k->gridX, k->gridY, k->gridZ, k->name ? k->name : "?");
    }
    g_records.fetch_add(1, std::memory_order_relaxed);
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  if (dropped) std::fprintf(stderr, "cupti_trace: %zu records dropped\n", dropped);
  std::free(buffer);
}

void AtExit() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_out) {
    std::fclose(g_out);
    g_out = nullptr;
    std::fprintf(stderr, "cupti_trace: %llu kernel records written\n",
                 static_cast<unsigned long long>(g_records.load()));
  }
}

}  // namespace

// Called by the CUDA driver (CUDA_INJECTION64_PATH) when it initializes.
extern "C" int InitializeInjection(void) {
  const char* path = std::getenv("CUPTI_TRACE_OUT");
  g_out = std::fopen(path ? path : "cupti_trace.csv", "w");
  if (!g_out) {
    std::fprintf(stderr, "cupti_trace: cannot open %s\n", path ? path : "cupti_trace.csv");
    return 0;
  }
  std::fprintf(g_out,
               "start_ns,end_ns,graph_id,graph_node_id,stream_id,correlation_id,grid_x,"
               "grid_y,grid_z,name\n");
  Check(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted), "register callbacks");
  Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel records");
#ifndef NO_FLUSH_PERIOD  // (older CUPTI: buffers are written as they fill, and at exit)
  Check(cuptiActivityFlushPeriod(200), "flush period");  // buffers written while the program runs
#endif
  std::atexit(AtExit);
  return 1;
}

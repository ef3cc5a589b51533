// The holding side of a peer KV fetch (cascade.v2.WorkerService/FetchKv): a write reactor that
// asks the engine for the requested chain's blocks a batch at a time (Engine::ExportBlocks,
// answered between steps, so the holder keeps serving), and streams a header, then each block
// with its key and CRC-32C. Memory per stream is bounded: a new batch is asked for only while
// less than two batches wait to be written.
#pragma once

#include "cascade/v2/worker.grpc.pb.h"
#include "gpu_worker/engine/engine_loop.h"

namespace cascade::worker {

// Faults a holder injects into what it sends, for tests of the receiver's checks. -1: off.
struct FetchFaults {
  int corrupt_block = -1;    // flip a byte of this block's data after its checksum is taken
  int wrong_key_block = -1;  // send this block under the next block's key
  int truncate_after = -1;   // end the stream (OK) after this many blocks
  int stall_after = -1;      // send nothing after this many blocks, until cancelled
};

// Limits on what a peer may ask for.
inline constexpr int kMaxFetchBlocks = 1 << 16;
inline constexpr int64_t kFetchBatchBytes = int64_t{16} << 20;

// Validates the request and starts streaming; the reactor deletes itself when done.
grpc::ServerWriteReactor<cascade::v2::FetchKvResponse>* StartFetchKv(
    engine::EngineLoop* loop, const cascade::v2::FetchKvRequest& request, FetchFaults faults);

}  // namespace cascade::worker

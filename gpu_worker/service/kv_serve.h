// The holding side of a peer KV fetch (cascade.v2.WorkerService/FetchKv): a write reactor that
// asks the engine for the requested chain's blocks a batch at a time (Engine::ExportBlocks,
// answered between steps, so the holder keeps serving), and streams a header, then each block
// with its key and CRC-32C. Memory per stream is bounded: a new batch is asked for only while
// less than two batches wait to be written. The method is served raw: each block's bytes go to
// gRPC as they came out of the engine, without a copy into a serialized message.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <string>

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

// Parses and validates the request (the serialized FetchKvRequest) and starts streaming
// serialized FetchKvResponses; the reactor deletes itself when done.
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartFetchKv(engine::EngineLoop* loop,
                                                         const grpc::ByteBuffer& request,
                                                         FetchFaults faults);

// One serialized FetchKvResponse holding `block` with these fields. `data` is not copied: it
// becomes the buffer's last slice and is freed when gRPC is done with it. Parses as the
// FetchKvResponse protobuf would write (the block's fields in the order 1, 2, 4, 3).
grpc::ByteBuffer BlockMessage(int64_t index, std::string key_hex, uint32_t crc32c,
                              std::string data);

}  // namespace cascade::worker

// Small CUDA-free helpers over the CUDA runtime: an owning device buffer, host<->device copies,
// a stream timer and the device count, all reporting errors as absl::Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/backend/cuda/ops.h"

struct CUevent_st;  // == cudaEvent_t's pointee

namespace cascade::cuda {

// Number of visible CUDA devices; 0 when there is no driver or no device (never an error).
int DeviceCount();
// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)", or an error.
absl::StatusOr<std::string> DeviceName(int device);

// Owns one cudaMalloc allocation. Movable, not copyable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Errors: ResourceExhausted when the device is out of memory.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);

  void* data() const { return data_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Synchronous copies (on the legacy default stream).
absl::Status CopyToDevice(void* dst, const void* src, size_t bytes);
absl::Status CopyToHost(void* dst, const void* src, size_t bytes);
// Asynchronous copy on `stream`; `src`/`dst` host memory should be pinned for true overlap.
absl::Status CopyAsync(void* dst, const void* src, size_t bytes, Stream stream);
// Fills `bytes` bytes with `value` (synchronous).
absl::Status FillBytes(void* dst, int value, size_t bytes);
absl::Status Synchronize(Stream stream);
// Whether work enqueued on `stream` is being captured into a CUDA graph (true also when the query
// fails: first-use work, which must not be captured, is then put off).
bool IsCapturing(Stream stream);

// Device time between two points of a stream: two CUDA events, destroyed with the object. Start
// and Stop record them on `stream`; ElapsedMs waits for the stop and returns the time between
// them. ok() is false if the events could not be created (every call then fails).
class StreamTimer {
 public:
  StreamTimer();
  ~StreamTimer();
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;

  bool ok() const { return ok_; }
  absl::Status Start(Stream stream);
  absl::Status Stop(Stream stream);
  absl::StatusOr<float> ElapsedMs();

 private:
  CUevent_st* ev_[2] = {nullptr, nullptr};
  bool ok_ = false;
};

// Maps a cudaError_t (as int) to a Status naming `what`; OK for cudaSuccess.
absl::Status CudaStatus(int cuda_error, const char* what);

}  // namespace cascade::cuda

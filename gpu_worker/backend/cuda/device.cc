// CUDA runtime helpers behind device.h.
#include "gpu_worker/backend/cuda/device.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace cascade::cuda {

absl::Status CudaStatus(int cuda_error, const char* what) {
  const auto err = static_cast<cudaError_t>(cuda_error);
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string msg =
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  if (err == cudaErrorInvalidValue || err == cudaErrorInvalidConfiguration) {
    return absl::InvalidArgumentError(msg);
  }
  return absl::InternalError(msg);
}

StreamTimer::StreamTimer() {
  ok_ = cudaEventCreate(&ev_[0]) == cudaSuccess && cudaEventCreate(&ev_[1]) == cudaSuccess;
}

StreamTimer::~StreamTimer() {
  for (cudaEvent_t e : ev_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

absl::Status StreamTimer::Start(Stream stream) {
  if (!ok_) return absl::InternalError("StreamTimer: cudaEventCreate failed");
  return CudaStatus(cudaEventRecord(ev_[0], stream), "cudaEventRecord");
}

absl::Status StreamTimer::Stop(Stream stream) {
  if (!ok_) return absl::InternalError("StreamTimer: cudaEventCreate failed");
  return CudaStatus(cudaEventRecord(ev_[1], stream), "cudaEventRecord");
}

absl::StatusOr<float> StreamTimer::ElapsedMs() {
  if (!ok_) return absl::InternalError("StreamTimer: cudaEventCreate failed");
  if (absl::Status s = CudaStatus(cudaEventSynchronize(ev_[1]), "cudaEventSynchronize"); !s.ok()) {
    return s;
  }
  float ms = 0;
  if (absl::Status s =
          CudaStatus(cudaEventElapsedTime(&ms, ev_[0], ev_[1]), "cudaEventElapsedTime");
      !s.ok()) {
    return s;
  }
  return ms;
}

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

absl::StatusOr<std::string> DeviceName(int device) {
  cudaDeviceProp p;
  if (absl::Status s = CudaStatus(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
      !s.ok()) {
    return s;
  }
  return absl::StrCat(p.name, " (sm_", p.major, p.minor, ", ", p.multiProcessorCount, " SMs)");
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  if (absl::Status s = CudaStatus(cudaMalloc(&b.data_, bytes), "cudaMalloc"); !s.ok()) {
    b.data_ = nullptr;
    return absl::Status(s.code(), absl::StrCat(s.message(), " allocating ", bytes, " bytes"));
  }
  b.size_ = bytes;
  return b;
}

absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
absl::Status CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
absl::Status CopyAsync(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
}
absl::Status FillBytes(void* dst, int value, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemset(dst, value, bytes), "cudaMemset");
}
absl::Status Synchronize(Stream stream) {
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

bool IsCapturing(Stream stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &capture) != cudaSuccess ||
         capture != cudaStreamCaptureStatusNone;
}

}  // namespace cascade::cuda

// Safetensors files, memory-mapped read-only: the header is parsed and validated (dtype, shape,
// offsets in bounds and non-overlapping) so tensor data can be used without further checks.
// Also the writer the random-model generator uses, and exact bf16/fp16 -> f32 conversion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cascade::model {

enum class DType { kF32, kF16, kBF16 };

// Bytes per element: 4, 2, 2.
size_t DTypeSize(DType dtype);
// "F32", "F16", "BF16" (the safetensors spelling).
const char* DTypeName(DType dtype);

// A tensor inside a mapped file; `data` stays valid while the owning file/Model lives.
// Data is little-endian, row-major, and NOT necessarily aligned to the element size.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty for a scalar
  const void* data = nullptr;
  size_t nbytes = 0;  // product(shape) * DTypeSize(dtype)
  std::string file;   // path of the file that holds it
  int64_t numel() const;
};

// Converts all numel() elements to float32 (exact: every bf16/fp16 value is an f32 value).
// REQUIRES: `out` has room for t.numel() floats.
void ToFloat32(const TensorView& t, float* out);
float Bf16ToFloat(uint16_t bits);
float F16ToFloat(uint16_t bits);
// Round-to-nearest-even float -> bf16 (NaN stays NaN).
uint16_t FloatToBf16(float f);

// One memory-mapped safetensors file with its validated tensor table.
class SafetensorsFile {
 public:
  // Errors: NotFound (cannot open), InvalidArgument (truncated, bad header) naming `path`
  // and, where one is at fault, the tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // In header order sorted by name.
  const std::vector<TensorView>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<TensorView> tensors_;
};

// A tensor to write; its bytes come from a callback so that a large model is streamed to disk
// one tensor at a time instead of held in memory whole.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  int64_t numel() const;
};
// Fills `bytes` with specs[i]'s numel() * DTypeSize(dtype) bytes.
using TensorFiller = std::function<void(size_t i, std::vector<uint8_t>* bytes)>;

// Writes a safetensors file, tensors in the given order (header padded with spaces to a
// multiple of 8 bytes so that data starts aligned). Errors: InvalidArgument (filler produced the
// wrong size), Internal (I/O), naming `path` and the tensor.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                              const TensorFiller& fill);

}  // namespace cascade::model

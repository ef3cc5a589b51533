// Safetensors reading (mmap + header validation) and writing. Format: u64 little-endian header
// length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end)}}, then the data;
// offsets are relative to the first byte after the header.
#include "gpu_worker/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace cascade::model {
namespace {

using nlohmann::json;

// A header larger than this is certainly corrupt (real ones are a few hundred KB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

absl::Status BadFile(const std::string& path, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", msg));
}

// Names and strings come from the file's header: clipped so an error message stays bounded.
std::string Clip(const std::string& s) {
  return s.size() <= 64 ? s : absl::StrCat(s.substr(0, 64), "...");
}

absl::Status BadTensor(const std::string& path, const std::string& name, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", Clip(name), "': ", msg));
}

// product(shape) * element_size in bytes, or nullopt when it exceeds `limit` (the data section:
// a larger tensor cannot be in the file, and checking as we go keeps the product from
// overflowing).
std::optional<uint64_t> CheckedBytes(const std::vector<int64_t>& shape, size_t element_size,
                                     uint64_t limit) {
  uint64_t n = element_size;
  for (int64_t d : shape) {
    if (d == 0) return 0;
  }
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) || n > limit) return std::nullopt;
  }
  return n;
}

bool ParseDType(const std::string& s, DType* out) {
  if (s == "F32")
    *out = DType::kF32;
  else if (s == "F16")
    *out = DType::kF16;
  else if (s == "BF16")
    *out = DType::kBF16;
  else
    return false;
  return true;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

int64_t TensorView::numel() const { return Numel(shape); }
int64_t TensorSpec::numel() const { return Numel(shape); }

float Bf16ToFloat(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float F16ToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exactly representable in f32.
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);  // inf / NaN (payload kept)
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

void ToFloat32(const TensorView& t, float* out) {
  const auto* p = static_cast<const uint8_t*>(t.data);
  int64_t n = t.numel();
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(out, p, static_cast<size_t>(n) * 4);
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = Bf16ToFloat(b);
      }
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = F16ToFloat(b);
      }
      return;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return absl::NotFoundError(absl::StrCat(path, ": cannot stat"));
  }
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = path;
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    close(fd);
    return BadFile(path, absl::StrCat("truncated: ", size,
                                      " bytes, less than the 8-byte header "
                                      "length"));
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) return BadFile(path, absl::StrCat("mmap failed: ", std::strerror(errno)));
  file->map_ = map;
  file->map_size_ = size;
  const auto* bytes = static_cast<const uint8_t*>(map);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes || header_len > size - 8) {
    return BadFile(path, absl::StrCat("header length ", header_len, " exceeds the file (", size,
                                      " bytes): truncated or not a safetensors file"));
  }
  const uint8_t* data = bytes + 8 + header_len;
  uint64_t data_size = size - 8 - header_len;
  json header = json::parse(bytes + 8, bytes + 8 + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return BadFile(path, "header is not a valid JSON object");
  }
  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    if (!entry.is_object()) return BadTensor(path, name, "header entry is not an object");
    TensorView t;
    t.name = name;
    t.file = path;
    auto dtype = entry.find("dtype");
    if (dtype == entry.end() || !dtype->is_string()) return BadTensor(path, name, "no dtype");
    if (!ParseDType(dtype->get<std::string>(), &t.dtype)) {
      return BadTensor(path, name,
                       absl::StrCat("dtype ", Clip(dtype->get<std::string>()),
                                    " is not supported (F32, F16, BF16)"));
    }
    auto shape = entry.find("shape");
    if (shape == entry.end() || !shape->is_array()) return BadTensor(path, name, "no shape");
    for (const json& d : *shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return BadTensor(path, name, "shape has a non-integer or negative dimension");
      }
      t.shape.push_back(d.get<int64_t>());
    }
    auto offs = entry.find("data_offsets");
    if (offs == entry.end() || !offs->is_array() || offs->size() != 2 ||
        !(*offs)[0].is_number_unsigned() || !(*offs)[1].is_number_unsigned()) {
      return BadTensor(path, name, "data_offsets must be [begin, end] non-negative integers");
    }
    uint64_t begin = (*offs)[0].get<uint64_t>(), end = (*offs)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return BadTensor(path, name,
                       absl::StrCat("data_offsets [", begin, ", ", end, ") out of bounds of the ",
                                    data_size, "-byte data section (truncated file?)"));
    }
    std::optional<uint64_t> nbytes = CheckedBytes(t.shape, DTypeSize(t.dtype), data_size);
    if (!nbytes.has_value()) {
      return BadTensor(path, name,
                       absl::StrCat("shape and dtype need more bytes than the ", data_size,
                                    "-byte data section holds"));
    }
    t.nbytes = static_cast<size_t>(*nbytes);
    if (end - begin != t.nbytes) {
      return BadTensor(path, name,
                       absl::StrCat("data_offsets span ", end - begin,
                                    " bytes but shape and dtype need ", t.nbytes));
    }
    t.data = data + begin;
    ranges.push_back({begin, end, name});
    file->tensors_.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return BadTensor(path, ranges[i].name,
                       absl::StrCat("data overlaps tensor '", Clip(ranges[i - 1].name), "'"));
    }
  }
  std::sort(file->tensors_.begin(), file->tensors_.end(),
            [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  return file;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                              const TensorFiller& fill) {
  json header = json::object();
  uint64_t offset = 0;
  for (const TensorSpec& s : specs) {
    uint64_t n = static_cast<uint64_t>(s.numel()) * DTypeSize(s.dtype);
    header[s.name] = {
        {"dtype", DTypeName(s.dtype)}, {"shape", s.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat(path, ": cannot create"));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i < specs.size(); ++i) {
    bytes.clear();
    fill(i, &bytes);
    size_t want = static_cast<size_t>(specs[i].numel()) * DTypeSize(specs[i].dtype);
    if (bytes.size() != want) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", specs[i].name, "': got ",
                                                     bytes.size(), " bytes, want ", want));
    }
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(want));
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace cascade::model

// Helpers the CLI tests share: where ctest put the binaries, and a scratch directory.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace cascade::cli::test_util {

// The build's bin/ (ctest sets CASCADE_BINARY_DIR); empty outside ctest.
inline std::string BinDir() {
  const char* dir = std::getenv("CASCADE_BINARY_DIR");
  return dir == nullptr ? "" : std::string(dir) + "/bin";
}

// A fresh directory under the temp dir, removed with everything in it when this goes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "cascade_test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    path_ = mkdtemp(tmpl.data()) ? tmpl : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace cascade::cli::test_util

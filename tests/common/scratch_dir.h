// A test's scratch directory: made fresh under the temp dir and removed, with everything in it,
// when the test is done with it, pass or fail. Header-only, so any test can use it whatever it
// links.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace cascade::test_support {

// <temp dir>/<prefix>-XXXXXX, where the temp dir is $TMPDIR (else /tmp), as for the binaries a
// test starts. Removed when this goes: hold one in a test for that test's files, or in a static
// or a fixture's SetUpTestSuite() for files a whole binary or suite shares. A child forked from
// the test that runs static destructors leaves its parent's directory alone. Aborts the test
// binary when the directory cannot be made (an empty path would send files to "/").
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix = "cascade_test") {
    const std::filesystem::path tmp = std::filesystem::temp_directory_path();
    std::string tmpl = (tmp / (prefix + "-XXXXXX")).string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::fprintf(stderr, "cannot make a scratch directory in %s: %s\n", tmp.c_str(),
                   std::strerror(errno));
      std::abort();
    }
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (getpid() == owner_) std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  pid_t owner_ = getpid();
};

}  // namespace cascade::test_support

// A fresh directory for one test, removed with everything in it at scope
// exit: mkdtemp under the system's temporary directory, named after `tag`.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

namespace tessera::test {

class TempDir {
 public:
  explicit TempDir(const std::string &tag = "tessera") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (tag + "_XXXXXX")).string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;

  const std::filesystem::path &path() const { return path_; }
  // The path of `name` inside it.
  std::string file(const std::string &name) const { return (path_ / name).string(); }
  // Writes `text` to `name` (creating its parent directories); its path.
  std::string write(const std::string &name, const std::string &text) const {
    const std::string p = file(name);
    std::filesystem::create_directories(std::filesystem::path(p).parent_path());
    std::ofstream out(p);
    out << text;
    REQUIRE(out.good());
    return p;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace tessera::test

// Runs a fuzz target without libFuzzer: on every file named on the command line
// (directories: every file in them, in name order) and, with --seeds, on the
// target's generated seeds; with --write-seeds DIR it writes those seeds into
// DIR instead (the start of `tools/dev fuzz`'s corpus). A finding aborts.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

int run_one(const std::string& bytes) {
  return LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  int inputs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--write-seeds" && i + 1 < argc) {
      const fs::path dir = argv[++i];
      fs::create_directories(dir);
      int n = 0;
      for (const std::string& seed : fuzz_seeds()) {
        std::ofstream(dir / ("seed-" + std::to_string(n++)), std::ios::binary) << seed;
      }
      std::printf("%d seeds written to %s\n", n, dir.c_str());
      return 0;
    }
    if (arg == "--seeds") {
      for (const std::string& seed : fuzz_seeds()) {
        run_one(seed);
        ++inputs;
      }
      continue;
    }
    if (fs::is_directory(arg)) {
      std::vector<fs::path> in_dir;
      for (const auto& e : fs::directory_iterator(arg))
        if (e.is_regular_file()) in_dir.push_back(e.path());
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else {
      files.emplace_back(arg);
    }
  }
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "cannot read %s\n", f.c_str());
      return 1;
    }
    run_one(std::string(std::istreambuf_iterator<char>(in), {}));
    ++inputs;
  }
  std::printf("%d inputs: no finding\n", inputs);
  return 0;
}

// main() of the GPU test programs: exits 77, which meson reports as SKIP, when no
// GPU is present; otherwise runs the Catch2 session. `--count-gpus` prints the
// number of GPUs the CUDA runtime sees (within CUDA_VISIBLE_DEVICES) and exits.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>

#include "pipeweave/cuda/handles.hpp"

int main(int argc, char** argv) {
  if (pipeweave::cuda::gpu_count() == 0) {
    std::puts("no GPU visible: the GPU tests are skipped");
    return 77;
  }
  if (argc == 2 && std::strcmp(argv[1], "--count-gpus") == 0) {
    std::printf("%d\n", pipeweave::cuda::gpu_count());
    return 0;
  }
  return Catch::Session().run(argc, argv);
}

// main() of the GPU test programs: exits 77, which meson reports as SKIP, when no
// GPU is present; otherwise runs the Catch2 session (tests/catch_session.cpp).
// `--count-gpus` prints the number of GPUs the CUDA runtime sees (within
// CUDA_VISIBLE_DEVICES) and exits.
#include <cstdio>
#include <cstring>

#include "common/catch_session.hpp"
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
  return pipeweave::test::run_catch_session(argc, argv);
}

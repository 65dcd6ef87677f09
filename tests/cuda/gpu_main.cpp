// main() of the GPU test programs: exits 77, which meson reports as SKIP, when no
// GPU is present; otherwise runs the Catch2 session.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "pipeweave/cuda/handles.hpp"

int main(int argc, char** argv) {
  if (pipeweave::cuda::gpu_count() == 0) {
    std::puts("no GPU visible: the GPU tests are skipped");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}

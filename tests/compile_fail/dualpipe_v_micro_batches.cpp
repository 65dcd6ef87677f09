// Must not compile: DualPipeV needs at least 2 * Devices micro-batches (PyTorch's rule).
#include "pipeweave/schedule/schedules.hpp"

int main() {
  return pipeweave::DualPipeV<2, 3>::devices;
}

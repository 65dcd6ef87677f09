// Must not compile: PyTorch's zero-bubble schedules need MicroBatches to be a
// multiple of their rounds, max(1, MicroBatches / Devices).
#include "pipeweave/schedule/schedules.hpp"

int main() {
  pipeweave::InterleavedZeroBubble<4, 2, 9> schedule;
  (void)schedule;
  return 0;
}

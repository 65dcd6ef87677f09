// Must not compile: interleaved 1F1B needs MicroBatches to be a multiple of Devices.
#include "pipeweave/schedule/schedules.hpp"

int main() {
  pipeweave::Interleaved1F1B<4, 2, 6> schedule;
  (void)schedule;
  return 0;
}

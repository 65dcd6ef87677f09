// Must not compile: Interleaved1F1B needs at least one chunk per device.
#include "pipeweave/schedule/schedules.hpp"

int main() {
  return static_cast<int>(pipeweave::Interleaved1F1B<4, 0, 8>::actions.size());
}

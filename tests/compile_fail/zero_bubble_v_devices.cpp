// Must not compile: ZB-V needs at least one device.
#include "pipeweave/schedule/schedules.hpp"

int main() {
  return pipeweave::ZeroBubbleV<0, 8>::devices;
}

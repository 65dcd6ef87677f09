// Must not compile: every count is at least 1.
#include "pipeweave/schedule/schedules.hpp"

int main() {
  return pipeweave::OneFOneB<0, 8>::devices;
}

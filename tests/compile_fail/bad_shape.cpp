// Must not compile: a compile-time schedule with a shape its kind refuses.
// PIPEWEAVE_BAD_SHAPE names the type, e.g. -DPIPEWEAVE_BAD_SHAPE=pipeweave::GPipe<0,4>
// (the `bad_shapes` table of meson.build gives each its message).
#include "pipeweave/schedule/schedules.hpp"

int main() { return PIPEWEAVE_BAD_SHAPE::devices; }

// Must not compile: a recomputation policy with no stage, or with a stage the
// schedule does not have. PIPEWEAVE_RECOMPUTE names the type, e.g.
// -DPIPEWEAVE_RECOMPUTE=pipeweave::WithRecompute<pipeweave::OneFOneB<2,4>,2>
// (the `compile_fail` table of meson.build gives each its message).
#include "pipeweave/schedule/recompute.hpp"

int main() { return PIPEWEAVE_RECOMPUTE::counts[0]; }

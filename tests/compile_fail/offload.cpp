// Must not compile: an offload policy with no stage, or with a stage the
// schedule does not have. PIPEWEAVE_OFFLOAD names the type, e.g.
// -DPIPEWEAVE_OFFLOAD=pipeweave::WithOffload<pipeweave::OneFOneB<2,4>,2>
// (the `compile_fail` table of meson.build gives each its message).
#include "pipeweave/schedule/offload.hpp"

int main() { return PIPEWEAVE_OFFLOAD::counts[0]; }

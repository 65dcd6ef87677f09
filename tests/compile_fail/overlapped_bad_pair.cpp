// Must not compile: a schedule type whose program pairs a forward with a W;
// Overlapped keeps the pairs it is given and checks every one.
#include <array>

#include "pipeweave/schedule/overlap.hpp"

namespace pw = pipeweave;

struct ForwardWithW {
  static constexpr pw::ScheduleShape shape{pw::ScheduleKind::kCustom, 1, 1, 2};
  static constexpr int devices = 1, chunks = 1, micro_batches = 2, actions_per_device = 6;
  static constexpr std::array<int, 1> counts{6};
  static constexpr std::array<std::array<pw::Action, 6>, 1> actions{{{pw::fwd(0, 0), pw::bwd_input(0, 0),
                                                                      pw::fwd(0, 1).paired(), pw::bwd_weight(0, 0),
                                                                      pw::bwd_input(0, 1), pw::bwd_weight(0, 1)}}};
  static constexpr int warmup(int) { return 1; }
  static constexpr pw::Program program() { return pw::detail::static_program<ForwardWithW>(); }
};

int main() { return pw::Overlapped<ForwardWithW>::devices; }

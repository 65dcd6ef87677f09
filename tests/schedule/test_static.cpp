// Compile-time use: static_assert on schedules, their actions and the verifier.
#include <catch2/catch.hpp>

#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/verify.hpp"

using namespace pipeweave;

static_assert(verify(Interleaved1F1B<4, 2, 8>{}));
static_assert(verify(Interleaved1F1B<2, 3, 6>{}));
static_assert(verify(Interleaved1F1B<1, 4, 3>{}));
static_assert(verify(Interleaved1F1B<8, 4, 16>{}));
static_assert(verify(OneFOneB<4, 8>{}));
static_assert(verify(OneFOneB<5, 3>{}));
static_assert(verify(GPipe<3, 7>{}));
static_assert(verify(GPipe<1, 1>{}));
// The zero-bubble family and looped BFS: split backwards, the v placement, P = 2.
static_assert(verify(ZeroBubbleV<4, 8>{}));
static_assert(verify(ZeroBubbleV<2, 4>{}));
static_assert(verify(ZeroBubbleV<5, 3>{}));  // M < 2P - 1: PyTorch's order without the micro-batches past M
static_assert(verify(ZeroBubbleV<1, 2>{}));
static_assert(verify(ZeroBubbleH1<4, 8>{}));
static_assert(verify(ZeroBubbleH1<2, 1>{}));
static_assert(verify(InterleavedZeroBubble<4, 2, 8>{}));
static_assert(verify(InterleavedZeroBubble<2, 3, 6>{}));
static_assert(verify(InterleavedZeroBubble<3, 2, 5>{}));  // one round of 5
static_assert(verify(LoopedBFS<4, 2, 8>{}));
static_assert(verify(LoopedBFS<2, 3, 5>{}));
static_assert(ZeroBubbleV<2, 4>::shape.placement == Placement::kV);
static_assert(ZeroBubbleV<2, 4>::actions_per_device == 24);
static_assert(ZeroBubbleV<2, 4>::actions[0][3] == fwd(1, 0));  // stage 3 is device 0's chunk 1
static_assert(ZeroBubbleV<2, 4>::actions[1][4] == bwd_input(1, 0));
static_assert(ZeroBubbleH1<3, 6>::actions[2][6] == bwd_weight(0, 0));
static_assert(ZeroBubbleV<4, 8>::warmup(0) == 7 && ZeroBubbleH1<4, 8>::warmup(0) == 3);
// A schedule over several chunks of constant evaluation (here of 200 actions or
// steps: kChunkActions is several thousand), the lowering's and the run's state
// carried from one chunk to the next.
using Chunked = Interleaved1F1B<4, 2, 64>;  // 1,024 actions
static_assert(detail::verify_static<Chunked::Base, 200>(detail::action_table(Chunked::shape, Chunked::actions)));
static_assert(detail::static_lowering<Chunked::Base, 200>.complete);
using ChunkedV = ZeroBubbleV<4, 32>;  // 768 actions in chunks of 200
static_assert(detail::verify_static<ChunkedV::Base, 200>(detail::action_table(ChunkedV::shape, ChunkedV::actions)));

using Seed = Interleaved1F1B<4, 2, 8>;
static_assert(Seed::devices == 4 && Seed::chunks == 2 && Seed::micro_batches == 8);
static_assert(Seed::actions_per_device == 32);
static_assert(Seed::actions[0][11] == bwd(1, 0));
static_assert(Seed::actions[3][5] == bwd(1, 0));
static_assert(Seed::warmup(0) == 10 && Seed::warmup(3) == 4);
static_assert(OneFOneB<4, 8>::warmup(0) == 3);

// A broken hand-written program fails verification in a constant expression, too.
constexpr bool broken_program_fails() {
  Program p = OneFOneB<2, 2>::program();
  p.devices[1].pop_back();
  const VerifyResult r = verify(p);
  return !r && r.device == 1;
}
static_assert(broken_program_fails());

// A W before its I fails, in a constant expression too.
constexpr bool weight_before_input_fails() {
  Program p = ZeroBubbleH1<2, 2>::program();
  auto& d0 = p.devices[0];  // F0.0 F0.1 I0.0 W0.0 I0.1 W0.1
  const Action i = d0[2];
  d0[2] = d0[3];
  d0[3] = i;
  const VerifyResult r = verify(p);
  return !r && r.device == 0 && r.step == 2;
}
static_assert(weight_before_input_fails());

namespace {

template <class S, int Chunk = detail::kChunkActions>
LoweredProgram stored_lowering() {
  const auto& lowered = detail::static_lowering<typename S::Base, Chunk>;
  REQUIRE(lowered.complete);
  return lowered.program(S::shape);
}

}  // namespace

TEST_CASE("a compile-time schedule's stored lowering is lower() of its program", "[schedule]") {
  CHECK(stored_lowering<Seed>() == lower(Seed::program()));
  CHECK(stored_lowering<OneFOneB<5, 3>>() == lower(OneFOneB<5, 3>::program()));
  CHECK(stored_lowering<GPipe<1, 1>>() == lower(GPipe<1, 1>::program()));
  CHECK(stored_lowering<Interleaved1F1B<2, 3, 6>>() == lower(Interleaved1F1B<2, 3, 6>::program()));
  CHECK(stored_lowering<Chunked, 200>() == lower(Chunked::program()));
  CHECK(stored_lowering<Chunked>() == lower(Chunked::program()));
  CHECK(stored_lowering<ZeroBubbleV<4, 8>>() == lower(ZeroBubbleV<4, 8>::program()));
  CHECK(stored_lowering<ChunkedV, 200>() == lower(ChunkedV::program()));
  CHECK(stored_lowering<InterleavedZeroBubble<2, 3, 6>>() == lower(InterleavedZeroBubble<2, 3, 6>::program()));
  CHECK(&Chunked::lowered() == &detail::static_lowering<Chunked::Base>);
}

TEST_CASE("compile-time and run-time schedules agree", "[schedule]") {
  CHECK(Seed::program() == make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8));
  CHECK(Interleaved1F1B<8, 4, 16>::program() == make_schedule(ScheduleKind::kInterleaved1F1B, 8, 4, 16));
  CHECK(GPipe<3, 7>::program() == make_schedule(ScheduleKind::kGPipe, 3, 1, 7));
  CHECK(LoopedBFS<2, 3, 5>::program() == make_schedule(ScheduleKind::kLoopedBFS, 2, 3, 5));
  CHECK(ZeroBubbleH1<4, 8>::program() == make_schedule(ScheduleKind::kZeroBubbleH1, 4, 1, 8));
  CHECK(InterleavedZeroBubble<3, 2, 5>::program() == make_schedule(ScheduleKind::kInterleavedZeroBubble, 3, 2, 5));
  CHECK(ZeroBubbleV<5, 3>::program() == make_schedule(ScheduleKind::kZeroBubbleV, 5, 2, 3));
  constexpr VerifyResult r = verify(Seed{});
  CHECK(r.ok);
}

// Test helpers shared by the schedule tests: a hand-written program, and the
// message of one the verifier rejects.
#pragma once

#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave::test {

/// A custom program of P devices, V chunks and M micro-batches with these rows.
inline Program custom(int devices, int chunks, int micro_batches, std::vector<std::vector<Action>> rows) {
  return Program{{ScheduleKind::kCustom, devices, chunks, micro_batches}, std::move(rows)};
}

/// What verify() says of a program it must reject.
inline std::string rejection(const Program& p) {
  const VerifyResult r = verify(p);
  REQUIRE_FALSE(r);
  return r.what();
}

}  // namespace pipeweave::test

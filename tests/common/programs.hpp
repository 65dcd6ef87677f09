// Test helpers shared by the schedule tests: a hand-written program, the
// message of one the verifier rejects, and the most of per-device figures.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
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

/// The largest of per-device figures (peak memory, say); 0 for none.
inline double most(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

}  // namespace pipeweave::test

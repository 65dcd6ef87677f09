// The Catch2 session of a test program with a main() of its own; Catch2's
// implementation is compiled once, in tests/catch_session.cpp.
#pragma once

namespace pipeweave::test {

/// Runs the test cases the command line selects and returns Catch2's exit status
/// (the number of failed tests, at most 255). With `quiet` the report goes to
/// /dev/null (the other ranks of a multi-process test).
int run_catch_session(int argc, char** argv, bool quiet = false);

}  // namespace pipeweave::test

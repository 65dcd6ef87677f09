// Catch2's implementation, compiled once for every test program: those with
// Catch2's own main() (catch_main.cpp) and those with a main() of their own (the
// GPU and multi-process tests) call run_catch_session().
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "common/catch_session.hpp"

int pipeweave::test::run_catch_session(int argc, char** argv, bool quiet) {
  Catch::Session session;
  if (quiet) session.configData().outputFilename = "/dev/null";
  return session.run(argc, argv);
}

// main() of the test programs that need nothing before Catch2's session.
#include "common/catch_session.hpp"

int main(int argc, char** argv) { return pipeweave::test::run_catch_session(argc, argv); }

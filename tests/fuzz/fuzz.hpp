// What the fuzz targets share. Each target (csv.cpp, verify.cpp, schedule.cpp)
// defines LLVMFuzzerTestOneInput and write_seeds; it is linked either with
// libFuzzer (clang's -fsanitize=fuzzer: `tools/dev fuzz`) or with replay.cpp, a
// main() that runs it on files and on its generated seeds (the test suite's
// regression tests, with any compiler).
//
// Properties every target checks: no crash, no sanitizer report, and every
// rejection is a pipeweave::Error with a message; a target aborts (a finding)
// when an exception of another type escapes or a property fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave::fuzz {

/// Reads small integers and flags from the fuzzer's bytes; past the end every
/// read gives the lowest value, so any input decodes.
/// The generated schedule kinds: ScheduleKind values 0 .. kKinds - 1 (auto is kKinds, which no generator makes).
inline constexpr int kKinds = kGeneratedKinds;
static_assert(static_cast<int>(ScheduleKind::kAuto) == kKinds, "the generated kinds come first");

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  /// An integer in [lo, hi] (hi - lo < 65536): one byte, or two when the range
  /// needs them; lo when the range is empty.
  int integer(int lo, int hi) {
    if (hi <= lo) return lo;
    const auto span = static_cast<unsigned>(hi - lo) + 1;
    unsigned raw = byte();
    if (span > 256) raw |= static_cast<unsigned>(byte()) << 8;
    return lo + static_cast<int>(raw % span);
  }
  /// True or false.
  bool flag() { return (byte() & 1) != 0; }
  /// True when every byte was read.
  bool done() const { return at_ >= size_; }
  /// All the bytes, as text.
  std::string_view text() const { return {reinterpret_cast<const char*>(data_), size_}; }

 private:
  std::uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

/// Writes what Input reads back (for seeds): write.integer(v, lo, hi) is read as v
/// by integer(lo, hi).
class Output {
 public:
  void integer(int v, int lo, int hi) {
    if (hi <= lo) return;
    const auto raw = static_cast<unsigned>(v - lo);
    bytes_.push_back(static_cast<char>(raw & 0xff));
    if (static_cast<unsigned>(hi - lo) + 1 > 256) bytes_.push_back(static_cast<char>(raw >> 8));
  }
  void flag(bool v) { bytes_.push_back(v ? 1 : 0); }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

/// A finding: prints it and aborts, so libFuzzer keeps the input.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "pipeweave fuzz finding: %s\n", what.c_str());
  std::abort();
}

/// Checks a rejection: a pipeweave::Error with a message.
inline void rejected(const Error& e) {
  if (std::string_view(e.what()).empty()) finding("a pipeweave::Error without a message");
}

/// Runs fn(); a pipeweave::Error is a rejection (checked), any other exception a finding.
template <class F>
void run(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    rejected(e);
  } catch (const std::exception& e) {
    finding(std::string("an exception that is not a pipeweave::Error: ") + e.what());
  }
}

/// The body of LLVMFuzzerTestOneInput: check(input) under run().
template <class Check>
int test_one(const std::uint8_t* data, std::size_t size, Check&& check) {
  Input in(data, size);
  run([&] { check(in); });
  return 0;
}

/// Checks a program or lowered program that verify() rejected (with `r`): the
/// rejection explains itself, and the simulator refuses it with an Error.
template <class P>
void refused_by_simulate(const P& p, const VerifyResult& r) {
  if (r.what().empty()) finding("a rejection by verify() without a message");
  try {
    simulate(p);
  } catch (const Error& e) {
    rejected(e);
    return;
  }
  finding("simulate() accepted what verify() rejects: " + r.what());
}

/// True for a finite number.
inline bool finite(double x) { return x - x == 0; }

/// Seeds of a target: inputs that reach its interesting paths (valid programs,
/// schedules of every kind), written by its write_seeds.
using Seeds = std::vector<std::string>;

}  // namespace pipeweave::fuzz

/// Every target's seeds (defined by the target).
pipeweave::fuzz::Seeds fuzz_seeds();

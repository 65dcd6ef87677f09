// Test helpers shared by the transport tests: run one function per device, each
// on its own thread, and collect what each one threw.
#pragma once

#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave::test {

/// Runs fn(d) on one thread per device; returns each thread's error text (empty: none).
template <class F>
std::vector<std::string> on_threads(int devices, F fn) {
  std::vector<std::string> errors(static_cast<std::size_t>(devices));
  std::vector<std::thread> threads;
  for (int d = 0; d < devices; ++d) {
    threads.emplace_back([&, d] {
      try {
        fn(d);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(d)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

/// The message of an activation: stage, micro-batch, bytes.
inline Message act(int stage, int micro_batch, std::size_t bytes) {
  return {{TensorKind::kActivation, stage, micro_batch}, bytes};
}
/// The message of a gradient: stage, micro-batch, bytes.
inline Message grad(int stage, int micro_batch, std::size_t bytes) {
  return {{TensorKind::kGradient, stage, micro_batch}, bytes};
}

}  // namespace pipeweave::test

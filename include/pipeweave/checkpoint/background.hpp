#pragma once
/// \file
/// Checkpoints of a run of one process written on a thread of their own: the
/// pipeline waits only while its state is copied to the host (into memory kept
/// from one save to the next, so no page is new), and trains on while the files
/// are written, fsynced and committed (checkpoint/mlp.hpp, store.hpp). A save
/// first waits for the one before it, so at most one is in flight and its error,
/// if any, surfaces at the next save or at wait(). The protocol is the same as a
/// save on the caller's thread: a kill at any instant leaves the latest
/// checkpoint complete.
///
/// \code
/// // pipeweave::checkpoint::BackgroundSaver saver("ckpt", run, program.shape, /*keep=*/0, "threads");
/// // saver.save(step, [&](pipeweave::TrainingState& s) { pipe->copy_state(s); });  // returns after the copy
/// // ... train on ...
/// // saver.wait();  // the last save committed (or its error thrown)
/// \endcode

#include <chrono>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "pipeweave/checkpoint/mlp.hpp"
#include "pipeweave/runtime/state.hpp"
#include "pipeweave/schedule/action.hpp"

namespace pipeweave::checkpoint {

/// What one background save took.
struct SaveTimes {
  double waited_s = 0;  ///< the caller waited for the save before to end
  double copy_s = 0;    ///< the caller copied the state to the host
  double write_s = 0;   ///< the thread wrote and committed the checkpoint (known once it has)
  std::size_t bytes = 0;           ///< of the state's tensors
  std::filesystem::path directory;  ///< the checkpoint committed (known once it has)
};

/// Saves a run's checkpoints on a thread of its own (see the file comment).
class BackgroundSaver {
 public:
  /// Saves into `root` for `run` with the stages of `shape`, keeping the newest
  /// `keep` (0: all); `host` names the writer in the manifest.
  BackgroundSaver(std::filesystem::path root, MlpRun run, ScheduleShape shape, int keep, std::string host)
      : root_(std::move(root)), run_(std::move(run)), shape_(shape), keep_(keep), host_(std::move(host)) {}
  BackgroundSaver(const BackgroundSaver&) = delete;
  BackgroundSaver& operator=(const BackgroundSaver&) = delete;
  /// Waits for the save in flight; an error of it is dropped (call wait() to see it).
  ~BackgroundSaver() {
    if (thread_.joinable()) thread_.join();
  }

  /// Waits for the save before (throwing its error), then copy(state) fills the
  /// state to save (e.g. the pipeline's copy_state), and the checkpoint of `step`
  /// is written on the thread. Returns the times of the save before, complete
  /// (empty for the first).
  template <class Copy>
  std::optional<SaveTimes> save(long long step, Copy&& copy) {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    std::optional<SaveTimes> before = wait();
    const auto t1 = Clock::now();
    copy(state_);
    current_ = SaveTimes{std::chrono::duration<double>(t1 - t0).count(),
                         std::chrono::duration<double>(Clock::now() - t1).count(), 0, bytes(state_), {}};
    thread_ = std::thread([this, step] {
      const auto start = Clock::now();
      try {
        current_.directory = save_mlp(root_, run_, shape_, state_, step, keep_, host_);
      } catch (...) {
        error_ = std::current_exception();
      }
      current_.write_s = std::chrono::duration<double>(Clock::now() - start).count();
    });
    in_flight_ = true;
    return before;
  }

  /// Waits for the save in flight and returns its times; throws its error
  /// (pipeweave::Error: nothing of it was committed). Empty when none was in flight.
  std::optional<SaveTimes> wait() {
    if (!in_flight_) return std::nullopt;
    thread_.join();
    in_flight_ = false;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return current_;
  }

 private:
  static std::size_t bytes(const TrainingState& s) {
    std::size_t n = 0;
    for (const StageState& st : s.stages) {
      n += st.parameters.size();
      for (const auto& b : st.optimizer) n += b.size();
    }
    return n * sizeof(float);
  }

  std::filesystem::path root_;
  MlpRun run_;
  ScheduleShape shape_;
  int keep_;
  std::string host_;
  TrainingState state_;  // the copy being written; reused by the next save
  SaveTimes current_;
  std::thread thread_;
  std::exception_ptr error_;
  bool in_flight_ = false;
};

}  // namespace pipeweave::checkpoint

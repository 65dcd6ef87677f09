#pragma once
/// \file
/// The training state of a run on the host: what a checkpoint holds and a resumed
/// run starts from. Per virtual stage, its chunk's parameters and the update
/// rule's state for them, and the number of updates applied so far (the step
/// Adam's bias correction counts). The engine knows no names: a stage's state is
/// its chunk's parameter tensors in order, concatenated, and each buffer of the
/// rule's state concatenated the same way, so that element i of every vector
/// belongs to the same parameter. A model gives the elements their names
/// (checkpoint/mlp.hpp for the built-in MLP).
///
/// \code
/// // pipeweave::TrainingState state = pipe.state();   // every stage, on the host
/// // ... later, in a run of any schedule with the same stages:
/// // other_pipe.set_state(state);
/// \endcode

#include <cstddef>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/runtime/error.hpp"

namespace pipeweave {

/// One virtual stage's state on the host.
struct StageState {
  std::vector<float> parameters;              ///< the chunk's parameter tensors, concatenated in order
  std::vector<std::vector<float>> optimizer;  ///< [k]: the rule's k-th state buffer of each tensor, concatenated alike
  friend bool operator==(const StageState&, const StageState&) = default;
};

/// A run's state on the host.
struct TrainingState {
  long long updates = 0;           ///< optimizer steps applied so far
  std::vector<StageState> stages;  ///< [virtual stage]; left empty for a stage another process holds
  friend bool operator==(const TrainingState&, const TrainingState&) = default;
};

/// The floats of `params`, concatenated.
inline std::size_t total_count(std::span<const ParameterView> params) {
  std::size_t n = 0;
  for (const ParameterView& p : params) n += p.count;
  return n;
}

/// Copies `params` (and, for each k, `state(p, k)`, the device memory of the
/// rule's k-th buffer of tensor p, for `buffers` buffers) to `out` on the host,
/// reusing its memory (a copy into vectors of the right size touches no new
/// page). Waits for the backend.
template <Backend B, class StateOf>
void download_stage(B& backend, std::span<const ParameterView> params, int buffers, StateOf&& state, StageState& out) {
  const std::size_t n = total_count(params);
  out.parameters.resize(n);
  out.optimizer.resize(static_cast<std::size_t>(buffers));
  for (auto& b : out.optimizer) b.resize(n);
  backend.synchronize();
  std::size_t at = 0;
  for (std::size_t p = 0; p < params.size(); ++p) {
    backend.download(params[p].value, out.parameters.data() + at, params[p].count);
    for (int k = 0; k < buffers; ++k)
      backend.download(state(p, k), out.optimizer[static_cast<std::size_t>(k)].data() + at, params[p].count);
    at += params[p].count;
  }
  backend.synchronize();
}

/// download_stage() into a new StageState.
template <Backend B, class StateOf>
StageState download_stage(B& backend, std::span<const ParameterView> params, int buffers, StateOf&& state) {
  StageState out;
  download_stage(backend, params, buffers, std::forward<StateOf>(state), out);
  return out;
}

/// Throws pipeweave::Error, naming `what` (e.g. "stage 3"), unless `s` fits
/// `params` and a rule of `buffers` state buffers.
inline void check_stage_state(const StageState& s, std::span<const ParameterView> params, int buffers,
                              std::string_view what) {
  const std::size_t n = total_count(params);
  if (s.parameters.size() != n)
    throw_error({}, "state: ", what, " has ", s.parameters.size(), " parameters; its chunk has ", n);
  if (s.optimizer.size() != static_cast<std::size_t>(buffers))
    throw_error({}, "state: ", what, " has ", s.optimizer.size(), " optimizer state buffers; the update rule keeps ",
                buffers);
  for (std::size_t k = 0; k < s.optimizer.size(); ++k)
    if (s.optimizer[k].size() != n)
      throw_error({}, "state: ", what, ": optimizer state buffer ", k, " has ", s.optimizer[k].size(),
                  " values; the chunk has ", n, " parameters");
}

/// Copies `s` (checked by check_stage_state) to `params` and the rule's state
/// buffers (see download_stage). Waits for the backend.
template <Backend B, class StateOf>
void upload_stage(B& backend, const StageState& s, std::span<const ParameterView> params, StateOf&& state) {
  backend.synchronize();
  std::size_t at = 0;
  for (std::size_t p = 0; p < params.size(); ++p) {
    backend.upload(s.parameters.data() + at, params[p].value, params[p].count);
    for (std::size_t k = 0; k < s.optimizer.size(); ++k)
      backend.upload(s.optimizer[k].data() + at, state(p, static_cast<int>(k)), params[p].count);
    at += params[p].count;
  }
  backend.synchronize();
}

}  // namespace pipeweave

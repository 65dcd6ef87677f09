#pragma once
/// \file
/// Checkpoints of the built-in MLP across processes (checkpoint/mlp.hpp for the
/// names and the files, checkpoint/store.hpp for the protocol). Every rank writes
/// the files of its own chunks into one temporary directory that rank 0 makes
/// (with data-parallel replicas, the ranks of replica 0; every replica loads them);
/// once every rank has fsynced its files, the ranks agree, rank 0 gathers the
/// files' sizes and checksums, writes the manifest and commits: one agreement,
/// then one rank renames. A rank that fails, or dies, leaves the previous
/// checkpoint the latest. The root must be on a file system that every rank
/// sees. Loading: each rank reads the tensors of its own stages, and the ranks
/// agree that all could before any parameter changes.
///
/// \code
/// // const pipeweave::checkpoint::MlpRun run{spec, optimizer, rows, seed};
/// // pipeweave::mpi::save_mlp(pipe->control(), "ckpt", run, program.shape, pipe->state(), step, 0);
/// // pipe->set_state(pipeweave::mpi::load_mlp(pipe->control(), "ckpt", run, program.shape).state);
/// \endcode

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "pipeweave/checkpoint/mlp.hpp"
#include "pipeweave/checkpoint/store.hpp"
#include "pipeweave/mpi/control.hpp"
#include "pipeweave/runtime/state.hpp"
#include "pipeweave/schedule/action.hpp"

namespace pipeweave::mpi {

namespace detail {

// Rank 0's text on every rank.
inline std::string from_rank0(Control& control, const std::string& text, int step) {
  const std::vector<std::vector<char>> all =
      control.gather(std::vector<char>(text.begin(), text.end()), Control::kEveryRank, step);
  return std::string(all.front().begin(), all.front().end());
}

// This rank's stages of `shape`.
inline std::vector<int> own_stages(const Control& control, const ScheduleShape& shape) {
  std::vector<int> out;
  for (int c = 0; c < shape.chunks; ++c) out.push_back(shape.stage_of(control.device(), c));
  return out;
}

}  // namespace detail

/// Collective: saves the run whose rank holds `state` (its own stages filled)
/// as the checkpoint of `step` in `root` (see the file comment). Returns the
/// checkpoint's directory on every rank. Throws pipeweave::Error on every rank,
/// with nothing committed, when any rank fails.
inline std::filesystem::path save_mlp(Control& control, const std::filesystem::path& root,
                                      const checkpoint::MlpRun& run, const ScheduleShape& shape,
                                      const TrainingState& state, long long step, int keep) {
  const int tag = static_cast<int>(step);
  const bool root_rank = control.rank() == 0;
  std::optional<checkpoint::PendingCheckpoint> pending;
  std::string problem, tmp;
  if (root_rank) {
    try {
      pending.emplace(checkpoint::PendingCheckpoint::begin(root, step));
      tmp = pending->directory().string();
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  agree_on_problems(control, problem, tag, "checkpoint: not saved");
  tmp = detail::from_rank0(control, tmp, tag);
  nlohmann::ordered_json mine = nlohmann::ordered_json::array();
  try {
    if (control.replica() == 0)  // every replica holds the same stages: replica 0's ranks write them
      for (const checkpoint::FileRecord& r : checkpoint::write_mlp_shard(
               tmp, run, shape, state, detail::own_stages(control, shape), control.device(), control.devices()))
        mine.push_back({{"name", r.name}, {"bytes", r.bytes}, {"crc32", r.crc32}, {"tensors", r.tensors}});
  } catch (const std::exception& e) {
    problem = e.what();
  }
  agree_on_problems(control, problem, tag, "checkpoint: not saved");  // every file is fsynced
  const std::string text = mine.dump();
  const std::vector<std::vector<char>> all = control.gather(std::vector<char>(text.begin(), text.end()), 0, tag);
  std::string committed;
  if (root_rank) {
    try {
      std::vector<checkpoint::FileRecord> records;
      for (const std::vector<char>& r : all)
        for (const auto& f : nlohmann::json::parse(r.begin(), r.end()))
          records.push_back({f.at("name").get<std::string>(), f.at("bytes").get<std::uint64_t>(),
                             f.at("crc32").get<std::uint32_t>(), f.at("tensors").get<std::vector<std::string>>()});
      committed = pending->commit(checkpoint::mlp_manifest(run, state.updates, shape, "mpi"), records, keep).string();
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  agree_on_problems(control, problem, tag, "checkpoint: not committed");
  return detail::from_rank0(control, committed, tag);
}

/// Collective: the checkpoint `path` names, loaded for this rank's stages of
/// `shape` (checkpoint::load_mlp). Throws pipeweave::Error on every rank when
/// any rank cannot load its part.
inline checkpoint::Loaded load_mlp(Control& control, const std::filesystem::path& path,
                                   const checkpoint::MlpRun& run, const ScheduleShape& shape) {
  checkpoint::Loaded out;
  std::string problem;
  try {
    out = checkpoint::load_mlp(path, run, shape, detail::own_stages(control, shape));
  } catch (const std::exception& e) {
    problem = e.what();
  }
  agree_on_problems(control, problem, 0, "resume: refused");
  return out;
}

}  // namespace pipeweave::mpi

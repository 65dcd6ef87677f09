#pragma once
/// \file
/// The vocabulary every backend's options share: which transport connects the
/// pipeline devices of one process (`transport`, always a TransportKind, with its
/// names on the command line), how long any wait may take (`timeout`) and how long
/// a waiting thread spins before it parks (`spin`); where the ranks of a
/// multi-process run with data-parallel replicas sit (RankLayout, RankGrid); and,
/// for accelerators, the placement of P devices on the visible GPUs and the rule
/// that picks a transport. Standard library only: the command-line tools and the
/// host-side tests use it too.
///
/// \code
/// // 4 devices on 1 GPU: all on GPU 0, so "auto" means virtual devices.
/// const std::vector<int> gpus = pipeweave::place_devices(4, 1);
/// const auto kind = pipeweave::resolve_gpu_transport(pipeweave::TransportKind::kAuto, gpus);
/// \endcode

#include <chrono>
#include <cstddef>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/runtime/error.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// Which transport connects the pipeline devices of one process.
enum class TransportKind : unsigned char {
  kAuto,        ///< the backend's choice (CPU: kRendezvous; GPU: see resolve_gpu_transport)
  kRendezvous,  ///< CPU threads: host-side matching, the data copied at the match
  kNccl,        ///< NCCL send/recv, one rank per device and GPU
  kVirtual,     ///< GPU streams: cudaMemcpyAsync and events; any number of devices per GPU
};

/// Everything a transport kind is, in one row.
struct TransportRow {
  TransportKind kind;
  std::string_view name;   ///< on the command line and in output
  std::string_view words;  ///< what it connects, for help texts
  bool cpu;                ///< the CPU backend's threads of one process take it
  bool gpu;                ///< the CUDA backend's devices of one process take it
};

/// One row per transport kind, in the order of TransportKind.
inline constexpr TransportRow kTransportRows[] = {
    {TransportKind::kAuto, "auto", "the backend's choice", true, true},
    {TransportKind::kRendezvous, "rendezvous", "CPU threads", true, false},
    {TransportKind::kNccl, "nccl", "one GPU per device", false, true},
    {TransportKind::kVirtual, "virtual", "devices share GPUs", false, true},
};

/// The row of a transport kind.
constexpr const TransportRow& transport_row(TransportKind k) { return kTransportRows[static_cast<int>(k)]; }

/// "auto", "rendezvous", "nccl" or "virtual".
constexpr std::string_view transport_name(TransportKind k) {
  return static_cast<std::size_t>(k) < std::size(kTransportRows) ? transport_row(k).name : std::string_view("unknown");
}

/// The kind of that name; nothing for any other name.
constexpr std::optional<TransportKind> parse_transport(std::string_view name) {
  for (const TransportRow& r : kTransportRows)
    if (r.name == name) return r.kind;
  return std::nullopt;
}

/// Which ranks of a multi-process run with D data-parallel replicas of a
/// P-device pipeline hold which (replica, device), P x D ranks in all.
enum class RankLayout : unsigned char {
  kDpAdjacent,  ///< the D replicas of a pipeline device are adjacent ranks: rank = device * D + replica
  kPpAdjacent,  ///< the P devices of a replica are adjacent ranks: rank = replica * P + device
};

/// Everything a rank layout is, in one row.
struct RankLayoutRow {
  RankLayout layout;
  std::string_view name;   ///< on the command line and in output
  std::string_view words;  ///< what it means
};

/// One row per rank layout, in the order of RankLayout. Data-parallel ranks
/// adjacent is the default (the order Megatron-LM uses): every step, each
/// device's reduction moves all its gradients among the D ranks of its
/// replicas, while a pipeline transfer moves one micro-batch's activations, so
/// the reductions get the nearest ranks (one machine, where D ranks fit on one).
inline constexpr RankLayoutRow kRankLayoutRows[] = {
    {RankLayout::kDpAdjacent, "dp-adjacent", "the replicas of a device on adjacent ranks (rank = device x D + replica)"},
    {RankLayout::kPpAdjacent, "pp-adjacent", "the devices of a replica on adjacent ranks (rank = replica x P + device)"},
};

/// The row of a rank layout.
constexpr const RankLayoutRow& rank_layout_row(RankLayout l) { return kRankLayoutRows[static_cast<int>(l)]; }

/// "dp-adjacent" or "pp-adjacent".
constexpr std::string_view rank_layout_name(RankLayout l) {
  return static_cast<std::size_t>(l) < std::size(kRankLayoutRows) ? rank_layout_row(l).name
                                                                   : std::string_view("unknown");
}

/// The layout of that name; nothing for any other name.
constexpr std::optional<RankLayout> parse_rank_layout(std::string_view name) {
  for (const RankLayoutRow& r : kRankLayoutRows)
    if (r.name == name) return r.layout;
  return std::nullopt;
}

/// The ranks of D replicas of a P-device pipeline laid out by `layout`.
struct RankGrid {
  int devices = 1;   ///< P
  int replicas = 1;  ///< D
  RankLayout layout = RankLayout::kDpAdjacent;

  /// P x D.
  constexpr int ranks() const { return devices * replicas; }
  /// The rank of device `device` of replica `replica`.
  constexpr int rank(int replica, int device) const {
    return layout == RankLayout::kDpAdjacent ? device * replicas + replica : replica * devices + device;
  }
  /// The pipeline device rank `rank` holds.
  constexpr int device(int rank) const {
    return layout == RankLayout::kDpAdjacent ? rank / replicas : rank % devices;
  }
  /// The replica rank `rank` belongs to.
  constexpr int replica(int rank) const {
    return layout == RankLayout::kDpAdjacent ? rank % replicas : rank / devices;
  }
};

/// The longest any wait (a group's match or transfer, an agreement, a device
/// finishing a step) may take before it is an error, unless an option says otherwise.
inline constexpr std::chrono::milliseconds kDefaultTimeout{30000};

/// How long a device's thread that waits for another device of its process (a
/// match, an agreement) spins before it parks, when a core is free for it: a
/// wait that ends sooner costs no wake-up, one that lasts longer costs this much
/// CPU time of a core nothing else wanted (the spin yields its core to any
/// thread that does). Long enough to cover a wait for one action: on a virtual
/// machine a parked thread's idle core halts, and waking it again can take as
/// long as the action (bench/pipeline_cpu --spin-us measures it). 0: park at once.
inline constexpr std::chrono::microseconds kDefaultSpin{2000};

/// The transport the CPU backend uses for `asked`: kRendezvous for kAuto and
/// kRendezvous; throws pipeweave::Error for the GPU kinds.
inline TransportKind resolve_cpu_transport(TransportKind asked) {
  if (transport_row(asked).cpu) return TransportKind::kRendezvous;
  throw_error({}, "cpu pipeline: transport ", transport_name(asked),
              " is not one of the CPU backend's (rendezvous, or auto)");
}

/// The GPU of each of `devices` pipeline devices on `gpus` GPUs: device d on GPU
/// d when there are enough GPUs, else blocks of adjacent devices share a GPU
/// (device d on GPU d * gpus / devices).
inline std::vector<int> place_devices(int devices, int gpus) {
  if (devices < 1 || gpus < 1)
    throw_error({}, "place_devices: needs at least one device and one GPU (got ", devices, " devices, ", gpus, " GPUs)");
  std::vector<int> out(static_cast<std::size_t>(devices));
  for (int d = 0; d < devices; ++d)
    out[static_cast<std::size_t>(d)] = devices <= gpus ? d : static_cast<int>(static_cast<long long>(d) * gpus / devices);
  return out;
}

/// The GPU of one rank of a multi-process run, among the `gpus` the rank sees:
/// `asked` when it is 0 or more; else the rank's index among the ranks of its
/// machine, modulo `gpus`. Where every rank sees all of its machine's GPUs, that
/// is a GPU of its own while there are enough; where a launcher gives each rank
/// its own (CUDA_VISIBLE_DEVICES per rank, as Slurm's --gpus-per-task does), a
/// rank sees only those, and the modulo keeps it on one of them. Two ranks on one
/// GPU are refused at start-up (mpi::agree_to_start, by the GPUs' UUIDs). Throws
/// pipeweave::Error when the rank sees no GPU, or not the one asked for.
inline int rank_gpu(int asked, int rank, int local_rank, int gpus) {
  if (gpus < 1)
    throw_error({}, "rank ", rank, " sees no GPU (on its machine, or in CUDA_VISIBLE_DEVICES); each rank needs one");
  if (asked >= gpus)
    throw_error({}, "rank ", rank, " asks for GPU ", asked, ", but sees ", gpus, " (GPUs 0 to ", gpus - 1, ")");
  return asked >= 0 ? asked : local_rank % gpus;
}

/// The first two positions a < b of `values` that hold equal values, among those
/// `counts` accepts (an empty name that stands for nothing, say), or {-1, -1}.
template <class T, class Counts>
std::pair<int, int> first_equal_pair(const std::vector<T>& values, Counts counts) {
  for (std::size_t a = 0; a < values.size(); ++a)
    for (std::size_t b = a + 1; b < values.size(); ++b)
      if (counts(values[a]) && values[a] == values[b]) return {static_cast<int>(a), static_cast<int>(b)};
  return {-1, -1};
}

/// The first two devices placed on the same GPU, or {-1, -1}.
inline std::pair<int, int> shared_gpu(const std::vector<int>& gpus) {
  return first_equal_pair(gpus, [](int) { return true; });
}

/// The transport `asked` resolves to for GPU devices on `gpus` ([device] -> GPU):
/// kAuto is kNccl when there are at least two devices, each on a GPU of its own,
/// and kVirtual otherwise. Throws pipeweave::Error when kNccl is asked for devices
/// that share a GPU, and for kRendezvous (a CPU transport).
inline TransportKind resolve_gpu_transport(TransportKind asked, const std::vector<int>& gpus) {
  const auto [a, b] = shared_gpu(gpus);
  if (asked == TransportKind::kAuto) return a < 0 && gpus.size() > 1 ? TransportKind::kNccl : TransportKind::kVirtual;
  if (asked == TransportKind::kRendezvous)
    throw_error({}, "cuda pipeline: transport rendezvous is the CPU backend's; use nccl, virtual or auto");
  if (asked == TransportKind::kNccl && a >= 0)
    throw_error({}, "nccl transport: devices ", a, " and ", b, " are both on GPU ", gpus[static_cast<std::size_t>(a)],
                "; NCCL cannot put two ranks on one GPU (use the virtual transport, or fewer devices)");
  return asked;
}

}  // namespace pipeweave

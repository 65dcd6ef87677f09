#pragma once
/// \file
/// Where the pipeline devices of one process run and how they are connected: the
/// transport kinds, their names on the command line, the placement of P devices on
/// the visible GPUs and the rule that picks a transport. No CUDA header: the
/// command-line tools and the host-side tests use it too.
///
/// \code
/// // 4 devices on 1 GPU: all on GPU 0, so "auto" means virtual devices.
/// const std::vector<int> gpus = pipeweave::cuda::place_devices(4, 1);
/// const auto kind = pipeweave::cuda::resolve_transport(pipeweave::cuda::TransportKind::kAuto, gpus);
/// \endcode

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/schedule/error.hpp"

namespace pipeweave::cuda {

/// Which transport connects the pipeline devices of one process.
enum class TransportKind : unsigned char {
  kAuto,     ///< kNccl when every device has a GPU of its own (and P > 1), else kVirtual
  kNccl,     ///< NCCL send/recv, one rank per device and GPU
  kVirtual,  ///< cudaMemcpyAsync and events; any number of devices per GPU
};

/// "auto", "nccl" or "virtual".
constexpr std::string_view transport_name(TransportKind k) {
  return k == TransportKind::kAuto ? "auto" : k == TransportKind::kNccl ? "nccl" : "virtual";
}

/// The kind named "auto", "nccl" or "virtual"; nothing for any other name.
constexpr std::optional<TransportKind> parse_transport(std::string_view name) {
  if (name == "auto") return TransportKind::kAuto;
  if (name == "nccl") return TransportKind::kNccl;
  if (name == "virtual") return TransportKind::kVirtual;
  return std::nullopt;
}

/// Settings of a fabric.
struct TransportOptions {
  /// The longest any wait (a group's match or transfer, an agreement, the GPU
  /// finishing a step) may take before it is an error.
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
};

/// The GPU of each of `devices` pipeline devices on `gpus` GPUs: device d on GPU
/// d when there are enough GPUs, else blocks of adjacent devices share a GPU
/// (device d on GPU d * gpus / devices).
inline std::vector<int> place_devices(int devices, int gpus) {
  if (devices < 1 || gpus < 1)
    throw Error("place_devices: needs at least one device and one GPU (got " + std::to_string(devices) +
                " devices, " + std::to_string(gpus) + " GPUs)");
  std::vector<int> out(static_cast<std::size_t>(devices));
  for (int d = 0; d < devices; ++d)
    out[static_cast<std::size_t>(d)] = devices <= gpus ? d : static_cast<int>(static_cast<long long>(d) * gpus / devices);
  return out;
}

/// The first two devices placed on the same GPU, or {-1, -1}.
inline std::pair<int, int> shared_gpu(const std::vector<int>& gpus) {
  for (std::size_t a = 0; a < gpus.size(); ++a)
    for (std::size_t b = a + 1; b < gpus.size(); ++b)
      if (gpus[a] == gpus[b]) return {static_cast<int>(a), static_cast<int>(b)};
  return {-1, -1};
}

/// The transport `asked` resolves to for devices on `gpus` ([device] -> GPU):
/// kAuto is kNccl when there are at least two devices, each on a GPU of its own,
/// and kVirtual otherwise. Throws pipeweave::Error when kNccl is asked for devices
/// that share a GPU.
inline TransportKind resolve_transport(TransportKind asked, const std::vector<int>& gpus) {
  const auto [a, b] = shared_gpu(gpus);
  if (asked == TransportKind::kAuto) return a < 0 && gpus.size() > 1 ? TransportKind::kNccl : TransportKind::kVirtual;
  if (asked == TransportKind::kNccl && a >= 0)
    throw Error("nccl transport: devices " + std::to_string(a) + " and " + std::to_string(b) + " are both on GPU " +
                std::to_string(gpus[static_cast<std::size_t>(a)]) +
                "; NCCL cannot put two ranks on one GPU (use the virtual transport, or fewer devices)");
  return asked;
}

}  // namespace pipeweave::cuda

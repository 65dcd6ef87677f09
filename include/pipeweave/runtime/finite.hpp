#pragma once
/// \file
/// The finiteness check of a training step: on the device, the number of
/// non-finite gradient values of every parameter tensor; on the host, those
/// counts and the step's micro-batch losses. A step is applied only when all of
/// them are finite, on every device.
///
/// Reading them back waits through the backend's synchronize() first, which a
/// transport makes poll for failures of peers; only then are the values copied to
/// the host. So no copy to the host ever waits inside the GPU runtime behind
/// work (an NCCL receive) whose peer has failed.

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave {

/// True for a finite float. Written without library calls so that it means the
/// same on the host and the device: NaN and infinities give NaN when subtracted
/// from themselves.
PIPEWEAVE_HOST_DEVICE inline bool is_finite(float x) { return x - x == 0.0f; }

/// 1 for a non-finite x[i], else 0, to be summed into a count.
struct NonFinite {
  const float* x;
  PIPEWEAVE_HOST_DEVICE float operator()(std::size_t i) const { return is_finite(x[i]) ? 0.0f : 1.0f; }
};

/// What a step found not finite on a device (FiniteCheck::finding()).
struct NonFiniteFinding {
  std::string text;      ///< the error's text; empty: all is finite
  bool is_loss = false;  ///< it is about a loss (which explains every other finding)
};

/// The non-finite counts of one device's parameters and its losses, on the host.
template <Backend B>
class FiniteCheck {
 public:
  /// For `params` (whose memory outlives this object) and `losses` micro-batch
  /// losses (0 on devices that compute no loss).
  FiniteCheck(B& backend, std::span<const ParameterView> params, std::size_t losses)
      : params_(params.begin(), params.end()),
        counts_(backend.allocate(std::max<std::size_t>(1, params_.size()))),
        host_counts_(params_.size(), 0.0f),
        host_losses_(losses, 0.0f) {}

  /// Counts on the device, waits for it, and reads the counts and the losses
  /// (`device_losses`: losses() floats in device memory) to the host.
  void read(B& backend, const float* device_losses) {
    for (std::size_t k = 0; k < params_.size(); ++k)
      backend.sum(params_[k].count, NonFinite{params_[k].gradient}, counts_.data() + k);
    backend.synchronize();
    if (!params_.empty()) backend.download(counts_.data(), host_counts_.data(), params_.size());
    if (!host_losses_.empty()) backend.download(device_losses, host_losses_.data(), host_losses_.size());
    backend.synchronize();
  }

  /// [parameter tensor]: its non-finite values in the last read().
  std::span<const float> counts() const { return host_counts_; }
  /// The micro-batch losses of the last read().
  std::span<const float> losses() const { return host_losses_; }
  /// What the last read() found not finite on device `device`: the text of its
  /// error, empty when all is finite; a loss first, else the first parameter
  /// tensor with non-finite gradients (`chunk_of[k]`: the local chunk of tensor
  /// k, whose stage `shape` gives).
  NonFiniteFinding finding(int device, std::span<const int> chunk_of, const ScheduleShape& shape) const {
    for (std::size_t m = 0; m < host_losses_.size(); ++m) {
      const float loss = host_losses_[m];
      if (!is_finite(loss))
        return {error_text({.device = device}, "the loss of micro-batch ", m, " is ",
                           loss != loss ? "nan" : "infinite"),
                true};
    }
    for (std::size_t k = 0; k < host_counts_.size(); ++k) {
      if (host_counts_[k] == 0.0f) continue;
      const int c = chunk_of[k];
      return {error_text({.device = device}, static_cast<long long>(host_counts_[k]), " gradient values of chunk ", c,
                         " (stage ", shape.stage_of(device, c), ") are not finite"),
              false};
    }
    return {};
  }
  /// Non-finite gradient values over all parameters in the last read().
  double bad_values() const {
    double n = 0;
    for (float c : host_counts_) n += c;
    return n;
  }

 private:
  std::vector<ParameterView> params_;
  typename B::Buffer counts_;
  std::vector<float> host_counts_, host_losses_;
};

}  // namespace pipeweave

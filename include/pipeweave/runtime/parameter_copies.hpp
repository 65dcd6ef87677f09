#pragma once
/// \file
/// Low-precision copies of a chunk's parameters, kept by the engine: a chunk
/// whose kernels compute with bf16 weights reads them instead of converting its
/// fp32 masters in every call.
///
/// A chunk asks for them (CopiesParameters) with `parameter_copy_dtype()`, a
/// floating dtype (fp32: none wanted), and takes them with
/// `use_parameter_copies(views)`: one ConstTensorRef per tensor of parameters(),
/// in order, `count` elements of that dtype each. The device session and the
/// sequential reference allocate them once, fill them from the fp32 parameters
/// before the first step, and refresh them after every update and after a state
/// is set, all on the backend's stream: a forward always reads the rounding of
/// the parameters it would read, so a chunk that uses them trains bit for bit
/// alike in a pipeline and in its reference.
///
/// \code
/// struct MyChunk {  // ... the Chunk members, and:
///   pipeweave::DType parameter_copy_dtype() const { return pipeweave::DType::kBF16; }
///   void use_parameter_copies(std::span<const pipeweave::ConstTensorRef> c) { w16_ = c[0].as<pipeweave::bf16>(); }
/// };
/// \endcode

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/runtime/dtype.hpp"
#include "pipeweave/runtime/error.hpp"

namespace pipeweave {

/// A chunk that takes copies of its parameters in a low precision (see the file comment).
template <class C>
concept CopiesParameters = requires(C& c, const C& cc, std::span<const ConstTensorRef> views) {
  { cc.parameter_copy_dtype() } -> std::convertible_to<DType>;
  c.use_parameter_copies(views);
};

namespace detail {

/// to[i] = from[i] rounded to T (a refresh of one copy).
template <class T>
struct CopyParameters {
  const float* from;
  T* to;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const { to[i] = from_float<T>(from[i]); }
};

}  // namespace detail

/// The copies of one chunk's parameters, in one dtype.
template <Backend B>
class ParameterCopies {
 public:
  /// Allocates a copy of each of `params` in `dtype` (a floating dtype) and fills them.
  ParameterCopies(B& backend, std::span<const ParameterView> params, DType dtype)
      : dtype_(dtype), params_(params.begin(), params.end()) {
    if (!dtype_row(dtype).floating)
      throw_error({}, "parameter copies of dtype ", dtype, ": a floating dtype (fp32 or bf16) is needed");
    for (const ParameterView& p : params_) {
      buffers_.push_back(allocate_tensor(backend, p.count, dtype));
      views_.push_back(tensor(buffers_.back(), dtype));
    }
    refresh(backend);
  }
  /// One view per parameter tensor, in order.
  std::span<const ConstTensorRef> views() const { return views_; }
  /// Enqueues each copy = its parameters rounded to the dtype (to nearest even).
  void refresh(B& backend) {
    visit_dtype<FloatingStorageTypes>(dtype_, [&]<class T>(T) {
      for (std::size_t i = 0; i < params_.size(); ++i)
        backend.for_each(params_[i].count,
                         detail::CopyParameters<T>{params_[i].value, tensor(buffers_[i], dtype_).template as<T>()});
    });
  }

 private:
  DType dtype_;
  std::vector<ParameterView> params_;
  std::vector<typename B::Buffer> buffers_;
  std::vector<ConstTensorRef> views_;
};

/// The copies of the chunks of a device (or of the sequential reference) that ask
/// for them, each handed to its chunk; refresh_all() after every update.
template <Backend B>
class ChunkParameterCopies {
 public:
  /// Makes and hands over the copies of every chunk of `chunks` that asks for them.
  template <class C>
  void make(B& backend, std::span<C> chunks) {
    if constexpr (CopiesParameters<C>) {
      for (C& c : chunks) {
        const DType d = c.parameter_copy_dtype();
        if (d == DType::kF32) continue;  // fp32: the masters themselves
        copies_.emplace_back(backend, std::span<const ParameterView>(c.parameters()), d);
        c.use_parameter_copies(copies_.back().views());
      }
    }
  }
  /// Enqueues the refresh of every copy.
  void refresh_all(B& backend) {
    for (ParameterCopies<B>& c : copies_) c.refresh(backend);
  }

 private:
  std::vector<ParameterCopies<B>> copies_;
};

}  // namespace pipeweave

#pragma once
/// \file
/// The element types of the tensors a pipeline hands between its chunks: one
/// table of dtypes (kDTypeRows), the C++ storage type of each (bf16 is a 16-bit
/// struct here; cuda/backend.hpp adds CUDA's __nv_bfloat16 as a second name for
/// it), the exact conversions between fp32 and bf16, and the typed views
/// (TensorRef, ConstTensorRef) through which the engine gives a chunk its
/// tensors: device memory and the dtype it holds.
///
/// A dtype is one row of kDTypeRows and one entry of StorageTypes (its C++
/// storage type, which names its row with DTypeOf); docs/extending.md says how to
/// add one.
///
/// \code
/// pipeweave::TensorRef y = ...;              // what the engine hands a chunk
/// pipeweave::bf16* out = y.as<pipeweave::bf16>();  // throws unless y holds bf16
/// out[0] = pipeweave::to_bf16(1.5f);         // rounded to nearest even, as a GPU does
/// \endcode

#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "pipeweave/runtime/error.hpp"

/// Marks a function as callable on the host and, under nvcc, on the device: the
/// call operators of the functors a backend runs (for_each, sum, for_each_element,
/// column_sums) and the dtype conversions. No CUDA header is needed for it.
#if defined(__CUDACC__)
#define PIPEWEAVE_HOST_DEVICE __host__ __device__
#else
#define PIPEWEAVE_HOST_DEVICE
#endif

namespace pipeweave {

/// The element type of a tensor at a chunk boundary, in the order of kDTypeRows.
enum class DType : unsigned char {
  kF32,   ///< IEEE binary32
  kBF16,  ///< bfloat16: fp32's sign and exponent, 7 explicit mantissa bits
  kI32,   ///< 32-bit signed integers (token ids for a first stage's embedding)
};

/// What the engine knows of a dtype.
struct DTypeRow {
  DType dtype;                  ///< the dtype
  std::string_view name;        ///< its name on command lines and in messages
  std::size_t bytes;            ///< bytes per element
  std::string_view safetensors; ///< its name in a safetensors header
  bool floating;                ///< a floating-point type (a loss may read it, a gradient may have it)
};

/// Every dtype, in the order of DType.
inline constexpr DTypeRow kDTypeRows[] = {
    {DType::kF32, "fp32", 4, "F32", true},
    {DType::kBF16, "bf16", 2, "BF16", true},
    {DType::kI32, "int32", 4, "I32", false},
};

/// The row of a dtype.
constexpr const DTypeRow& dtype_row(DType d) { return kDTypeRows[static_cast<int>(d)]; }
/// "fp32", "bf16" or "int32".
constexpr std::string_view dtype_name(DType d) { return dtype_row(d).name; }
/// Bytes per element.
constexpr std::size_t dtype_bytes(DType d) { return dtype_row(d).bytes; }

/// The dtype of that name; nothing for any other name.
constexpr std::optional<DType> parse_dtype(std::string_view name) {
  for (const DTypeRow& r : kDTypeRows)
    if (r.name == name) return r.dtype;
  return std::nullopt;
}

/// The dtype of a safetensors header's "dtype" entry ("F32", "BF16", "I32"); nothing for another.
constexpr std::optional<DType> parse_safetensors_dtype(std::string_view name) {
  for (const DTypeRow& r : kDTypeRows)
    if (r.safetensors == name) return r.dtype;
  return std::nullopt;
}

/// Appends the dtype's name (see error_text).
inline void append_to(std::string& s, DType d) { s += dtype_name(d); }

/// A bfloat16 value as stored: the high half of an fp32's bits.
struct bf16 {
  std::uint16_t bits = 0;
};

namespace detail {

PIPEWEAVE_HOST_DEVICE inline std::uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return std::bit_cast<std::uint32_t>(x);
#endif
}
PIPEWEAVE_HOST_DEVICE inline float bits_float(std::uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  return std::bit_cast<float>(b);
#endif
}

}  // namespace detail

/// x rounded to bf16, to nearest with ties to even, as the GPU's conversion
/// (cvt.rn.bf16.f32) does: infinities stay, a NaN becomes the canonical NaN
/// 0x7FFF, and values past bf16's largest finite round to infinity.
PIPEWEAVE_HOST_DEVICE inline bf16 to_bf16(float x) {
  const std::uint32_t b = detail::float_bits(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return bf16{0x7fff};  // NaN
  const std::uint32_t rounded = b + 0x7fffu + ((b >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(rounded >> 16)};
}
/// The fp32 value of a bf16 (exact).
PIPEWEAVE_HOST_DEVICE inline float to_float(bf16 x) { return detail::bits_float(static_cast<std::uint32_t>(x.bits) << 16); }
/// The value itself.
PIPEWEAVE_HOST_DEVICE inline float to_float(float x) { return x; }
/// x rounded to bf16 and back: the fp32 value a bf16 tensor would hold.
PIPEWEAVE_HOST_DEVICE inline float round_bf16(float x) { return to_float(to_bf16(x)); }

/// Stores fp32 `v` as a T: itself, or rounded to bf16.
template <class T>
PIPEWEAVE_HOST_DEVICE inline T from_float(float v) {
  if constexpr (std::is_same_v<T, bf16>)
    return to_bf16(v);
  else
    return v;
}

/// The C++ storage type of every dtype, in the order of DType.
using StorageTypes = std::tuple<float, bf16, std::int32_t>;

/// The dtype a storage type holds: DTypeOf<T>::value (specialized here for the
/// types of StorageTypes; cuda/backend.hpp adds __nv_bfloat16).
template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> : std::integral_constant<DType, DType::kF32> {};
template <>
struct DTypeOf<bf16> : std::integral_constant<DType, DType::kBF16> {};
template <>
struct DTypeOf<std::int32_t> : std::integral_constant<DType, DType::kI32> {};

/// A type the engine can view a tensor as.
template <class T>
concept Storage = requires { DTypeOf<std::remove_const_t<T>>::value; };

/// The storage types of the floating dtypes, those a loss reads and the built-in
/// MLP's activations may have.
using FloatingStorageTypes = std::tuple<float, bf16>;

namespace detail {

template <std::size_t... I>
constexpr bool storage_matches_rows(std::index_sequence<I...>) {
  return ((DTypeOf<std::tuple_element_t<I, StorageTypes>>::value == static_cast<DType>(I)) && ...) &&
         sizeof...(I) == std::size(kDTypeRows);
}
static_assert(storage_matches_rows(std::make_index_sequence<std::tuple_size_v<StorageTypes>>{}),
              "StorageTypes must list one storage type per row of kDTypeRows, in the order of DType");
static_assert(sizeof(bf16) == 2 && sizeof(float) == 4 && sizeof(std::int32_t) == 4);

template <class Types, class F, std::size_t... I>
void visit_in(DType d, F& f, std::index_sequence<I...>) {
  const bool found = ((DTypeOf<std::tuple_element_t<I, Types>>::value == d
                           ? (f(std::tuple_element_t<I, Types>{}), true)
                           : false) ||
                      ...);
  if (!found) throw_error({}, "a ", d, " tensor where a floating dtype (fp32 or bf16) is needed");
}

}  // namespace detail

/// Calls f(T{}) with the storage type T of dtype `d`, one of `Types`
/// (StorageTypes: every dtype; FloatingStorageTypes: fp32 and bf16); throws
/// pipeweave::Error naming `d` when it is not one of them.
template <class Types = StorageTypes, class F>
void visit_dtype(DType d, F&& f) {
  detail::visit_in<Types>(d, f, std::make_index_sequence<std::tuple_size_v<Types>>{});
}

/// A tensor in device memory viewed with its dtype: what the engine gives a
/// chunk and a loss. `P` is void (writable) or const void. Made implicitly from
/// a typed pointer (float*, bf16*, ...), so a chunk's own tests may pass plain
/// pointers; `as<T>()` gives the pointer back and throws pipeweave::Error when
/// the tensor holds another dtype.
template <class P>
class BasicTensorRef {
 public:
  BasicTensorRef() = default;
  /// The empty view (no tensor: e.g. the input gradient of the first stage).
  BasicTensorRef(std::nullptr_t) {}
  /// `data` holds elements of `dtype`.
  BasicTensorRef(P* data, DType dtype) : data_(data), dtype_(dtype) {}
  /// A typed pointer: its storage type says the dtype.
  template <Storage T>
    requires std::is_convertible_v<T*, P*>
  BasicTensorRef(T* data) : data_(data), dtype_(DTypeOf<std::remove_const_t<T>>::value) {}
  /// A writable view read only.
  template <class Q>
    requires(!std::is_same_v<Q, P> && std::is_convertible_v<Q*, P*>)
  BasicTensorRef(BasicTensorRef<Q> other) : data_(other.data()), dtype_(other.dtype()) {}

  /// The memory, or nullptr.
  P* data() const { return data_; }
  /// The dtype of its elements.
  DType dtype() const { return dtype_; }
  /// True unless empty.
  explicit operator bool() const { return data_ != nullptr; }
  /// The memory as T (const where this view is); nullptr when empty. Throws
  /// pipeweave::Error when T is not the storage type of the tensor's dtype.
  template <Storage T>
  auto as() const {
    using Out = std::conditional_t<std::is_const_v<P>, const T, T>*;
    if (data_ != nullptr && DTypeOf<std::remove_const_t<T>>::value != dtype_)
      throw_error({}, "a ", dtype_, " tensor was read as ", DTypeOf<std::remove_const_t<T>>::value);
    return static_cast<Out>(data_);
  }

 private:
  P* data_ = nullptr;
  DType dtype_ = DType::kF32;
};

/// A writable tensor view.
using TensorRef = BasicTensorRef<void>;
/// A read-only tensor view.
using ConstTensorRef = BasicTensorRef<const void>;

/// The dtypes of the two tensors at a chunk's ends.
struct BoundaryDTypes {
  DType input = DType::kF32;   ///< of x and dx
  DType output = DType::kF32;  ///< of y and dy
  friend constexpr bool operator==(const BoundaryDTypes&, const BoundaryDTypes&) = default;
};

}  // namespace pipeweave

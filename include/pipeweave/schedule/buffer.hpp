#pragma once
/// \file
/// detail::Buffer<T>: the flat heap array under every table of the schedule and
/// analysis layers (indexed by device, by step, or by (result, stage,
/// micro-batch)) and under the lowered program's storage. The same code runs in
/// constant evaluation and at run time.
///
/// Why not std::vector: in constant evaluation its layers are what the budget is
/// spent on. Measured with GCC 12 / libstdc++ 12 (operations counted by
/// -fconstexpr-ops-limit, per element) and Clang 14 (steps counted by
/// -fconstexpr-steps): value-initializing `std::vector<int>(n, -1)` costs 148
/// operations per element, `push_back` 190 after `reserve` (418 without), a
/// `std::array` or `std::span` subscript 45-60; `new T[n]` of a trivial T costs
/// nothing per element, a write through a pointer 6. Clang 14 also rejects
/// `std::vector<T>(n)` of a trivial T in a constant expression (libstdc++ fills it
/// before its elements' lifetime begins). Hot loops therefore index `data()`.
///
/// Elements of a trivial T hold no value until written: reading one first is
/// rejected in a constant expression, which the compile-time tests exercise.

#include <type_traits>

namespace pipeweave::detail {

/// Asks the processor to fetch data[i] into its caches when i < n (at run time,
/// with GCC or Clang; nothing in a constant expression). For the loops that
/// read the steps or actions of many devices in turns: each device's data is
/// read in order, but too many streams are interleaved for the hardware's
/// prefetchers to follow. Hot loops call it under `if
/// (!std::is_constant_evaluated())`, so that constant evaluation, where every
/// call counts against the compiler's budget, skips the call too.
template <class T>
constexpr void prefetch(const T* data, int i, int n) {
#if defined(__GNUC__) || defined(__clang__)
  if (!std::is_constant_evaluated() && i < n) __builtin_prefetch(data + i);
#endif
}

template <class T>
class Buffer {
 public:
  constexpr Buffer() = default;
  /// n elements, default-initialized.
  constexpr explicit Buffer(int n) {
    reserve(n);
    size_ = n;
  }
  /// n copies of `value`.
  constexpr Buffer(int n, const T& value) : Buffer(n) {
    for (int i = 0; i < n; ++i) data_[i] = value;
  }
  constexpr Buffer(const Buffer& o) : Buffer(o.size_) {
    for (int i = 0; i < size_; ++i) data_[i] = o.data_[i];
  }
  constexpr Buffer(Buffer&& o) noexcept : data_(o.data_), size_(o.size_), capacity_(o.capacity_) {
    o.data_ = nullptr;
    o.size_ = o.capacity_ = 0;
  }
  constexpr Buffer& operator=(const Buffer& o) {
    if (this != &o) *this = Buffer(o);
    return *this;
  }
  constexpr Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      delete[] data_;
      data_ = o.data_;
      size_ = o.size_;
      capacity_ = o.capacity_;
      o.data_ = nullptr;
      o.size_ = o.capacity_ = 0;
    }
    return *this;
  }
  constexpr ~Buffer() { delete[] data_; }

  constexpr int size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr T* data() { return data_; }
  constexpr const T* data() const { return data_; }
  constexpr T& operator[](int i) { return data_[i]; }
  constexpr const T& operator[](int i) const { return data_[i]; }
  constexpr T& back() { return data_[size_ - 1]; }
  constexpr const T& back() const { return data_[size_ - 1]; }

  /// Room for n elements without moving; the size is unchanged.
  constexpr void reserve(int n) {
    if (n <= capacity_) return;
    T* p = new T[n];
    for (int i = 0; i < size_; ++i) p[i] = data_[i];
    delete[] data_;
    data_ = p;
    capacity_ = n;
  }
  /// Appends; the capacity doubles when full, so n appends cost O(n).
  constexpr void push_back(const T& v) {
    if (size_ == capacity_) reserve(capacity_ < 4 ? 8 : 2 * capacity_);
    data_[size_++] = v;
  }
  /// Appends p[0, n).
  constexpr void append(const T* p, int n) {
    if (size_ + n > capacity_) reserve(size_ + n > 2 * capacity_ ? size_ + n : 2 * capacity_);
    for (int i = 0; i < n; ++i) data_[size_ + i] = p[i];
    size_ += n;
  }
  constexpr void pop_back() { --size_; }
  constexpr void clear() { size_ = 0; }
  /// Grows (new elements default-initialized) or shrinks to n elements.
  constexpr void resize(int n) {
    reserve(n);
    size_ = n;
  }

  friend constexpr bool operator==(const Buffer& a, const Buffer& b) {
    if (a.size_ != b.size_) return false;
    for (int i = 0; i < a.size_; ++i)
      if (!(a.data_[i] == b.data_[i])) return false;
    return true;
  }

 private:
  T* data_ = nullptr;
  int size_ = 0;
  int capacity_ = 0;
};

}  // namespace pipeweave::detail

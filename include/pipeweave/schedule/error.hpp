#pragma once
/// \file
/// The error core of every layer: pipeweave::Error, the one exception type the
/// library throws, and Text, the constexpr text buffer whose appenders (here
/// strings and integers; append_token in tokens.hpp, append_tensor in
/// dataflow.hpp) are the one wording of the library's values.
///
/// Why two error headers: this one is standard library only and
/// constant-evaluable, so that the schedule and analysis layers (which must
/// stay so) word their errors with it, at compile time too; its text is
/// bounded (Text::kCapacity). runtime/error.hpp is the run-time face of the
/// same core: unbounded std::string messages, the "device 1, step 12: " prefix
/// (Where) and throw_error(); its append_to() spells every schedule value with
/// the appenders of this layer instead of wording it again.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace pipeweave {

/// Thrown for every run-time error; the message says where and what was expected.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Fixed-capacity text that can be built during constant evaluation.
/// Text longer than the capacity is cut, never overflowed.
class Text {
 public:
  static constexpr std::size_t kCapacity = 384;

  constexpr Text() = default;
  constexpr explicit Text(std::string_view s) { append(s); }

  /// Appends a string; whatever does not fit is dropped.
  constexpr Text& append(std::string_view s) {
    for (char c : s) {
      if (size_ + 1 >= kCapacity) break;
      data_[size_++] = c;
    }
    data_[size_] = '\0';
    return *this;
  }
  /// Appends a decimal integer.
  constexpr Text& append(long long v) {
    char digits[24] = {};
    int n = 0;
    bool negative = v < 0;
    unsigned long long u = negative ? 0ULL - static_cast<unsigned long long>(v)
                                    : static_cast<unsigned long long>(v);
    do {
      digits[n++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u != 0);
    if (negative) append(std::string_view("-"));
    while (n > 0) {
      char c[1] = {digits[--n]};
      append(std::string_view(c, 1));
    }
    return *this;
  }
  constexpr Text& append(int v) { return append(static_cast<long long>(v)); }
  constexpr Text& append(const Text& t) { return append(t.view()); }
  constexpr Text& append(const char* s) { return append(std::string_view(s)); }

  template <class T>
  constexpr Text& operator<<(const T& v) {
    return append(v);
  }

  constexpr std::string_view view() const { return std::string_view(data_, size_); }
  constexpr const char* c_str() const { return data_; }
  constexpr std::size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  std::string str() const { return std::string(view()); }

 private:
  char data_[kCapacity] = {};
  std::size_t size_ = 0;
};

}  // namespace pipeweave

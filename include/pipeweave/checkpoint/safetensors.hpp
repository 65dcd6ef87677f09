#pragma once
/// \file
/// The safetensors format, written and read: an 8-byte little-endian header
/// length N, N bytes of JSON (each tensor's dtype, shape and data_offsets into
/// the data that follows, and an optional "__metadata__" of strings), padded with
/// spaces to a multiple of 8, then the tensors' raw little-endian bytes, back to
/// back. Files written here hold F32 tensors; the reader takes F32 and BF16
/// (widened to fp32) and knows every dtype name of the format, so that a file
/// of another dtype is refused by name. The JSON
/// goes through nlohmann-json; the checksum is zlib's CRC-32, which Python's
/// zlib.crc32 computes too. POSIX file I/O (open, write, fsync).
///
/// \code
/// // const std::vector<float> w(6, 1.0f);
/// // pipeweave::checkpoint::TensorOut t{"layers.0.weight", {2, 3}, w};
/// // auto record = pipeweave::checkpoint::write_safetensors("/tmp/x.safetensors", {&t, 1}, {});
/// // pipeweave::checkpoint::SafetensorsFile f(pipeweave::checkpoint::read_bytes("/tmp/x.safetensors"), "x");
/// // std::vector<float> back = f.read("layers.0.weight", std::vector<std::int64_t>{2, 3});
/// \endcode

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/runtime/dtype.hpp"
#include "pipeweave/runtime/error.hpp"

namespace pipeweave::checkpoint {

static_assert(std::endian::native == std::endian::little, "checkpoint: safetensors data is little-endian; "
                                                          "this host is not");

/// The largest JSON header read (the format's own readers refuse more than 100 MB).
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

/// One tensor to write: its name, shape and fp32 values (as many as the shape's product).
struct TensorOut {
  std::string name;
  std::vector<std::int64_t> shape;
  std::span<const float> values;
};

/// A file written: its name (within its directory), size, CRC-32 of every byte,
/// and the tensors it holds.
struct FileRecord {
  std::string name;
  std::uint64_t bytes = 0;
  std::uint32_t crc32 = 0;
  std::vector<std::string> tensors;
};

/// What a file's header says of one tensor.
struct TensorEntry {
  std::string dtype;                ///< e.g. "F32"
  std::vector<std::int64_t> shape;  ///< its dimensions
  std::uint64_t begin = 0, end = 0;  ///< byte offsets into the data
};

/// "[2, 3]".
inline std::string shape_text(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// The CRC-32 of `n` bytes continuing `crc` (0 to start).
inline std::uint32_t crc32_of(std::uint32_t crc, const void* data, std::size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {  // crc32_z takes z_size_t, but keep each call within 1 GiB
    const std::size_t part = std::min<std::size_t>(n, std::size_t{1} << 30);
    crc = static_cast<std::uint32_t>(::crc32_z(crc, p, static_cast<z_size_t>(part)));
    p += part;
    n -= part;
  }
  return crc;
}

/// "0x1234abcd".
inline std::string crc_text(std::uint32_t crc) {
  char s[16];
  std::snprintf(s, sizeof s, "0x%08x", crc);
  return s;
}

namespace detail {

/// An open file descriptor, closed on destruction.
class Fd {
 public:
  Fd(const std::filesystem::path& path, int flags, std::string_view what, mode_t mode = 0644)
      : fd_(::open(path.c_str(), flags | O_CLOEXEC, mode)), path_(path) {
    if (fd_ < 0) throw_error({}, "checkpoint: cannot ", what, " ", path.string(), ": ", std::strerror(errno));
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  /// Writes all `n` bytes.
  void write_all(const void* data, std::size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, std::min<std::size_t>(n, std::size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw_error({}, "checkpoint: writing ", path_.string(), ": ", std::strerror(errno));
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  /// Flushes the file's data and metadata to the disk.
  void sync() {
    if (::fsync(fd_) != 0) throw_error({}, "checkpoint: fsync of ", path_.string(), ": ", std::strerror(errno));
  }
  /// Closes, reporting a failure (a write error that close finds).
  void close() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw_error({}, "checkpoint: closing ", path_.string(), ": ", std::strerror(errno));
  }

 private:
  int fd_;
  std::filesystem::path path_;
};

}  // namespace detail

/// Flushes a directory's entries (a rename or a new file in it) to the disk.
inline void sync_directory(const std::filesystem::path& dir) {
  detail::Fd d(dir, O_RDONLY | O_DIRECTORY, "open the directory");
  d.sync();
}

/// Every byte of the file at `path`. Throws pipeweave::Error when it cannot be read.
inline std::vector<char> read_bytes(const std::filesystem::path& path) {
  detail::Fd f(path, O_RDONLY, "open");
  struct stat st {};
  if (::fstat(f.get(), &st) != 0) throw_error({}, "checkpoint: stat of ", path.string(), ": ", std::strerror(errno));
  std::vector<char> out(static_cast<std::size_t>(st.st_size));
  std::size_t at = 0;
  while (at < out.size()) {
    const ssize_t r = ::read(f.get(), out.data() + at, std::min<std::size_t>(out.size() - at, std::size_t{1} << 30));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw_error({}, "checkpoint: reading ", path.string(), ": ", std::strerror(errno));
    if (r == 0) break;  // shorter than it was a moment ago
    at += static_cast<std::size_t>(r);
  }
  out.resize(at);
  return out;
}

/// The JSON header of a file of `tensors` (in that order, back to back) with
/// `metadata`, padded with spaces to a multiple of 8 bytes.
inline std::string safetensors_header(std::span<const TensorOut> tensors,
                                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::uint64_t at = 0;
  for (const TensorOut& t : tensors) {
    const std::uint64_t bytes = t.values.size() * sizeof(float);
    h[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = h.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  return text;
}

/// Writes `tensors` as a new safetensors file at `path` (which must not exist),
/// fsynced before it returns. Throws pipeweave::Error when a tensor's values do
/// not fill its shape, or the file cannot be written.
inline FileRecord write_safetensors(const std::filesystem::path& path, std::span<const TensorOut> tensors,
                                    const std::map<std::string, std::string>& metadata) {
  FileRecord record{path.filename().string(), 0, 0, {}};
  for (const TensorOut& t : tensors) {
    std::int64_t n = 1;
    for (std::int64_t d : t.shape) n *= d;
    if (n != static_cast<std::int64_t>(t.values.size()))
      throw_error({}, "checkpoint: tensor ", t.name, " of shape ", shape_text(t.shape), " has ", t.values.size(),
                  " values");
    record.tensors.push_back(t.name);
  }
  const std::string header = safetensors_header(tensors, metadata);
  unsigned char length[8];
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));
  detail::Fd f(path, O_WRONLY | O_CREAT | O_EXCL, "create");
  std::uint32_t crc = crc32_of(0, length, 8);
  f.write_all(length, 8);
  crc = crc32_of(crc, header.data(), header.size());
  f.write_all(header.data(), header.size());
  record.bytes = 8 + header.size();
  for (const TensorOut& t : tensors) {
    const std::size_t bytes = t.values.size() * sizeof(float);
    crc = crc32_of(crc, t.values.data(), bytes);
    f.write_all(t.values.data(), bytes);
    record.bytes += bytes;
  }
  f.sync();
  f.close();
  record.crc32 = crc;
  return record;
}

/// A safetensors file in memory, its header parsed and checked: every tensor's
/// dtype known, its offsets inside the data and matching its shape, and the
/// tensors covering the data without gaps or overlaps. `label` names the file in
/// every error.
class SafetensorsFile {
 public:
  /// Parses `bytes`. Throws pipeweave::Error naming the file and the rule broken.
  SafetensorsFile(std::vector<char> bytes, std::string label) : bytes_(std::move(bytes)), label_(std::move(label)) {
    if (bytes_.size() < 8) fail("", "is ", bytes_.size(), " bytes long, shorter than the 8-byte header length");
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes_[i])) << (8 * i);
    if (n > kMaxHeaderBytes || n > bytes_.size() - 8)
      fail("", "says its header is ", n, " bytes, but the file has ", bytes_.size() - 8, " after the length");
    data_ = 8 + n;
    nlohmann::json h;
    try {
      h = nlohmann::json::parse(bytes_.begin() + 8, bytes_.begin() + static_cast<std::ptrdiff_t>(data_));
    } catch (const nlohmann::json::exception& e) {
      fail("", "the header is not JSON (", e.what(), ")");
    }
    if (!h.is_object()) fail("", "the header is not a JSON object");
    std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
    for (auto it = h.begin(); it != h.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it->is_object()) fail("", "__metadata__ is not an object");
        for (auto m = it->begin(); m != it->end(); ++m)
          if (m->is_string()) metadata_[m.key()] = m->get<std::string>();
        continue;
      }
      tensors_[it.key()] = entry(it.key(), *it);
      spans.emplace_back(tensors_[it.key()].begin, tensors_[it.key()].end);
    }
    std::sort(spans.begin(), spans.end());
    std::uint64_t at = 0;
    for (const auto& [b, e] : spans) {
      if (b != at) fail("", "its tensors leave a gap or overlap at data byte ", std::min(b, at));
      at = e;
    }
    if (at != bytes_.size() - data_)
      fail("", "its tensors cover ", at, " data bytes, but the file has ", bytes_.size() - data_);
  }

  /// The label errors name.
  const std::string& label() const { return label_; }
  /// The tensors by name.
  const std::map<std::string, TensorEntry>& tensors() const { return tensors_; }
  /// The header's __metadata__.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// The values of tensor `name`, which must have `shape`, as fp32: an F32
  /// tensor as stored, a BF16 one widened (exactly). Throws pipeweave::Error
  /// naming the file and the tensor when it is missing or of another dtype or shape.
  std::vector<float> read(std::string_view name, std::span<const std::int64_t> shape) const {
    const auto it = tensors_.find(std::string(name));
    if (it == tensors_.end()) fail(name, "is missing");
    const TensorEntry& t = it->second;
    const std::optional<DType> dtype = parse_safetensors_dtype(t.dtype);
    if (!dtype || !dtype_row(*dtype).floating) {
      std::string floating;
      for (const DTypeRow& r : kDTypeRows)
        if (r.floating) floating += std::string(floating.empty() ? "" : " or ") + std::string(r.safetensors);
      fail(name, "has dtype ", t.dtype, "; expected ", floating);
    }
    if (!std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end()))
      fail(name, "has shape ", shape_text(t.shape), "; this model's is ", shape_text(shape));
    std::vector<float> out((t.end - t.begin) / dtype_bytes(t.dtype));
    const char* at = bytes_.data() + data_ + t.begin;
    visit_dtype<FloatingStorageTypes>(*dtype, [&]<class T>(T) {
      for (std::size_t i = 0; i < out.size(); ++i) {
        T v;
        std::memcpy(&v, at + i * sizeof(T), sizeof(T));
        out[i] = to_float(v);
      }
    });
    return out;
  }

 private:
  template <class... Parts>
  [[noreturn]] void fail(std::string_view tensor, const Parts&... parts) const {
    if (tensor.empty()) throw_error({}, "checkpoint: ", label_, ": ", parts...);
    throw_error({}, "checkpoint: ", label_, ": tensor ", tensor, " ", parts...);
  }

  static std::uint64_t dtype_bytes(std::string_view d) {
    static const std::map<std::string_view, std::uint64_t> sizes = {
        {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
        {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4}, {"F64", 8}, {"I64", 8}, {"U64", 8}};
    const auto it = sizes.find(d);
    return it == sizes.end() ? 0 : it->second;
  }

  TensorEntry entry(const std::string& name, const nlohmann::json& j) const {
    TensorEntry t;
    try {
      t.dtype = j.at("dtype").get<std::string>();
      t.shape = j.at("shape").get<std::vector<std::int64_t>>();
      const auto offsets = j.at("data_offsets").get<std::vector<std::uint64_t>>();
      if (offsets.size() != 2) fail(name, "has ", offsets.size(), " data_offsets; expected 2");
      t.begin = offsets[0];
      t.end = offsets[1];
    } catch (const nlohmann::json::exception& e) {
      fail(name, "has no valid dtype, shape and data_offsets (", e.what(), ")");
    }
    const std::uint64_t size = dtype_bytes(t.dtype);
    if (size == 0) fail(name, "has dtype ", t.dtype, ", which safetensors does not define");
    std::uint64_t n = size;
    for (std::int64_t d : t.shape) {
      if (d < 0) fail(name, "has a negative dimension in shape ", shape_text(t.shape));
      if (d > 0 && n > (std::uint64_t{1} << 62) / static_cast<std::uint64_t>(d)) fail(name, "is too large");
      n *= static_cast<std::uint64_t>(d);
    }
    if (t.end < t.begin || t.end > bytes_.size() - data_)
      fail(name, "has data_offsets [", t.begin, ", ", t.end, ") outside the ", bytes_.size() - data_,
           " data bytes (truncated?)");
    if (t.end - t.begin != n)
      fail(name, "has ", t.end - t.begin, " bytes, but dtype ", t.dtype, " and shape ", shape_text(t.shape),
           " need ", n);
    return t;
  }

  std::vector<char> bytes_;
  std::string label_;
  std::uint64_t data_ = 0;  // where the data starts
  std::map<std::string, TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace pipeweave::checkpoint

#pragma once
/// \file
/// A checkpoint on disk and the protocol that keeps the last good one loadable.
///
/// A root directory holds checkpoints `step-00000010/` (each a manifest.json and
/// the files it lists), and `latest`, a one-line file naming the newest. A save:
/// 1. writes every file into a fresh `.tmp-...` directory of the root, each
///    fsynced (FileRecord: size and CRC-32);
/// 2. writes the manifest (the run's settings, the step, every file with its size
///    and checksum, which file holds each tensor), fsyncs it, then the directory;
/// 3. renames the directory to `step-N` (never over an existing one: `step-N.1`
///    then), fsyncs the root;
/// 4. writes `latest.tmp`, fsyncs it, renames it over `latest`, fsyncs the root.
/// Nothing that exists is written over until the rename of step 4, which is
/// atomic: a crash or `kill -9` at any instant leaves `latest` naming a complete
/// checkpoint (the previous one, or the new one). What an interrupted save left
/// (`.tmp-...`) is removed by the next save. One run writes into a root at a time.
///
/// Loading reads the manifest, then each file it needs, and refuses (with the
/// file, the tensor and the rule) a file whose size or checksum is not the
/// manifest's, before anything is used.
///
/// \code
/// // auto pending = pipeweave::checkpoint::PendingCheckpoint::begin("ckpt", 10);
/// // records.push_back(write_safetensors(pending.directory() / "model-0-of-1.safetensors", tensors, {}));
/// // pending.commit(manifest, records, /*keep=*/0);               // ckpt/step-00000010, ckpt/latest
/// // const pipeweave::checkpoint::Opened c = pipeweave::checkpoint::open_checkpoint("ckpt");
/// \endcode

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "pipeweave/checkpoint/safetensors.hpp"
#include "pipeweave/runtime/error.hpp"

namespace pipeweave::checkpoint {

/// The manifest's name in a checkpoint directory.
inline constexpr std::string_view kManifestName = "manifest.json";
/// The pointer to the newest checkpoint in a root.
inline constexpr std::string_view kLatestName = "latest";
/// The manifest's "format".
inline constexpr std::string_view kFormat = "pipeweave-checkpoint";
/// The manifest's "version" this build writes and reads.
inline constexpr int kVersion = 1;

/// "step-00000010".
inline std::string step_directory(long long step) {
  char s[40];
  std::snprintf(s, sizeof s, "step-%08lld", step);
  return s;
}

namespace detail {

inline void write_small_file(const std::filesystem::path& path, std::string_view text, int flags) {
  Fd f(path, O_WRONLY | O_CREAT | flags, "create");
  f.write_all(text.data(), text.size());
  f.sync();
  f.close();
}

inline void rename_or_throw(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw_error({}, "checkpoint: renaming ", from.string(), " to ", to.string(), ": ", std::strerror(errno));
}

// The step of a directory named step-N or step-N.K; -1 for other names.
inline long long step_of(const std::string& name) {
  if (name.rfind("step-", 0) != 0) return -1;
  try {
    return std::stoll(name.substr(5));
  } catch (...) {
    return -1;
  }
}

}  // namespace detail

/// Removes what interrupted saves left in `root`: its `.tmp-*` directories and `latest.tmp`.
inline void remove_stale(const std::filesystem::path& root) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0 || name == std::string(kLatestName) + ".tmp") std::filesystem::remove_all(e.path(), ec);
  }
}

/// A checkpoint being written (see the file comment): files go into
/// directory(); commit() puts it in place. Unless committed, the directory is
/// removed when the object goes (by the process that began it).
class PendingCheckpoint {
 public:
  /// Starts the checkpoint of `step` in `root`, which is created if missing:
  /// removes what interrupted saves left there and makes a fresh temporary
  /// directory. Throws pipeweave::Error when the root cannot be written.
  static PendingCheckpoint begin(const std::filesystem::path& root, long long step) {
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    if (ec) throw_error({}, "checkpoint: cannot create ", root.string(), ": ", ec.message());
    remove_stale(root);
    std::random_device rd;
    char name[64];
    std::snprintf(name, sizeof name, ".tmp-%s-%08x", step_directory(step).c_str(), rd());
    const std::filesystem::path tmp = root / name;
    if (!std::filesystem::create_directory(tmp, ec) || ec)
      throw_error({}, "checkpoint: cannot create ", tmp.string(), ": ", ec ? ec.message() : "it exists");
    return PendingCheckpoint(root, tmp, step, true);
  }
  /// The checkpoint another process began at `tmp` (the ranks of a multi-process
  /// run write into rank 0's); this object never removes it.
  static PendingCheckpoint join(const std::filesystem::path& root, const std::filesystem::path& tmp, long long step) {
    return PendingCheckpoint(root, tmp, step, false);
  }

  PendingCheckpoint(PendingCheckpoint&& o) noexcept
      : root_(std::move(o.root_)), tmp_(std::move(o.tmp_)), step_(o.step_), owner_(std::exchange(o.owner_, false)) {}
  PendingCheckpoint& operator=(PendingCheckpoint&&) = delete;
  ~PendingCheckpoint() {
    if (owner_) abandon();
  }

  /// Where the files go.
  const std::filesystem::path& directory() const { return tmp_; }
  /// The step being saved.
  long long step() const { return step_; }

  /// Writes `manifest` with "format", "version", "step", "files" (each record's
  /// name, bytes, crc32) and "tensors" (which file holds each) added, then puts
  /// the checkpoint in place and moves `latest` to it (steps 2-4 of the file
  /// comment); with keep > 0, then removes all but the `keep` checkpoints of the
  /// highest steps (never the new one). Returns the checkpoint's directory.
  std::filesystem::path commit(nlohmann::ordered_json manifest, const std::vector<FileRecord>& files, int keep = 0) {
    nlohmann::ordered_json out;
    out["format"] = kFormat;
    out["version"] = kVersion;
    out["step"] = step_;
    for (auto it = manifest.begin(); it != manifest.end(); ++it) out[it.key()] = it.value();
    nlohmann::ordered_json list = nlohmann::ordered_json::array(), tensors = nlohmann::ordered_json::object();
    for (const FileRecord& f : files) {
      list.push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32", crc_text(f.crc32)}});
      for (const std::string& t : f.tensors) tensors[t] = f.name;
    }
    out["files"] = std::move(list);
    out["tensors"] = std::move(tensors);
    detail::write_small_file(tmp_ / kManifestName, out.dump(1) + "\n", O_EXCL);
    sync_directory(tmp_);
    std::filesystem::path target = root_ / step_directory(step_);
    for (int k = 1; std::filesystem::exists(target); ++k)
      target = root_ / (step_directory(step_) + "." + std::to_string(k));
    detail::rename_or_throw(tmp_, target);
    owner_ = false;
    sync_directory(root_);
    const std::filesystem::path pointer = root_ / (std::string(kLatestName) + ".tmp");
    detail::write_small_file(pointer, target.filename().string() + "\n", O_TRUNC);
    detail::rename_or_throw(pointer, root_ / kLatestName);
    sync_directory(root_);
    if (keep > 0) prune(target, keep);
    return target;
  }

  /// Removes the temporary directory (an abandoned save).
  void abandon() noexcept {
    std::error_code ec;
    std::filesystem::remove_all(tmp_, ec);
    owner_ = false;
  }

 private:
  PendingCheckpoint(std::filesystem::path root, std::filesystem::path tmp, long long step, bool owner)
      : root_(std::move(root)), tmp_(std::move(tmp)), step_(step), owner_(owner) {}

  void prune(const std::filesystem::path& newest, int keep) {
    std::vector<std::pair<long long, std::filesystem::path>> all;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(root_, ec))
      if (const long long s = detail::step_of(e.path().filename().string()); s >= 0 && e.is_directory())
        all.emplace_back(s, e.path());
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a > b; });
    int kept = 1;  // the new one
    for (const auto& [s, path] : all) {
      if (path == newest) continue;
      if (kept < keep) {
        ++kept;
        continue;
      }
      std::filesystem::remove_all(path, ec);
    }
  }

  std::filesystem::path root_, tmp_;
  long long step_;
  bool owner_;
};

/// A checkpoint opened for loading: its directory, its manifest (checked for
/// format and version), its files' records and which file holds each tensor.
struct Opened {
  std::filesystem::path directory;
  nlohmann::json manifest;
  long long step = 0;
  std::map<std::string, FileRecord> files;
  std::map<std::string, std::string> tensor_file;
};

/// The checkpoint `path` names: `path` itself when it holds a manifest, else the
/// one its `latest` names. Throws pipeweave::Error when there is none.
inline std::filesystem::path find_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec))
    throw_error({}, "checkpoint: ", path.string(), " is not a directory");
  if (std::filesystem::exists(path / kManifestName, ec)) return path;
  if (!std::filesystem::exists(path / kLatestName, ec))
    throw_error({}, "checkpoint: ", path.string(), " holds no checkpoint (neither ", kManifestName, " nor ",
                kLatestName, ")");
  std::vector<char> bytes = read_bytes(path / kLatestName);
  std::string name(bytes.begin(), bytes.end());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    throw_error({}, "checkpoint: ", (path / kLatestName).string(), " does not name a checkpoint directory");
  if (!std::filesystem::exists(path / name / kManifestName, ec))
    throw_error({}, "checkpoint: ", (path / kLatestName).string(), " names ", name, ", which holds no ", kManifestName);
  return path / name;
}

/// Opens the checkpoint `path` names (find_checkpoint) and checks its manifest.
inline Opened open_checkpoint(const std::filesystem::path& path) {
  Opened c;
  c.directory = find_checkpoint(path);
  const std::filesystem::path file = c.directory / kManifestName;
  const std::vector<char> bytes = read_bytes(file);
  try {
    c.manifest = nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    throw_error({}, "checkpoint: ", file.string(), " is not JSON (", e.what(), ")");
  }
  try {
    if (c.manifest.at("format").get<std::string>() != kFormat)
      throw_error({}, "checkpoint: ", file.string(), " is not a ", kFormat, " manifest");
    if (const int v = c.manifest.at("version").get<int>(); v != kVersion)
      throw_error({}, "checkpoint: ", file.string(), " is of format version ", v, "; this build reads version ",
                  kVersion);
    c.step = c.manifest.at("step").get<long long>();
    for (const auto& f : c.manifest.at("files")) {
      FileRecord r;
      r.name = f.at("name").get<std::string>();
      r.bytes = f.at("bytes").get<std::uint64_t>();
      r.crc32 = static_cast<std::uint32_t>(std::stoul(f.at("crc32").get<std::string>(), nullptr, 16));
      if (r.name.empty() || r.name.find('/') != std::string::npos || r.name[0] == '.')
        throw_error({}, "checkpoint: ", file.string(), " lists a file named '", r.name, "'");
      c.files[r.name] = r;
    }
    for (auto it = c.manifest.at("tensors").begin(); it != c.manifest.at("tensors").end(); ++it) {
      const std::string name = it.value().get<std::string>();
      if (!c.files.contains(name))
        throw_error({}, "checkpoint: ", file.string(), " puts tensor ", it.key(), " in ", name, ", which it does not list");
      c.tensor_file[it.key()] = name;
    }
  } catch (const nlohmann::json::exception& e) {
    throw_error({}, "checkpoint: ", file.string(), " lacks a field or has one of the wrong type (", e.what(), ")");
  } catch (const std::logic_error& e) {  // stoul
    throw_error({}, "checkpoint: ", file.string(), " has a crc32 that is not a hexadecimal number");
  }
  return c;
}

/// File `name` of checkpoint `c`, read and checked against the manifest (its
/// size, then its CRC-32), then parsed. Throws pipeweave::Error naming the file.
inline SafetensorsFile read_checked(const Opened& c, const std::string& name) {
  const FileRecord& r = c.files.at(name);
  const std::filesystem::path path = c.directory / name;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw_error({}, "checkpoint: ", path.string(), " is missing; the manifest lists it");
  std::vector<char> bytes = read_bytes(path);
  if (bytes.size() != r.bytes)
    throw_error({}, "checkpoint: ", path.string(), " has ", bytes.size(), " bytes; the manifest says ", r.bytes,
                " (truncated, or written over)");
  if (const std::uint32_t crc = crc32_of(0, bytes.data(), bytes.size()); crc != r.crc32)
    throw_error({}, "checkpoint: ", path.string(), " has checksum ", crc_text(crc), "; the manifest says ",
                crc_text(r.crc32), ": the file is damaged");
  return SafetensorsFile(std::move(bytes), path.string());
}

}  // namespace pipeweave::checkpoint

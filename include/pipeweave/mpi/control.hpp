#pragma once
/// \file
/// The control plane of a multi-process run, shared by the multi-process host
/// (mpi/pipeline.hpp) and the transport endpoint of its rank, whatever moves the
/// tensors (MPI point-to-point on the CPU, NCCL on GPUs). Standard library and
/// MPI only.
///
/// - The failure protocol. A rank that fails sends a notice with its reason to
///   every other rank, on a communicator of its own, stamped with the number of
///   collectives it completed. Every wait of every rank (a collective below, the
///   transport's own waits, the GPU finishing a step) polls for notices, so once
///   one rank has failed every other one stops with an error that names it,
///   instead of hanging; only a collective that the failed rank did complete (say
///   the agreement of a step, before it failed in the optimizer step) still
///   completes, since every rank runs the same collectives in the same order.
/// - The collectives of a run after start-up (the agreement of a step, the loss,
///   the gathers of the trace and the parameters) are non-blocking and polled that
///   way, each with the timeout. A collective abandoned on a failure leaves its
///   communicator unusable (the others may never match it), so reset(), which
///   every rank calls before the next step, replaces that communicator on every
///   rank and starts a new generation of notices (older ones are dropped).
/// - A lost rank (its process killed or crashed) sends no notice. The wait that
///   then runs out of time calls a roll call before it reports: every other rank
///   answers in its next poll, and the error names the ranks that do not answer
///   within half a second. The other ranks stop on that rank's notice, which
///   names them too, and every rank that learns of a lost rank ends without
///   MPI_Finalize (bootstrap.hpp), which would wait for it. (Under a plain
///   `mpirun` the launcher itself ends every rank once one dies; with `mpirun
///   --enable-recovery` the ranks find out as described.)
/// - The start-up agreement (agree_to_start): every rank reports its settings
///   (runtime/config_hash.hpp) and whatever keeps it from starting; either all
///   start, or all refuse with the same message, which names the first setting
///   that differs.
///
/// \code
/// // every rank:
/// // pipeweave::mpi::Control control(MPI_COMM_WORLD, std::chrono::seconds(30));
/// // pipeweave::mpi::agree_to_start(control, config, problem);  // throws on every rank, or on none
/// // const bool all_ok = control.agree(ok, step);
/// \endcode

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "pipeweave/mpi/bootstrap.hpp"
#include "pipeweave/runtime/config_hash.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave::mpi {

namespace detail {

/// Keeps `buffers` alive until the process ends: the buffers of MPI operations
/// that a failure left pending for good (MPI may still read or write them), kept
/// reachable rather than leaked.
inline void keep_until_exit(std::shared_ptr<void> buffers) {
  static std::mutex lock;
  static std::vector<std::shared_ptr<void>> kept;
  const std::lock_guard guard(lock);
  kept.push_back(std::move(buffers));
}

}  // namespace detail

/// The control plane of one rank (see the file comment). Not thread-safe: the
/// rank's thread uses it.
class Control {
 public:
  /// gather() onto every rank.
  static constexpr int kEveryRank = -1;

  /// Collective over `comm`, the first call of a run on every rank: duplicates
  /// `comm` for the notices and for the collectives, and finds the rank's index on
  /// its machine (from the processor names of all ranks). Polled like every wait:
  /// a rank that never arrives (e.g. it stopped on a bad argument) makes the others
  /// give up after `timeout` instead of hanging.
  Control(MPI_Comm comm, std::chrono::milliseconds timeout) : timeout_(timeout), buffers_(new Buffers) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    grid_ = {size_, 1, RankLayout::kDpAdjacent};
    notices_ = duplicate(comm);
    collectives_ = duplicate(comm);
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    check_mpi(MPI_Get_processor_name(name, &length), "MPI_Get_processor_name");
    const std::vector<std::vector<char>> names =
        gather(std::vector<char>(name, name + length), kEveryRank, -1);
    for (int r = 0; r < rank_; ++r) local_rank_ += names[static_cast<std::size_t>(r)] == names[static_cast<std::size_t>(rank_)];
  }
  Control(const Control&) = delete;
  Control& operator=(const Control&) = delete;
  /// Frees the communicators (not one with a collective pending: it is left alone).
  ~Control() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (notices_ != MPI_COMM_NULL && !broken_) MPI_Comm_free(&notices_);
    if (collectives_ != MPI_COMM_NULL && !spent_) MPI_Comm_free(&collectives_);
  }

  /// This rank.
  int rank() const { return rank_; }
  /// Number of ranks.
  int size() const { return size_; }
  /// Where the ranks sit: D replicas of a P-device pipeline (by default one
  /// replica, rank d holding device d). Set by the host before anything uses it.
  const RankGrid& grid() const { return grid_; }
  /// Sets grid(); `grid.ranks()` must be size(). Local.
  void set_grid(const RankGrid& grid) {
    if (grid.devices < 1 || grid.replicas < 1 || grid.ranks() != size_)
      throw_error({}, grid.devices, " devices x ", grid.replicas, " replicas make ", grid.ranks(), " ranks, but ",
                  size_, " were started");
    grid_ = grid;
  }
  /// The pipeline device this rank holds.
  int device() const { return grid_.device(rank_); }
  /// The number of pipeline devices P.
  int devices() const { return grid_.devices; }
  /// The replica this rank belongs to.
  int replica() const { return grid_.replica(rank_); }
  /// The rank of device `device` of this rank's replica.
  int rank_of(int device) const { return grid_.rank(replica(), device); }
  /// This rank's index among the ranks on its machine.
  int local_rank() const { return local_rank_; }
  /// The longest a wait may take.
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// The communicator of the collectives; a transport that runs its own (e.g.
  /// NCCL's id broadcast) waits for them with wait().
  MPI_Comm collectives() const { return collectives_; }

  /// Receives the notices that arrived; true once a rank (this one included) has
  /// failed in this generation.
  bool failed() {
    answer_roll_calls();
    for (;;) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, notices_, &flag, &status) != MPI_SUCCESS || !flag) break;
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      std::string text(static_cast<std::size_t>(count), '\0');
      MPI_Recv(text.data(), count, MPI_BYTE, status.MPI_SOURCE, kNoticeTag, notices_, MPI_STATUS_IGNORE);
      if (text.size() < kNoticeHeader) continue;
      std::uint64_t g = 0, completed = 0, lost = 0;
      std::memcpy(&g, text.data(), 8);
      std::memcpy(&completed, text.data() + 8, 8);
      std::memcpy(&lost, text.data() + 16, 8);
      if (g != generation_) continue;
      if (lost != 0) detail::rank_lost().store(true);
      if (completed >= failed_after_) continue;
      failed_after_ = completed;
      reason_ = error_text({}, "rank ", status.MPI_SOURCE, " failed: ", text.substr(kNoticeHeader));
    }
    return failed_after_ != kNever;
  }
  /// Why the run stopped (empty while nothing failed).
  const std::string& reason() const { return reason_; }

  /// This rank failed: tells every other rank (once per generation), with the
  /// number of collectives it completed, so that a rank waiting for one that this
  /// rank did complete still gets its result. Never throws.
  void abort(std::string_view why) noexcept {
    if (failed_after_ == completed_) return;
    failed_after_ = completed_;
    try {
      reason_.assign(why);
      std::string text(kNoticeHeader, '\0');
      const std::uint64_t lost = detail::rank_lost().load() ? 1 : 0;
      std::memcpy(text.data(), &generation_, 8);
      std::memcpy(text.data() + 8, &completed_, 8);
      std::memcpy(text.data() + 16, &lost, 8);
      text.append(why.substr(0, 1000));
      send_to_all(kNoticeTag, std::move(text));
    } catch (...) {
      // the failure stands even when the notice could not be sent
    }
  }

  /// Throws "rank r, step t: stopped because another rank failed: ..." once a rank has failed.
  void check(int step) {
    if (failed()) throw_error({}, "rank ", rank_, ", step ", step, ": stopped because another rank failed: ", reason_);
  }

  /// Waits for `request`, a collective started on collectives() whose buffers
  /// `keep` holds, polling for notices; `what` names it in errors. Throws when a
  /// rank has failed or the timeout runs out; the collective is then abandoned
  /// (its buffers kept for good) until reset().
  void wait(MPI_Request& request, std::string_view what, int step, const std::shared_ptr<void>& keep) {
    spent_ = true;
    abandoned_.push_back(keep);  // popped again when the collective completes
    // Every rank runs the same collectives in the same order, this one being number
    // completed_ of the generation: a rank that failed after completing it does
    // not keep it from completing here.
    auto stop = [&] {
      if (failed() && failed_after_ <= completed_)
        throw_error({}, "rank ", rank_, " (step ", step, "): stopped while waiting for ", what,
                    " because another rank failed: ", reason_);
    };
    if (!mpi_wait(request, timeout_, stop))
      throw_error({}, explain_timeout(error_text({}, "rank ", rank_, " (step ", step, "): timed out after ",
                                                 timeout_.count(), " ms waiting for every rank to reach ", what)));
    abandoned_.pop_back();
    spent_ = false;
    ++completed_;
  }

  /// Collective AND of `ok` over all ranks (polled; see wait()).
  bool agree(bool ok, int step) {
    Buffers& b = *buffers_;
    b.agree[0] = ok ? 1 : 0;
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(&b.agree[0], &b.agree[1], 1, MPI_INT, MPI_LAND, collectives_, &request),
              "MPI_Iallreduce");
    wait(request, "the agreement of all ranks", step, buffers_);
    return b.agree[1] != 0;
  }

  /// Collective: `root`'s value on every rank (polled; see wait()).
  double broadcast(double value, int root, int step) {
    Buffers& b = *buffers_;
    b.value = value;
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibcast(&b.value, 1, MPI_DOUBLE, root, collectives_, &request), "MPI_Ibcast");
    wait(request, "a broadcast from rank " + std::to_string(root), step, buffers_);
    return b.value;
  }

  /// Collective: every rank's `mine` ([rank]), on `root`, or on every rank when
  /// root is kEveryRank (other ranks get an empty result). T is float, double or
  /// char. Polled; see wait().
  template <class T>
  std::vector<std::vector<T>> gather(const std::vector<T>& mine, int root, int step) {
    const bool everyone = root == kEveryRank;
    const std::string what = everyone ? std::string("a gather on every rank") : "a gather on rank " + std::to_string(root);
    auto counts = std::make_shared<std::vector<int>>(static_cast<std::size_t>(size_), 0);
    auto count = std::make_shared<int>(static_cast<int>(mine.size()));
    auto keep_counts = std::make_shared<std::pair<decltype(counts), decltype(count)>>(counts, count);
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(everyone ? MPI_Iallgather(count.get(), 1, MPI_INT, counts->data(), 1, MPI_INT, collectives_, &request)
                       : MPI_Igather(count.get(), 1, MPI_INT, counts->data(), 1, MPI_INT, root, collectives_, &request),
              "MPI_Igather");
    wait(request, what, step, keep_counts);
    auto offsets = std::make_shared<std::vector<int>>(static_cast<std::size_t>(size_), 0);
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      (*offsets)[static_cast<std::size_t>(r)] = total;
      total += (*counts)[static_cast<std::size_t>(r)];
    }
    const bool receives = everyone || rank_ == root;
    auto all = std::make_shared<std::vector<T>>(receives ? static_cast<std::size_t>(total) : 0);
    auto send = std::make_shared<std::vector<T>>(mine);
    auto keep = std::make_shared<std::tuple<decltype(keep_counts), decltype(offsets), decltype(all), decltype(send)>>(
        keep_counts, offsets, all, send);
    check_mpi(everyone ? MPI_Iallgatherv(send->data(), *count, type<T>(), all->data(), counts->data(),
                                         offsets->data(), type<T>(), collectives_, &request)
                       : MPI_Igatherv(send->data(), *count, type<T>(), all->data(), counts->data(), offsets->data(),
                                      type<T>(), root, collectives_, &request),
              "MPI_Igatherv");
    wait(request, what, step, keep);
    std::vector<std::vector<T>> out;
    if (!receives) return out;
    for (int r = 0; r < size_; ++r) {
      const auto at = all->begin() + (*offsets)[static_cast<std::size_t>(r)];
      out.emplace_back(at, at + (*counts)[static_cast<std::size_t>(r)]);
    }
    return out;
  }

  /// Collective, called by every rank before the next step after a failed one:
  /// waits for all ranks (polled, for twice the timeout: a rank may arrive while
  /// another still waits out a timeout of its own), replaces the communicator of
  /// the collectives on every rank, and starts a new generation without a failure.
  void reset() {
    if (broken_)
      throw_error({}, "rank ", rank_, ": the transport cannot be reset after an earlier reset timed out");
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibarrier(notices_, &request), "MPI_Ibarrier");
    if (!mpi_wait(request, 2 * timeout_, [&] { answer_roll_calls(); })) {
      broken_ = true;
      throw_error({}, "rank ", rank_, ": timed out after ", 2 * timeout_.count(),
                  " ms waiting for every rank to reset the transport");
    }
    // A collective abandoned on one rank would be matched by another rank's next
    // one, so every rank takes a fresh communicator. One whose collective is still
    // pending is left alone for good, with that collective's buffers: MPI may
    // still write into them (a few bytes per failed step, kept until the end).
    if (spent_) {
      for (auto& kept : abandoned_) detail::keep_until_exit(std::move(kept));
      buffers_ = std::shared_ptr<Buffers>(new Buffers);
    } else {
      MPI_Comm_free(&collectives_);
    }
    abandoned_.clear();
    collectives_ = duplicate(notices_);
    spent_ = false;
    detail::rank_lost().store(false);  // every rank reached the barrier: none is lost
    ++generation_;
    completed_ = 0;
    failed_after_ = kNever;
    reason_.clear();
    failed();  // drops the notices of earlier generations
  }

  /// Collective: a new communicator of the run's ranks whose errors are returned,
  /// for a transport's own messages (polled, with the timeout); the caller frees it.
  MPI_Comm new_communicator() { return duplicate(notices_, true); }

  /// The roll call: asks every other rank to answer and returns, in order, the
  /// ranks that do not within half a second. A rank answers in its next poll
  /// (failed() does), so only a rank whose process ended, or one stuck outside
  /// every wait of the library, stays silent.
  std::vector<int> silent_ranks() {
    std::vector<int> silent;
    if (broken_ || size_ < 2) return silent;
    const std::uint64_t call = ++roll_calls_;
    send_to_all(kPingTag, std::string(reinterpret_cast<const char*>(&call), sizeof call));
    std::vector<char> answered(static_cast<std::size_t>(size_), 0);
    answered[static_cast<std::size_t>(rank_)] = 1;
    int missing = size_ - 1;
    poll_until(
        [&] {
          failed();  // answers the roll calls of others meanwhile
          std::uint64_t got = 0;
          int from = 0;
          while (take_number(kPongTag, got, from)) {
            char& a = answered[static_cast<std::size_t>(from)];
            if (got == call && !a) {
              a = 1;
              --missing;
            }
          }
          return missing == 0;
        },
        kRollCallGrace, [](std::chrono::steady_clock::duration) {});
    for (int r = 0; r < size_; ++r)
      if (!answered[static_cast<std::size_t>(r)]) silent.push_back(r);
    return silent;
  }

  /// `what`, the error of a wait that ran out of time, with the ranks that do not
  /// answer a roll call named as lost, when there are any.
  std::string explain_timeout(std::string what) {
    const std::vector<int> silent = silent_ranks();
    if (silent.empty()) return what;
    detail::rank_lost().store(true);
    std::string list;
    for (int r : silent) list += (list.empty() ? "" : ", ") + std::to_string(r);
    const auto grace = kRollCallGrace.count();
    return what + (silent.size() == 1 ? "; rank " : "; ranks ") + list + (silent.size() == 1 ? " does" : " do") +
           " not answer (roll call, " + std::to_string(grace) + " ms): " + (silent.size() == 1 ? "it is" : "they are") +
           " lost (the process ended, or hangs outside the library's waits)";
  }

 private:
  static constexpr int kNoticeTag = 7301;
  static constexpr int kPingTag = 7302;  // a roll call: the caller's number
  static constexpr int kPongTag = 7303;  // the answer: the same number
  static constexpr std::size_t kNoticeHeader = 24;  // generation, collectives completed, a rank was lost
  static constexpr std::chrono::milliseconds kRollCallGrace{500};

  // Sends `text` to every other rank on the notices' communicator; the sends
  // complete on their own (a lost rank's never do), their buffers kept.
  void send_to_all(int tag, std::string text) {
    sent_.push_back(std::move(text));
    const std::string& kept = sent_.back();
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      if (MPI_Isend(kept.data(), static_cast<int>(kept.size()), MPI_BYTE, r, tag, notices_, &request) == MPI_SUCCESS)
        MPI_Request_free(&request);
    }
  }
  // Receives one number (a roll call's) of `tag` that has arrived; false when none has.
  bool take_number(int tag, std::uint64_t& value, int& from) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, tag, notices_, &flag, &status) != MPI_SUCCESS || !flag) return false;
    from = status.MPI_SOURCE;
    MPI_Recv(&value, sizeof value, MPI_BYTE, from, tag, notices_, MPI_STATUS_IGNORE);
    return true;
  }
  // Answers every roll call that has arrived with its number.
  void answer_roll_calls() {
    std::uint64_t call = 0;
    int from = 0;
    while (take_number(kPingTag, call, from)) {
      sent_.emplace_back(reinterpret_cast<const char*>(&call), sizeof call);
      MPI_Request request = MPI_REQUEST_NULL;
      if (MPI_Isend(sent_.back().data(), sizeof call, MPI_BYTE, from, kPongTag, notices_, &request) == MPI_SUCCESS)
        MPI_Request_free(&request);
    }
  }

  // A duplicate of `comm` whose errors are returned (polled, with the timeout).
  // `watch`: a failure notice stops the wait (not in reset(), where the failure
  // being reset is still recorded).
  MPI_Comm duplicate(MPI_Comm comm, bool watch = false) {
    MPI_Comm copy = MPI_COMM_NULL;
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Comm_idup(comm, &copy, &request), "MPI_Comm_idup");
    if (!mpi_wait(request, timeout_, [&] {
          if (notices_ == MPI_COMM_NULL) return;
          if (!watch) {
            answer_roll_calls();
            return;
          }
          if (failed()) {  // a rank that failed (e.g. in a reset) may never join
            broken_ = true;
            throw_error({}, "rank ", rank_, ": stopped while joining the run's communicators because another rank "
                        "failed: ", reason_);
          }
        })) {
      broken_ = true;
      throw_error({}, "rank ", rank_, ": timed out after ", timeout_.count(),
                  " ms waiting for every rank to join the run's communicators");
    }
    MPI_Comm_set_errhandler(copy, MPI_ERRORS_RETURN);
    return copy;
  }
  // The buffers of the collectives of a step: stay valid while one is pending.
  struct Buffers {
    int agree[2] = {0, 0};
    double value = 0;
  };
  template <class T>
  static MPI_Datatype type() {
    if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
    else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
    else return MPI_CHAR;
  }

  int rank_ = 0, size_ = 1, local_rank_ = 0;
  RankGrid grid_;
  std::chrono::milliseconds timeout_;
  MPI_Comm notices_ = MPI_COMM_NULL, collectives_ = MPI_COMM_NULL;
  std::shared_ptr<Buffers> buffers_;
  std::vector<std::shared_ptr<void>> abandoned_;  // buffers of collectives that may still be pending
  bool spent_ = false;   // a collective on collectives_ was abandoned
  bool broken_ = false;  // a reset timed out: notices_ has a collective pending
  static constexpr std::uint64_t kNever = ~std::uint64_t{0};
  std::uint64_t completed_ = 0;         // collectives completed in this generation
  std::uint64_t failed_after_ = kNever;  // the fewest completed by a rank that failed (kNever: none failed)
  std::string reason_;
  std::uint64_t generation_ = 0;
  std::deque<std::string> sent_;  // the notices, roll calls and answers sent (their sends complete on their own)
  std::uint64_t roll_calls_ = 0;
};

namespace detail {

/// The message of ranks whose settings differ: the first setting in which some
/// rank differs from rank 0, with each differing rank's value (at most 8).
inline std::string config_difference(const std::vector<RunConfig>& configs) {
  const RunConfig& first = configs.front();
  auto same = [](const RunConfig& a, const RunConfig& b, std::size_t at) {
    const bool in_a = at < a.fields().size(), in_b = at < b.fields().size();
    return in_a == in_b && (!in_a || a.fields()[at] == b.fields()[at]);
  };
  std::size_t longest = 0, at = 0;
  for (const RunConfig& c : configs) longest = std::max(longest, c.fields().size());
  for (; at < longest; ++at) {
    bool differs = false;
    for (const RunConfig& c : configs) differs = differs || !same(c, first, at);
    if (differs) break;
  }
  if (at == longest) return {};
  const std::string name =
      at < first.fields().size() ? first.fields()[at].name : "setting number " + std::to_string(at + 1);
  // A rank's value; with the setting's name when the rank has another setting there.
  auto value = [&](const RunConfig& c) {
    if (at >= c.fields().size()) return std::string("no such setting");
    const RunConfig::Field& f = c.fields()[at];
    return f.name == name ? f.value : f.name + " " + f.value;
  };
  std::string text = "start-up: the ranks were started with different settings; the first that differs is the " +
                     name + ": rank 0 has " + value(first);
  int listed = 0;
  for (std::size_t r = 1; r < configs.size(); ++r) {
    if (same(configs[r], first, at)) continue;
    if (listed++ == 8) {
      text += ", and more";
      break;
    }
    text += ", rank " + std::to_string(r) + " has " + value(configs[r]);
  }
  return text + "; start every rank with the same arguments";
}

/// "rank 1<verb>: its text; rank 3<verb>: its text" for each rank whose text
/// ([rank]) is not empty, at most 4, then "; and more".
inline std::string rank_problems(const std::vector<std::vector<char>>& texts, std::string_view verb) {
  std::string message;
  int listed = 0;
  for (std::size_t r = 0; r < texts.size(); ++r) {
    if (texts[r].empty()) continue;
    if (listed++ == 4) return message + "; and more";
    message += (listed > 1 ? "; rank " : "rank ") + std::to_string(r) + std::string(verb) + ": " +
               std::string(texts[r].begin(), texts[r].end());
  }
  return message;
}

}  // namespace detail

/// What a rank needs for itself (a GPU, for NCCL): `name` identifies it across
/// machines (e.g. "GPU GPU-8f3e...", its UUID), `advice` says how to give each
/// rank its own. Empty: nothing.
struct ExclusiveResource {
  std::string name;
  std::string advice;
};

/// The start-up agreement, collective over the control's ranks and reached by
/// every rank on every path: each passes its settings (`config`, e.g.
/// run_config() and the model's), what keeps it from starting (empty: nothing)
/// and what it needs for itself (`owned`). Returns when all settings are equal, no
/// rank has a problem and no two own the same; otherwise throws pipeweave::Error
/// on every rank, with the same message: the first setting that differs and the
/// ranks that differ in it, or else the problem of each rank that has one (once,
/// when every rank has the same), or else the first two ranks on one resource.
inline void agree_to_start(Control& control, const RunConfig& config, std::string_view problem,
                           const ExclusiveResource& owned = {}) {
  const std::string text(problem.substr(0, 1000));
  const std::uint64_t hash = config.hash();
  const std::vector<std::vector<double>> reports =
      control.gather(std::vector<double>{static_cast<double>(hash >> 32), static_cast<double>(hash & 0xffffffffu),
                                         static_cast<double>(text.size())},
                     Control::kEveryRank, -1);
  bool same_settings = true;
  int problems = 0;
  for (const auto& report : reports) {
    problems += report[2] > 0;
    same_settings = same_settings && report[0] == reports[0][0] && report[1] == reports[0][1];
  }
  if (!same_settings) {
    // Every rank sees that the fingerprints differ, so every rank takes part here.
    const std::string mine = config.encode();
    std::vector<RunConfig> configs;
    for (const std::vector<char>& c :
         control.gather(std::vector<char>(mine.begin(), mine.end()), Control::kEveryRank, -1))
      configs.push_back(RunConfig::decode(std::string_view(c.data(), c.size())));
    const std::string difference = detail::config_difference(configs);
    if (difference.empty())
      throw_error({}, "start-up: the ranks' settings have different fingerprints but read the same "
                      "(an encoding differs between their builds); start every rank from the same build");
    throw_error({}, difference);
  }
  if (problems == 0) {
    // Every rank started: every rank takes part here.
    const std::vector<std::vector<char>> names =
        control.gather(std::vector<char>(owned.name.begin(), owned.name.end()), Control::kEveryRank, -1);
    const auto [a, b] = first_equal_pair(names, [](const std::vector<char>& name) { return !name.empty(); });
    if (a >= 0) {
      const std::vector<char>& name = names[static_cast<std::size_t>(a)];
      throw_error({}, "start-up: ranks ", a, " and ", b, " are both on ", std::string(name.begin(), name.end()),
                  ", which a rank needs for itself", owned.advice.empty() ? "" : ": ", owned.advice);
    }
    return;
  }
  // Every rank knows that some rank has a problem, so every rank takes part here.
  const std::vector<std::vector<char>> texts =
      control.gather(std::vector<char>(text.begin(), text.end()), Control::kEveryRank, -1);
  bool same = true;
  for (const auto& t : texts) same = same && t == texts.front();
  if (same) throw_error({}, "start-up: every rank cannot start: ", std::string(texts.front().begin(), texts.front().end()));
  throw_error({}, "start-up: ", detail::rank_problems(texts, " cannot start"));
}

/// Collective over the control's ranks: each passes what went wrong on it
/// (empty: nothing). Returns when nothing did on any rank; otherwise throws
/// pipeweave::Error on every rank with the same message: `what`, then each
/// failing rank's problem ("rank 2: ..."; at most 4). Polled (Control::wait).
inline void agree_on_problems(Control& control, std::string_view problem, int step, std::string_view what) {
  const std::string text(problem.substr(0, 1000));
  if (control.agree(text.empty(), step)) return;
  const std::vector<std::vector<char>> texts =
      control.gather(std::vector<char>(text.begin(), text.end()), Control::kEveryRank, step);
  throw_error({}, what, ": ", detail::rank_problems(texts, ""));
}

}  // namespace pipeweave::mpi

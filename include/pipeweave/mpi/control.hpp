#pragma once
/// \file
/// The control plane of a multi-process run, shared by the multi-process host
/// (mpi/pipeline.hpp) and the transport endpoint of its rank, whatever moves the
/// tensors (NCCL today). Standard library and MPI only.
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
/// - The start-up agreement (agree_to_start): every rank reports the fingerprint
///   of its configuration and whatever keeps it from starting; either all start,
///   or all refuse with the same message.
///
/// \code
/// // every rank:
/// // pipeweave::mpi::Control control(MPI_COMM_WORLD, std::chrono::seconds(30));
/// // pipeweave::mpi::agree_to_start(control, hash, problem);  // throws on every rank, or on none
/// // const bool all_ok = control.agree(ok, step);
/// \endcode

#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "pipeweave/mpi/bootstrap.hpp"
#include "pipeweave/runtime/config_hash.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave::mpi {

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
    for (;;) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, notices_, &flag, &status) != MPI_SUCCESS || !flag) break;
      int count = 0;
      MPI_Get_count(&status, MPI_CHAR, &count);
      std::string text(static_cast<std::size_t>(count), '\0');
      MPI_Recv(text.data(), count, MPI_CHAR, status.MPI_SOURCE, kNoticeTag, notices_, MPI_STATUS_IGNORE);
      if (text.size() < kNoticeHeader) continue;
      std::uint64_t g = 0, completed = 0;
      std::memcpy(&g, text.data(), 8);
      std::memcpy(&completed, text.data() + 8, 8);
      if (g != generation_ || completed >= failed_after_) continue;
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
      std::memcpy(text.data(), &generation_, 8);
      std::memcpy(text.data() + 8, &completed_, 8);
      text.append(why.substr(0, 1000));
      sent_.push_back(std::move(text));  // kept: the sends complete on their own
      const std::string& notice = sent_.back();
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        MPI_Request request = MPI_REQUEST_NULL;
        if (MPI_Isend(notice.data(), static_cast<int>(notice.size()), MPI_CHAR, r, kNoticeTag, notices_, &request) ==
            MPI_SUCCESS)
          MPI_Request_free(&request);
      }
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
      throw_error({}, "rank ", rank_, " (step ", step, "): timed out after ", timeout_.count(),
                  " ms waiting for every rank to reach ", what);
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
    if (!mpi_wait(request, 2 * timeout_, [] {})) {
      broken_ = true;
      throw_error({}, "rank ", rank_, ": timed out after ", 2 * timeout_.count(),
                  " ms waiting for every rank to reset the transport");
    }
    // A collective abandoned on one rank would be matched by another rank's next
    // one, so every rank takes a fresh communicator. One whose collective is still
    // pending is left alone for good, with that collective's buffers: MPI may
    // still write into them (a few bytes per failed step, deliberately leaked).
    if (spent_) {
      static_cast<void>(new std::vector<std::shared_ptr<void>>(std::move(abandoned_)));
      buffers_ = std::shared_ptr<Buffers>(new Buffers);
    } else {
      MPI_Comm_free(&collectives_);
    }
    abandoned_.clear();
    collectives_ = duplicate(notices_);
    spent_ = false;
    ++generation_;
    completed_ = 0;
    failed_after_ = kNever;
    reason_.clear();
    failed();  // drops the notices of earlier generations
  }

 private:
  static constexpr int kNoticeTag = 7301;
  static constexpr std::size_t kNoticeHeader = 16;  // generation, collectives completed

  // A duplicate of `comm` whose errors are returned (polled, with the timeout).
  MPI_Comm duplicate(MPI_Comm comm) {
    MPI_Comm copy = MPI_COMM_NULL;
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Comm_idup(comm, &copy, &request), "MPI_Comm_idup");
    if (!mpi_wait(request, timeout_, [] {})) {
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
  std::deque<std::string> sent_;  // the notices sent (their sends complete on their own)
};

/// The start-up agreement, collective over the control's ranks and reached by
/// every rank on every path: each passes the fingerprint of its configuration
/// (run_hash) and what keeps it from starting (empty: nothing). Returns when all
/// fingerprints are equal and no rank has a problem; otherwise throws
/// pipeweave::Error on every rank, with the same message: the ranks whose
/// fingerprint differs from rank 0's, or else the problem of each rank that has one
/// (once, when every rank has the same).
inline void agree_to_start(Control& control, std::uint64_t hash, std::string_view problem) {
  const std::string text(problem.substr(0, 1000));
  const std::vector<std::vector<double>> reports =
      control.gather(std::vector<double>{static_cast<double>(hash >> 32), static_cast<double>(hash & 0xffffffffu),
                                         static_cast<double>(text.size())},
                     Control::kEveryRank, -1);
  auto hash_of = [&](int r) {
    const auto& v = reports[static_cast<std::size_t>(r)];
    return static_cast<std::uint64_t>(v[0]) << 32 | static_cast<std::uint64_t>(v[1]);
  };
  std::string differ;
  int count = 0, problems = 0;
  for (int r = 0; r < control.size(); ++r) {
    problems += reports[static_cast<std::size_t>(r)][2] > 0;
    if (r == 0 || hash_of(r) == hash_of(0)) continue;
    if (count++ < 8) differ += (differ.empty() ? "" : ", ") + std::to_string(r) + " (" + hash_text(hash_of(r)) + ")";
  }
  if (count > 0)
    throw_error({}, "start-up: the ranks were started with different configurations (schedule, model, batch, "
                    "optimizer or arithmetic): rank 0 has ",
                hash_text(hash_of(0)), ", rank", count > 1 ? "s " : " ", differ, count > 8 ? " and more" : "",
                "; start every rank with the same arguments");
  if (problems == 0) return;
  // Every rank knows that some rank has a problem, so every rank takes part here.
  const std::vector<std::vector<char>> texts =
      control.gather(std::vector<char>(text.begin(), text.end()), Control::kEveryRank, -1);
  bool same = true;
  for (const auto& t : texts) same = same && t == texts.front();
  if (same) throw_error({}, "start-up: every rank cannot start: ", std::string(texts.front().begin(), texts.front().end()));
  std::string message = "start-up: ";
  int listed = 0;
  for (int r = 0; r < control.size(); ++r) {
    const auto& t = texts[static_cast<std::size_t>(r)];
    if (t.empty()) continue;
    if (listed++ == 4) {
      message += "; and more";
      break;
    }
    message += (listed > 1 ? "; rank " : "rank ") + std::to_string(r) + " cannot start: " + std::string(t.begin(), t.end());
  }
  throw Error(message);
}

}  // namespace pipeweave::mpi

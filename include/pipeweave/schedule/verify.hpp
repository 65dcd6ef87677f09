#pragma once
/// \file
/// The verifier: proves a program (or a lowered program) correct, at compile time
/// or at run time, and names the first violation in words.
///
/// \code
/// static_assert(pipeweave::verify(pipeweave::Interleaved1F1B<4, 2, 8>{}));
/// \endcode
///
/// It checks, in this order:
/// 1. the shape: P, V, M at least 1 and one action list (or step list) per device;
/// 2. every (virtual stage, micro-batch) has exactly one forward and one backward;
/// 3. on each device, an action runs after the actions of that device it needs;
/// 4. across devices, every action's inputs can be produced before it runs (no
///    cycle of dependencies);
/// 5. (lowered) every receive is for a tensor that this device consumes, from the
///    device that produces it; every send follows the compute that produces it;
///    every input is received before its action runs;
/// 6. every send is matched, in FIFO order per directed pair, by a receive that
///    expects that very tensor (kind, virtual stage, micro-batch);
/// 7. the steps run to completion under rendezvous semantics (a send completes
///    when its receive is posted; a group when all of its operations match).

#include <cstddef>
#include <string>
#include <vector>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/schedules.hpp"

namespace pipeweave {

/// Outcome of verify(): converts to true when the program is correct; otherwise
/// `message` describes the first violation, at `device` and `step` (-1 when the
/// violation belongs to no single device or step).
struct VerifyResult {
  bool ok = true;
  int device = -1;
  int step = -1;
  Text message;

  constexpr explicit operator bool() const { return ok; }
  /// The message, or "ok".
  std::string what() const { return ok ? std::string("ok") : message.str(); }
};

namespace detail {

constexpr VerifyResult verify_fail(int device, int step, const Text& message) {
  return VerifyResult{false, device, step, message};
}

constexpr Text& append_action(Text& t, const ScheduleShape& s, int device, const Action& a) {
  append_token(t, a);
  t << " (stage " << s.stage_of(device, a.chunk) << ", micro-batch " << a.micro_batch << ")";
  return t;
}

constexpr Text& append_where(Text& t, int device, int step) {
  t << "device " << device;
  if (step >= 0) t << ", step " << step;
  return t << ": ";
}

/// Dense index of (phase, stage, micro-batch).
constexpr std::size_t action_index(const ScheduleShape& s, Phase phase, int stage, int micro_batch) {
  return (static_cast<std::size_t>(phase) * static_cast<std::size_t>(s.stages()) +
          static_cast<std::size_t>(stage)) *
             static_cast<std::size_t>(s.micro_batches) +
         static_cast<std::size_t>(micro_batch);
}

/// A dependency of an action: (phase, stage) of the same micro-batch.
struct Dependency {
  Phase phase;
  int stage;
};

/// The at most two actions whose results `a` on `device` needs.
constexpr int dependencies(const ScheduleShape& s, int device, const Action& a, Dependency (&out)[2]) {
  const int stage = s.stage_of(device, a.chunk);
  int n = 0;
  if (a.phase == Phase::kForward) {
    if (stage > 0) out[n++] = {Phase::kForward, stage - 1};
  } else {
    out[n++] = {Phase::kForward, stage};
    if (stage < s.stages() - 1) out[n++] = {Phase::kBackward, stage + 1};
  }
  return n;
}

constexpr Text shape_problem(const ScheduleShape& s, std::size_t device_lists, const char* what) {
  Text t;
  if (s.devices < 1 || s.chunks < 1 || s.micro_batches < 1) {
    t << "the shape needs devices, chunks and micro-batches of at least 1 (got " << s.devices << ", "
      << s.chunks << ", " << s.micro_batches << ")";
  } else if (static_cast<long long>(s.devices) * s.chunks * s.micro_batches > (1LL << 26)) {
    t << "devices * chunks * micro-batches must be at most 2^26";
  } else if (device_lists != static_cast<std::size_t>(s.devices)) {
    t << "the program has " << static_cast<long long>(device_lists) << " " << what << " lists for "
      << s.devices << " devices";
  }
  return t;
}

/// Checks 2-4 over the compute actions; `step_of[d][k]` is the step of device d's
/// k-th action (empty: the action index itself).
constexpr VerifyResult check_actions(const ScheduleShape& s, const std::vector<std::vector<Action>>& actions,
                                     const std::vector<std::vector<int>>& step_of) {
  const auto P = static_cast<std::size_t>(s.devices);
  auto step_at = [&](std::size_t d, std::size_t k) {
    return step_of.empty() ? static_cast<int>(k) : step_of[d][k];
  };
  const std::size_t count = 2 * static_cast<std::size_t>(s.stages()) * static_cast<std::size_t>(s.micro_batches);
  std::vector<int> where(count, -1);  // action index on its device
  // 2. ranges, duplicates, completeness.
  for (std::size_t d = 0; d < P; ++d) {
    for (std::size_t k = 0; k < actions[d].size(); ++k) {
      const Action& a = actions[d][k];
      const int dev = static_cast<int>(d);
      if (a.chunk < 0 || a.chunk >= s.chunks) {
        Text t;
        append_where(t, dev, step_at(d, k));
        append_token(t, a) << " has chunk " << a.chunk << "; chunks are 0.." << s.chunks - 1;
        return verify_fail(dev, step_at(d, k), t);
      }
      if (a.micro_batch < 0 || a.micro_batch >= s.micro_batches) {
        Text t;
        append_where(t, dev, step_at(d, k));
        append_token(t, a) << " has micro-batch " << a.micro_batch << "; micro-batches are 0.."
                           << s.micro_batches - 1;
        return verify_fail(dev, step_at(d, k), t);
      }
      int& w = where[action_index(s, a.phase, s.stage_of(dev, a.chunk), a.micro_batch)];
      if (w >= 0) {
        Text t;
        append_where(t, dev, step_at(d, k));
        append_action(t, s, dev, a) << " appears a second time (first at step "
                                    << step_at(d, static_cast<std::size_t>(w)) << ")";
        return verify_fail(dev, step_at(d, k), t);
      }
      w = static_cast<int>(k);
    }
  }
  for (int phase = 0; phase < 2; ++phase) {
    for (int d = 0; d < s.devices; ++d) {
      for (int c = 0; c < s.chunks; ++c) {
        for (int m = 0; m < s.micro_batches; ++m) {
          const Action a{static_cast<Phase>(phase), c, m};
          if (where[action_index(s, a.phase, s.stage_of(d, c), m)] < 0) {
            Text t;
            t << "device " << d << ": ";
            append_action(t, s, d, a) << " is missing";
            return verify_fail(d, -1, t);
          }
        }
      }
    }
  }
  // 3. same-device order.
  for (std::size_t d = 0; d < P; ++d) {
    const int dev = static_cast<int>(d);
    for (std::size_t k = 0; k < actions[d].size(); ++k) {
      const Action& a = actions[d][k];
      Dependency deps[2] = {};
      const int n = dependencies(s, dev, a, deps);
      for (int i = 0; i < n; ++i) {
        if (s.device_of_stage(deps[i].stage) != dev) continue;
        const int j = where[action_index(s, deps[i].phase, deps[i].stage, a.micro_batch)];
        if (j > static_cast<int>(k)) {
          const Action dep{deps[i].phase, s.chunk_of_stage(deps[i].stage), a.micro_batch};
          Text t;
          append_where(t, dev, step_at(d, k));
          append_action(t, s, dev, a) << " runs before ";
          append_token(t, dep) << " (step " << step_at(d, static_cast<std::size_t>(j))
                               << "), whose result it needs";
          return verify_fail(dev, step_at(d, k), t);
        }
      }
    }
  }
  // 4. cross-device dependencies: run every device as far as its inputs allow.
  std::vector<char> done(count, 0);
  std::vector<std::size_t> pos(P, 0);
  std::size_t finished = 0, total = 0;
  for (std::size_t d = 0; d < P; ++d) total += actions[d].size();
  auto ready = [&](std::size_t d, const Action& a, Dependency& missing) {
    Dependency deps[2] = {};
    const int n = dependencies(s, static_cast<int>(d), a, deps);
    for (int i = 0; i < n; ++i) {
      if (!done[action_index(s, deps[i].phase, deps[i].stage, a.micro_batch)]) {
        missing = deps[i];
        return false;
      }
    }
    return true;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t d = 0; d < P; ++d) {
      Dependency missing{};
      while (pos[d] < actions[d].size() && ready(d, actions[d][pos[d]], missing)) {
        const Action& a = actions[d][pos[d]];
        done[action_index(s, a.phase, s.stage_of(static_cast<int>(d), a.chunk), a.micro_batch)] = 1;
        ++pos[d];
        ++finished;
        progress = true;
      }
    }
  }
  if (finished != total) {
    Text t;
    std::size_t first = 0;
    while (pos[first] == actions[first].size()) ++first;
    const int dev = static_cast<int>(first);
    const Action& a = actions[first][pos[first]];
    Dependency missing{};
    ready(first, a, missing);
    const int other = s.device_of_stage(missing.stage);
    const Action dep{missing.phase, s.chunk_of_stage(missing.stage), a.micro_batch};
    const auto other_k = static_cast<std::size_t>(where[action_index(s, missing.phase, missing.stage, a.micro_batch)]);
    append_where(t, dev, step_at(first, pos[first]));
    append_action(t, s, dev, a) << " waits for ";
    append_token(t, dep) << " on device " << other << " (its step " << step_at(static_cast<std::size_t>(other), other_k)
                         << "), which waits behind ";
    const Action& blocker = actions[static_cast<std::size_t>(other)][pos[static_cast<std::size_t>(other)]];
    append_token(t, blocker) << " (step " << step_at(static_cast<std::size_t>(other), pos[static_cast<std::size_t>(other)])
                             << "): the dependencies form a cycle (deadlock)";
    return verify_fail(dev, step_at(first, pos[first]), t);
  }
  return {};
}

/// Checks 5-7 over lowered steps (the compute actions already passed 2-4).
constexpr VerifyResult check_steps(const LoweredProgram& lp) {
  const ScheduleShape& s = lp.shape;
  const auto P = static_cast<std::size_t>(s.devices);
  const std::size_t tensors = 2 * static_cast<std::size_t>(s.stages()) * static_cast<std::size_t>(s.micro_batches);
  auto consumer_stage = [](const TensorId& x) { return x.kind == TensorKind::kActivation ? x.stage + 1 : x.stage - 1; };
  std::vector<int> computed_step(tensors, -1);  // step of the compute producing a cross-device tensor
  std::vector<int> received_step(tensors, -1);
  std::vector<int> sent_step(tensors, -1);
  // Where each compute's output is made.
  for (std::size_t d = 0; d < P; ++d) {
    for (std::size_t t = 0; t < lp.devices[d].size(); ++t) {
      const Step& st = lp.devices[d][t];
      if (!st.has_compute) continue;
      const Transfer out = output_of(s, static_cast<int>(d), st.compute);
      if (out.exists && s.device_of_stage(out.stage) != static_cast<int>(d))
        computed_step[tensor_index(s, out.tensor)] = static_cast<int>(t);
    }
  }
  // 5. each operation against the model's data flow.
  for (std::size_t d = 0; d < P; ++d) {
    const int dev = static_cast<int>(d);
    for (std::size_t t = 0; t < lp.devices[d].size(); ++t) {
      const int step = static_cast<int>(t);
      const Step& st = lp.devices[d][t];
      for (const P2POp& op : st.ops) {
        const TensorId& x = op.tensor;
        const bool is_send = op.kind == OpKind::kSend;
        if (op.peer < 0 || op.peer >= s.devices || op.peer == dev) {
          Text m;
          append_where(m, dev, step) << (is_send ? "sends " : "receives ");
          append_tensor(m, x) << (is_send ? " to" : " from") << " device " << op.peer
                              << ", which is not another device (devices are 0.." << s.devices - 1 << ")";
          return verify_fail(dev, step, m);
        }
        const int consumer = consumer_stage(x);
        if (x.stage < 0 || x.stage >= s.stages() || x.micro_batch < 0 || x.micro_batch >= s.micro_batches ||
            consumer < 0 || consumer >= s.stages()) {
          Text m;
          append_where(m, dev, step) << (is_send ? "sends " : "receives ");
          append_tensor(m, x) << ", which no stage of this model consumes";
          return verify_fail(dev, step, m);
        }
        const int producer_device = s.device_of_stage(x.stage);
        const int consumer_device = s.device_of_stage(consumer);
        const std::size_t xi = tensor_index(s, x);
        if (is_send) {
          if (producer_device != dev) {
            Text m;
            append_where(m, dev, step) << "sends ";
            append_tensor(m, x) << ", but stage " << x.stage << " is on device " << producer_device;
            return verify_fail(dev, step, m);
          }
          if (op.peer != consumer_device) {
            Text m;
            append_where(m, dev, step) << "sends ";
            append_tensor(m, x) << " to device " << op.peer << ", but its consumer, stage " << consumer
                                << ", is on device " << consumer_device;
            return verify_fail(dev, step, m);
          }
          if (computed_step[xi] < 0 || computed_step[xi] >= step) {
            Text m;
            append_where(m, dev, step) << "sends ";
            append_tensor(m, x) << " before the step that computes it";
            if (computed_step[xi] >= 0) m << " (step " << computed_step[xi] << ")";
            return verify_fail(dev, step, m);
          }
          if (sent_step[xi] >= 0) {
            Text m;
            append_where(m, dev, step) << "sends ";
            append_tensor(m, x) << " a second time (first at step " << sent_step[xi] << ")";
            return verify_fail(dev, step, m);
          }
          sent_step[xi] = step;
        } else {
          if (consumer_device != dev) {
            Text m;
            append_where(m, dev, step) << "receives ";
            append_tensor(m, x) << ", but its consumer, stage " << consumer << ", is on device " << consumer_device;
            return verify_fail(dev, step, m);
          }
          if (op.peer != producer_device) {
            Text m;
            append_where(m, dev, step) << "receives ";
            append_tensor(m, x) << " from device " << op.peer << ", but stage " << x.stage << " is on device "
                                << producer_device;
            return verify_fail(dev, step, m);
          }
          if (received_step[xi] >= 0) {
            Text m;
            append_where(m, dev, step) << "receives ";
            append_tensor(m, x) << " a second time (first at step " << received_step[xi] << ")";
            return verify_fail(dev, step, m);
          }
          received_step[xi] = step;
        }
      }
      if (st.has_compute) {
        const Transfer in = input_of(s, dev, st.compute);
        if (in.exists && s.device_of_stage(in.stage) != dev) {
          const int r = received_step[tensor_index(s, in.tensor)];
          if (r < 0 || r > step) {
            Text m;
            append_where(m, dev, step);
            append_action(m, s, dev, st.compute) << " needs ";
            append_tensor(m, in.tensor) << " from device " << s.device_of_stage(in.stage)
                                        << ", but no step up to this one receives it";
            return verify_fail(dev, step, m);
          }
        }
      }
    }
  }
  for (std::size_t xi = 0; xi < tensors; ++xi) {
    if (computed_step[xi] >= 0 && sent_step[xi] < 0) {
      const int kind = static_cast<int>(xi / (static_cast<std::size_t>(s.stages()) * static_cast<std::size_t>(s.micro_batches)));
      const std::size_t rest = xi % (static_cast<std::size_t>(s.stages()) * static_cast<std::size_t>(s.micro_batches));
      const TensorId x{static_cast<TensorKind>(kind), static_cast<int>(rest) / s.micro_batches,
                       static_cast<int>(rest) % s.micro_batches};
      const int dev = s.device_of_stage(x.stage);
      Text m;
      append_where(m, dev, computed_step[xi]);
      append_tensor(m, x) << " is computed here but never sent to device "
                          << s.device_of_stage(consumer_stage(x));
      return verify_fail(dev, computed_step[xi], m);
    }
  }
  // 6. FIFO matching per directed pair; remember each operation's counterpart step.
  const PairQueues queues = pair_queues(lp);
  const auto& sends = queues.sends;
  const auto& recvs = queues.recvs;
  std::vector<std::vector<std::vector<int>>> partner(P);  // partner[d][t][i]: the peer's step
  for (std::size_t d = 0; d < P; ++d) {
    partner[d].resize(lp.devices[d].size());
    for (std::size_t t = 0; t < lp.devices[d].size(); ++t) partner[d][t].assign(lp.devices[d][t].ops.size(), -1);
  }
  for (std::size_t a = 0; a < P; ++a) {
    for (std::size_t b = 0; b < P; ++b) {
      const auto& out = sends[a * P + b];
      const auto& in = recvs[a * P + b];
      const std::size_t n = out.size() < in.size() ? out.size() : in.size();
      for (std::size_t k = 0; k < n; ++k) {
        const TensorId& sent = lp.devices[a][static_cast<std::size_t>(out[k].step)].ops[out[k].op].tensor;
        const TensorId& expected = lp.devices[b][static_cast<std::size_t>(in[k].step)].ops[in[k].op].tensor;
        if (!(sent == expected)) {
          Text m;
          append_where(m, static_cast<int>(b), in[k].step) << "receive number " << static_cast<long long>(k + 1)
                                                         << " from device " << static_cast<int>(a) << " expects ";
          append_tensor(m, expected) << ", but the message it matches (device " << static_cast<int>(a) << ", step "
                                     << out[k].step << ") is ";
          append_tensor(m, sent);
          return verify_fail(static_cast<int>(b), in[k].step, m);
        }
        partner[a][static_cast<std::size_t>(out[k].step)][out[k].op] = in[k].step;
        partner[b][static_cast<std::size_t>(in[k].step)][in[k].op] = out[k].step;
      }
      if (out.size() > n) {
        const PostedOp& p = out[n];
        Text m;
        append_where(m, static_cast<int>(a), p.step) << "sends ";
        append_tensor(m, lp.devices[a][static_cast<std::size_t>(p.step)].ops[p.op].tensor)
            << " to device " << static_cast<int>(b) << ", which never receives it (" << static_cast<long long>(out.size())
            << " sends, " << static_cast<long long>(in.size()) << " receives on that pair)";
        return verify_fail(static_cast<int>(a), p.step, m);
      }
      if (in.size() > n) {
        const PostedOp& p = in[n];
        Text m;
        append_where(m, static_cast<int>(b), p.step) << "receives ";
        append_tensor(m, lp.devices[b][static_cast<std::size_t>(p.step)].ops[p.op].tensor)
            << " from device " << static_cast<int>(a) << ", which never sends it (" << static_cast<long long>(out.size())
            << " sends, " << static_cast<long long>(in.size()) << " receives on that pair)";
        return verify_fail(static_cast<int>(b), p.step, m);
      }
    }
  }
  // 7. rendezvous execution: a device finishes step t once every operation of it
  // has been posted by its peer, i.e. the peer has reached the partner step.
  std::vector<std::size_t> at(P, 0);
  auto blocked_op = [&](std::size_t d) -> int {
    const auto& ops = lp.devices[d][at[d]].ops;
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (at[static_cast<std::size_t>(ops[i].peer)] < static_cast<std::size_t>(partner[d][at[d]][i])) return static_cast<int>(i);
    return -1;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t d = 0; d < P; ++d) {
      while (at[d] < lp.devices[d].size() && blocked_op(d) < 0) {
        ++at[d];
        progress = true;
      }
    }
  }
  int first = -1;
  Text m;
  int listed = 0;
  for (std::size_t d = 0; d < P; ++d) {
    if (at[d] == lp.devices[d].size()) continue;
    const P2POp& op = lp.devices[d][at[d]].ops[static_cast<std::size_t>(blocked_op(d))];
    const int want = partner[d][at[d]][static_cast<std::size_t>(blocked_op(d))];
    if (first < 0) {
      first = static_cast<int>(d);
      m << "deadlock: ";
    }
    if (listed == 3) {
      m << "; ...";
      break;
    }
    if (listed > 0) m << "; ";
    m << "device " << static_cast<int>(d) << " at step " << static_cast<long long>(at[d]) << " waits for device "
      << op.peer << " (at step " << static_cast<long long>(at[static_cast<std::size_t>(op.peer)]) << ") to "
      << (op.kind == OpKind::kSend ? "receive " : "send ");
    append_tensor(m, op.tensor) << " at its step " << want;
    ++listed;
  }
  if (first >= 0) return verify_fail(first, static_cast<int>(at[static_cast<std::size_t>(first)]), m);
  return {};
}

}  // namespace detail

/// Verifies a program of compute actions, then its P2P lowering.
constexpr VerifyResult verify(const Program& p) {
  if (Text e = detail::shape_problem(p.shape, p.devices.size(), "action"); !e.empty())
    return detail::verify_fail(-1, -1, e);
  if (VerifyResult r = detail::check_actions(p.shape, p.devices, {}); !r) return r;
  return detail::check_steps(lower(p));
}

/// Verifies a lowered program (for example one written by hand).
constexpr VerifyResult verify(const LoweredProgram& lp) {
  if (Text e = detail::shape_problem(lp.shape, lp.devices.size(), "step"); !e.empty())
    return detail::verify_fail(-1, -1, e);
  std::vector<std::vector<Action>> actions(lp.devices.size());
  std::vector<std::vector<int>> step_of(lp.devices.size());
  for (std::size_t d = 0; d < lp.devices.size(); ++d) {
    for (std::size_t t = 0; t < lp.devices[d].size(); ++t) {
      if (!lp.devices[d][t].has_compute) continue;
      actions[d].push_back(lp.devices[d][t].compute);
      step_of[d].push_back(static_cast<int>(t));
    }
  }
  if (VerifyResult r = detail::check_actions(lp.shape, actions, step_of); !r) return r;
  return detail::check_steps(lp);
}

/// Verifies a compile-time schedule: `static_assert(verify(Interleaved1F1B<4, 2, 8>{}))`.
template <StaticScheduleType S>
constexpr VerifyResult verify(const S&) {
  return verify(S::program());
}

}  // namespace pipeweave

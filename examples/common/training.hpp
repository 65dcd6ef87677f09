// What the training tools (train_mlp, train_mlp_mpi) share: their flags,
// declared once, with the checks that only see flags; the backends they run on,
// a table of names beside a registry of the implementations a build links; and
// the program, model and optimizer a run's flags make.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/tool.hpp"
#include "pipeweave/cuda/precision.hpp"  // the names of the GEMM arithmetic only: no CUDA header
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/runtime/auto_schedule.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/runtime/run.hpp"  // kMaxRows
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/kinds.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/offload.hpp"
#include "pipeweave/schedule/recompute.hpp"

namespace pipeweave::tool {

// ---------------------------------------------------------------------------
// Backends

/// The backends of the training tools.
enum class BackendKind : unsigned char { kCpu, kCuda };

/// Which transports a backend's devices take: a flag of TransportRow (TransportRow::cpu, TransportRow::gpu).
using TransportFlag = bool TransportRow::*;

/// What a backend is to the training tools, in one row: its name on the
/// command line, what it runs a device on, which transports it takes and
/// whether it takes --math. Its code lives in translation units of its own
/// that register themselves (BackendRegistry): a build without its toolchain
/// compiles none of it and still names it in messages.
struct BackendRow {
  BackendKind kind;
  std::string_view name;           ///< --backend NAME
  std::string_view title;          ///< in messages: "this build has no CUDA backend"
  std::string_view device;         ///< what it runs a device on ("GPU"); empty: the host, always there
  TransportFlag transports;        ///< which rows of kTransportRows its devices of one process take
  bool math;                       ///< it takes --math
};

/// One row per backend, in the order of BackendKind.
inline constexpr BackendRow kBackendRows[] = {
    {BackendKind::kCpu, "cpu", "CPU", "", &TransportRow::cpu, false},
    {BackendKind::kCuda, "cuda", "CUDA", "GPU", &TransportRow::gpu, true},
};

/// --backend's other choice: the first backend with a device of its own that
/// this build has and sees one of, else the host's.
inline constexpr std::string_view kAutoBackend = "auto";

/// The row of a backend.
constexpr const BackendRow& backend_row(BackendKind k) { return kBackendRows[static_cast<int>(k)]; }

/// What every backend implementation of a tool tells before it is chosen.
class BackendImpl {
 public:
  virtual ~BackendImpl() = default;
  /// Devices of its row's kind visible here (GPUs); asked only of rows with a device.
  virtual int visible() const { return 0; }
};

/// The implementations of one tool's backend interface (`Impl`, a BackendImpl)
/// that this program was linked with. Each registers itself from its own
/// translation unit: `const BackendRegistry<Impl>::Add add(BackendKind::kCuda, impl);`.
template <class Impl>
class BackendRegistry {
 public:
  struct Add {
    Add(BackendKind kind, const Impl& impl) { entries().emplace_back(kind, &impl); }
  };
  /// The implementation of `kind`, or null when this build has none.
  static const Impl* find(BackendKind kind) {
    for (const auto& [k, impl] : entries())
      if (k == kind) return impl;
    return nullptr;
  }

 private:
  static std::vector<std::pair<BackendKind, const Impl*>>& entries() {
    static std::vector<std::pair<BackendKind, const Impl*>> e;
    return e;
  }
};

/// The backend a run takes.
template <class Impl>
struct ChosenBackend {
  const BackendRow* row = nullptr;
  const Impl* impl = nullptr;
  std::string why_auto;  ///< with auto, why no backend with a device was taken: " (auto: no GPU visible)"
  std::string error;     ///< what is wrong (empty: nothing)
};

/// The backend --backend `name` names (one of kBackendRows or kAutoBackend).
/// With `needs_device`, a backend named for its device must see one here.
template <class Impl>
ChosenBackend<Impl> find_backend(std::string_view name, bool needs_device) {
  ChosenBackend<Impl> out;
  const BackendRow* host = nullptr;
  for (const BackendRow& r : kBackendRows) {
    const Impl* impl = BackendRegistry<Impl>::find(r.kind);
    if (r.device.empty()) {
      if (!host) host = &r;
    } else if (name == kAutoBackend) {
      if (impl && impl->visible() > 0) return {&r, impl, "", ""};
      out.why_auto += " (" + std::string(kAutoBackend) + ": " +
                      (impl ? "no " + std::string(r.device) + " visible"
                            : "no " + std::string(r.title) + " backend in this build") + ")";
    }
    if (r.name != name) continue;
    out.row = &r;
    out.impl = impl;
  }
  if (!out.row && name != kAutoBackend) {
    out.error = "--backend " + std::string(name) + ": no such backend";
    return out;
  }
  if (name == kAutoBackend) {
    out.row = host;
    out.impl = BackendRegistry<Impl>::find(host->kind);
    return out;
  }
  const std::string flag = "--backend " + std::string(name) + ": ",
                    use = "; use --backend " + std::string(host->name) + " (or " + std::string(kAutoBackend) + ")";
  if (!out.impl)
    out.error = flag + "this build has no " + std::string(out.row->title) + " backend" + use;
  else if (needs_device && !out.row->device.empty() && out.impl->visible() == 0)
    out.error = flag + "no " + std::string(out.row->title) + " backend can run here: no " + std::string(out.row->device) +
                " is visible" + use;
  return out;
}

// ---------------------------------------------------------------------------
// Flags

/// The flags of a training run, as given on the command line; the tools set
/// their own defaults before add_training_flags().
struct TrainingFlags {
  std::string schedule = default_schedule();
  bool overlapped = false;            ///< --overlap: the program's steady phase as overlapped pairs
  std::string recompute;              ///< --recompute: virtual stages that recompute every micro-batch, or all
  std::string offload;                ///< --offload: virtual stages whose stashes go to host memory, or all
  int chunks = 0;                     ///< 0: the kind's default
  int micro_batches = 8, replicas = 1;
  int layers = 16, hidden = 512, batch = 256, steps = 60;
  std::vector<int> layers_per_stage;  ///< empty: the even split
  float lr = 0.003f, momentum = 0.9f;
  std::string optimizer{optimizer_name(OptimizerKind::kAdam)};
  std::string backend{kAutoBackend};
  std::string transport{transport_name(TransportKind::kAuto)};
  std::string math{cuda::math_name(cuda::kMathModes[0])};
  std::string dtype{dtype_name(DType::kF32)};  ///< --dtype: of the tensors between layers and chunks
  std::uint64_t seed = 1;
  int timeout_ms = 30000;
  double tolerance = 0;
  int log_every = 0;
  CheckpointFlags ckpt;  ///< --save, --save-every, --keep, --resume
  AutoScheduleOptions autos;  ///< --probe-steps, and what the next three give: the tools that take --schedule auto
  std::string memory_limit{"0"};  ///< --memory-limit: in activations, or bytes with a unit (memory_size())
  double copy_bandwidth = 0;      ///< --copy-bandwidth: GB/s of the copies --offload auto times
  /// --recompute auto, --offload auto: synthesis may recompute, offload.
  static constexpr std::string_view kAutoMemory = "auto";

  /// Whether --schedule names a synthesized kind (auto).
  bool synthesizing() const { return kind_row(*parse_schedule(schedule, true)).synthesized; }

  /// Prints the loss of `step` beside the reference's, for the first step after `first`, the last
  /// one and every --log-every (default: about 20 lines).
  void print_loss(int step, long long first, double loss, double reference) const {
    if (step == first + 1 || step == steps || step % (log_every > 0 ? log_every : std::max(1, steps / 20)) == 0)
      std::printf("step %5d  loss %.6f%s\n", step, loss, loss == reference ? "" : "  (reference differs)");
  }
  /// What is wrong with resuming at a checkpoint of step `step` (empty: nothing).
  std::string resume_problem(long long step) const {
    return step <= steps ? "" : "--resume: the checkpoint is at step " + std::to_string(step) + ", past --steps " +
                                    std::to_string(steps) + " (--steps counts from the start of the run)";
  }
  /// The built-in rule and its hyper-parameters; throws pipeweave::Error when one is out of range.
  OptimizerConfig optimizer_config() const {
    const OptimizerKind kind = *parse_optimizer(optimizer);
    const OptimizerConfig o{kind, lr, optimizer_row(kind).momentum ? momentum : 0.0f};
    o.check();
    return o;
  }
};

/// How a training tool takes the shared flags.
struct TrainingTool {
  bool synthesized = false;  ///< --schedule takes auto
  bool transport = false;    ///< it has --transport: its devices are those of one process
  int max_chunks = 4096, max_replicas = 256;
  std::string save_help, resume_help;  ///< who writes a checkpoint, and who may have written one
};

/// A number as the help texts write it: 0.003, 0.9.
template <class T>
std::string number_words(T v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

/// Adds the flags both tools take, each checked as CLI11 can; the help gives the defaults in `f`.
inline void add_training_flags(CLI::App& app, TrainingFlags& f, const TrainingTool& tool) {
  auto def = [](const auto& v) { return " (default " + number_words(v) + ")"; };
  const std::string synthesized(schedule_name(ScheduleKind::kAuto));
  app.add_option("--schedule", f.schedule,
                 schedule_help(tool.synthesized) +
                     (tool.synthesized ? "; " + synthesized + " measures " + std::to_string(f.autos.probe_steps) +
                                             " steps of a built-in schedule (and of the best built-in under the "
                                             "fitted costs), then trains on with the program synthesize() makes for "
                                             "the costs fitted to its trace (pipeweave::AutoSchedule)"
                                       : ""))
      ->check(CLI::IsMember(schedule_names(tool.synthesized)));
  if (tool.synthesized) {
    app.add_option("--memory-limit", f.memory_limit,
                   "With --schedule " + synthesized + ": the most a device may keep at once (stashes plus gradients "
                   "kept from an I to its W), in activations (8, 2.5), or in bytes with a unit (4096B, 64KiB, "
                   "1.5MiB, 2GiB), counted as the devices measure them (pipeweave::mlp_memory_model()); 0: no "
                   "limit (default " + f.memory_limit + ")");
    app.add_option("--copy-bandwidth", f.copy_bandwidth,
                   "With --offload " + std::string(TrainingFlags::kAutoMemory) + ": the copy lane's bandwidth between "
                   "a device and host memory, in GB/s, which times the offloads synthesis places")
        ->check(CLI::Range(1e-6, 1e6));
    app.add_option("--probe-steps", f.autos.probe_steps,
                   "With --schedule " + synthesized + ": the steps each measured built-in schedule runs before the "
                   "switch" + def(f.autos.probe_steps))
        ->check(CLI::Range(1, 1000));
  }
  app.add_flag("--overlap", f.overlapped,
               "Fuse the program's steady phase into overlapped pairs (pipeweave::overlap()): a forward and an "
               "independent backward of one device at once, on two threads (CUDA: two streams)");
  app.add_option("--recompute", f.recompute,
                 "Virtual stages that recompute every micro-batch, comma-separated, or all: a stage keeps only its "
                 "input from a forward to a recomputation of it right before its backward (pipeweave::with_recompute()), "
                 "one stash slot less per micro-batch it would have held" +
                     (tool.synthesized ? "; with --schedule " + synthesized + ", " + std::string(TrainingFlags::kAutoMemory) +
                                             ": synthesis recomputes what --memory-limit needs"
                                       : std::string()));
  app.add_option("--offload", f.offload,
                 "Virtual stages whose stashes go to host memory and back, comma-separated, or all: a micro-batch's "
                 "stash leaves after the action that follows its forward and returns before the action that precedes "
                 "its backward (pipeweave::with_offload()), its stash slot free meanwhile" +
                     (tool.synthesized ? "; with --schedule " + synthesized + ", " + std::string(TrainingFlags::kAutoMemory) +
                                             ": synthesis offloads what --memory-limit (in bytes) needs, timed at "
                                             "--copy-bandwidth"
                                       : std::string()));
  app.add_option("--replicas", f.replicas,
                 "Data-parallel replicas D of the pipeline, 1.." + std::to_string(tool.max_replicas) +
                     ", each on its shard of the batch (P x D devices): each device sums a chunk's gradients over the "
                     "replicas after its last backward of it, in replica order (pipeweave::with_grad_reduce())" +
                     def(f.replicas))
      ->check(CLI::Range(1, tool.max_replicas));
  app.add_option("--chunks", f.chunks,
                 "Chunks per device V, 1.." + std::to_string(tool.max_chunks) + " (" + chunks_help() + ")")
      ->check(CLI::Range(1, tool.max_chunks));
  app.add_option("--micro-batches", f.micro_batches,
                 "Micro-batches M of each replica, 1..65536; " + micro_batches_help() + def(f.micro_batches))
      ->check(CLI::Range(1, 65536));
  const CLI::Option* layers_flag =
      app.add_option("--layers", f.layers,
                     "Layers L, a multiple of P*V, or the sum of --layers-per-stage" + def(f.layers))
          ->check(CLI::Range(1, kMaxLayers));
  add_layers_per_stage_flag(app, f.layers_per_stage, layers_flag, f.layers, kMaxLayers);
  app.add_option("--hidden", f.hidden, "Features of every layer" + def(f.hidden))->check(CLI::Range(1, kMaxWidth));
  app.add_option("--batch", f.batch, "Samples per step, a multiple of D x M" + def(f.batch))
      ->check(CLI::Range(1, kMaxRows));
  app.add_option("--steps", f.steps, "Training steps" + def(f.steps))->check(CLI::Range(0, 10000000));
  app.add_option("--lr", f.lr, "Learning rate" + def(f.lr))->check(CLI::PositiveNumber);
  const auto optimizers = row_names(kOptimizerRows, [](const OptimizerRow& r) { return r.name; });
  const auto with_momentum = row_names(kOptimizerRows, [](const OptimizerRow& r) { return r.name; },
                                       [](const OptimizerRow& r) { return r.momentum; });
  app.add_option("--optimizer", f.optimizer, join_words(optimizers, " or ") + " (default " + f.optimizer + ")")
      ->check(CLI::IsMember(optimizers));
  app.add_option("--momentum", f.momentum, "Momentum of " + join_words(with_momentum, " or ") + ", in [0, 1)" + def(f.momentum))
      ->check(CLI::Range(0.0, 0.999999));
  std::vector<std::string> backends = row_names(kBackendRows, [](const BackendRow& r) { return r.name; }), devices;
  std::string host;
  for (const BackendRow& r : kBackendRows)
    if (!r.device.empty()) devices.push_back(std::string(r.title) + " where the build has it and a " + std::string(r.device) + " is visible");
    else if (host.empty()) host = r.title;
  backends.emplace_back(kAutoBackend);
  app.add_option("--backend", f.backend,
                 join_words(backends, " or ") + ": " + join_words(devices, ", else ") + ", else " + host + " (default " +
                     f.backend + ")")
      ->check(CLI::IsMember(backends));
  if (tool.transport) {
    std::vector<std::string> names, words, backends_choice;  // auto, the backends' choice, last
    for (const TransportRow& r : kTransportRows) {
      names.emplace_back(r.name);
      const bool choice = r.kind == TransportKind::kAuto;
      (choice ? backends_choice : words)
          .push_back(std::string(r.name) + (choice ? ": " + std::string(r.words) : " (" + std::string(r.words) + ")") +
                     (r.name == f.transport ? " (default)" : ""));
    }
    words.insert(words.end(), backends_choice.begin(), backends_choice.end());
    app.add_option("--transport", f.transport, "How the devices connect: " + join_words(words, ", or "))
        ->check(CLI::IsMember(names));
  }
  std::vector<std::string> math_titles;
  for (const BackendRow& r : kBackendRows)
    if (r.math) math_titles.emplace_back(r.title);
  const auto maths = row_names(cuda::kMathModes, [](cuda::MathMode m) { return cuda::math_name(m); });
  app.add_option("--math", f.math,
                 join_words(math_titles, " or ") + " backend: GEMM arithmetic " + join_words(maths, " or ") + def(f.math))
      ->check(CLI::IsMember(maths));
  const auto dtypes = dtype_names(true);
  app.add_option("--dtype", f.dtype,
                 "The activations and their gradients, between layers and handed between chunks: " +
                     join_words(dtypes, " or ") + " (rounded to nearest even where a layer writes them); "
                     "parameters, gradients and optimizer state stay fp32 (default " + f.dtype + ")")
      ->check(CLI::IsMember(dtypes));
  app.add_option("--seed", f.seed, "Seed of the model, the teacher and the inputs" + def(f.seed));
  app.add_option("--timeout-ms", f.timeout_ms, "Longest wait for a message before it is an error" + def(f.timeout_ms))
      ->check(CLI::Range(1, 3600000));
  app.add_option("--tolerance", f.tolerance,
                 "Largest accepted parameter difference to sequential training" + def(f.tolerance))
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log-every", f.log_every, "Print the loss every N steps (default: about 20 lines)")
      ->check(CLI::Range(1, 10000000));
  add_checkpoint_flags(app, f.ckpt, tool.save_help, tool.resume_help);
}

/// What is wrong with the flags for the chosen backend that the flags alone
/// show (empty: nothing): the checkpoint flags together, the flags of
/// --schedule auto without it or --overlap with it, --math for a backend
/// without it, a transport the backend's devices do not take.
inline std::string training_flags_problem(const TrainingFlags& f, const CLI::App& app, const BackendRow& backend) {
  if (std::string p = f.ckpt.problem(); !p.empty()) return p;
  const std::string synthesized(schedule_name(ScheduleKind::kAuto));
  if (f.synthesizing() && f.overlapped) return "--overlap: --schedule " + f.schedule + " decides where pairs go itself";
  const std::string automatic(TrainingFlags::kAutoMemory);
  for (const auto& [flag, value] : {std::pair{"--recompute", &f.recompute}, std::pair{"--offload", &f.offload}}) {
    if (f.synthesizing() && !value->empty() && *value != automatic)
      return std::string(flag) + " " + *value + ": --schedule " + f.schedule + " trains the programs it synthesizes as "
             "they are; " + flag + " " + automatic + " lets synthesis choose what --memory-limit needs";
    if (!f.synthesizing() && *value == automatic)
      return std::string(flag) + " " + automatic + " applies to --schedule " + synthesized;
  }
  auto given = [&](const char* flag) {
    const CLI::Option* o = app.get_option_no_throw(flag);
    return o != nullptr && o->count() > 0;
  };
  if (!f.synthesizing() && (given("--memory-limit") || given("--probe-steps") || given("--copy-bandwidth")))
    return "--memory-limit, --probe-steps and --copy-bandwidth apply to --schedule " + synthesized;
  if (f.synthesizing()) {
    const std::optional<MemorySize> limit = memory_size(f.memory_limit);
    if (!limit)
      return "--memory-limit " + f.memory_limit + ": give a count of activations (8, 2.5) or bytes with a unit "
             "(4096B, 64KiB, 1.5MiB, 2GiB), at least 0";
    if (f.offload == automatic && (!limit->bytes || !given("--copy-bandwidth")))
      return "--offload " + automatic + " needs a --memory-limit in bytes (64KiB, 1.5MiB, ...) and the copies' "
             "--copy-bandwidth in GB/s";
    if (given("--copy-bandwidth") && f.offload != automatic)
      return "--copy-bandwidth times the offloads of --offload " + automatic;
  }
  if (!backend.math && f.math != TrainingFlags{}.math) {
    std::vector<std::string> titles;
    for (const BackendRow& r : kBackendRows)
      if (r.math) titles.emplace_back(r.title);
    return "--math applies to the " + join_words(titles, " or ") + " backend, which this run does not use";
  }
  if (const TransportRow& t = transport_row(*parse_transport(f.transport)); !(t.*backend.transports)) {
    std::vector<std::string> taken;
    for (const TransportRow& r : kTransportRows)
      if (r.*backend.transports && r.kind != TransportKind::kAuto) taken.emplace_back(r.name);
    return "--transport " + f.transport + ": the " + std::string(backend.title) + " backend's transport is " +
           join_words(taken, " or ") + " (or " + std::string(transport_name(TransportKind::kAuto)) + ")";
  }
  return "";
}

/// The backend the flags name (find_backend()), its error the first thing
/// wrong with the flags for it (training_flags_problem()).
template <class Impl>
ChosenBackend<Impl> choose_backend(const TrainingFlags& f, const CLI::App& app, bool needs_device) {
  ChosenBackend<Impl> out = find_backend<Impl>(f.backend, needs_device);
  if (out.error.empty()) out.error = training_flags_problem(f, app, *out.row);
  return out;
}

// ---------------------------------------------------------------------------
// The run

/// The virtual stages of a flag's value: "all", or stages comma-separated (the
/// policy that takes them checks their range). Throws pipeweave::Error, naming
/// `flag`, for anything else.
inline std::vector<int> stage_list(const std::string& value, const char* flag, const ScheduleShape& shape) {
  if (value == "all") return all_stages(shape);
  std::vector<int> stages;
  for (const std::string& item : split(value)) {
    const std::optional<long long> st = whole_number(item);
    if (!st)
      throw Error(std::string(flag) + " takes virtual stages, comma-separated (e.g. 0,1), or all (got '" + value + "')");
    stages.push_back(static_cast<int>(std::clamp<long long>(*st, INT_MIN, INT_MAX)));  // the policy names one out of range
  }
  return stages;
}

/// The program of the flags' built-in schedule on `devices` devices (V the
/// kind's default unless --chunks), through overlap() with --overlap, and with
/// replicas its gradient reductions placed: the one place a built-in program
/// of a run gets them (AutoSchedule places those of the programs it hands out).
/// Throws pipeweave::Error for a shape the kind refuses.
inline Program training_program(const TrainingFlags& f, int devices) {
  const ScheduleKind kind = *parse_schedule(f.schedule);
  Program p = make_schedule(kind, devices, f.chunks > 0 ? f.chunks : default_chunks(kind), f.micro_batches);
  if (f.overlapped) p = overlap(p);
  // After overlap(): a C, or an L, goes before the pair its backward is in.
  if (!f.recompute.empty()) p = with_recompute(p, stage_list(f.recompute, "--recompute", p.shape));
  if (!f.offload.empty()) p = with_offload(p, stage_list(f.offload, "--offload", p.shape));
  return f.replicas > 1 ? with_grad_reduce(p) : p;
}

/// The model: --layers of --hidden features, split into the shape's stages per
/// --layers-per-stage; throws pipeweave::Error when they do not split so, or
/// when the model passes a limit.
inline MlpSpec training_spec(const TrainingFlags& f, const ScheduleShape& shape) {
  MlpSpec spec = MlpSpec::uniform(f.layers, f.hidden, f.hidden, f.hidden, f.seed);
  spec.layers_per_stage = f.layers_per_stage;
  spec.dtype = *parse_dtype(f.dtype);
  check_layer_split(shape, spec.allocation());
  check_mlp_spec(spec);
  return spec;
}

/// "activations: bf16 between layers and chunks (4,096 bytes per hand-over), ...":
/// the dtype of the model's activations and the bytes of one hand-over of a
/// micro-batch of `rows` samples between hidden layers.
inline std::string activations_line(const MlpSpec& spec, int rows) {
  const std::size_t width = spec.widths.size() > 2 ? static_cast<std::size_t>(spec.widths[1]) : 0;
  const auto bytes = static_cast<long long>(static_cast<std::size_t>(rows) * width * dtype_bytes(spec.dtype));
  return "activations: " + std::string(dtype_name(spec.dtype)) + " between layers and chunks (" + with_commas(bytes) +
         " bytes per hand-over), parameters and optimizer state fp32";
}

/// Throws pipeweave::Error when a run of the model and optimizer with
/// `replicas` replicas of the pipeline on `batch` samples would need more than
/// 80% of this machine's memory. The estimate is a rough upper bound:
/// parameters, gradients and optimizer state twice (pipeline and reference),
/// and every micro-batch's activations kept at once (GPipe's worst case) plus
/// boundary buffers.
inline void check_memory(const MlpSpec& spec, const OptimizerConfig& opt, int replicas, int batch) {
  double params = 0, widths = 0;
  for (int i = 0; i < spec.layers(); ++i) params += static_cast<double>(layer_parameters(spec, i));
  for (int w : spec.widths) widths += w;
  const double need = 4.0 * ((1 + replicas) * params * (2 + opt.state_buffers()) + 3.0 * batch * widths * 2);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const double have = static_cast<double>(pages) * static_cast<double>(page);
  if (pages <= 0 || page <= 0 || need <= 0.8 * have) return;
  char line[160];
  std::snprintf(line, sizeof line, "the run needs about %.1f GiB of memory; this machine has %.1f GiB", need / (1 << 30),
                have / (1 << 30));
  throw Error(line);
}

}  // namespace pipeweave::tool

// Checkpoints: the safetensors format, the run's state saved and resumed bit for
// bit under another schedule, P, V or layer allocation, the atomic protocol, and
// every kind of bad input refused by name before anything changes.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pipeweave/checkpoint/background.hpp"
#include "pipeweave/checkpoint/mlp.hpp"
#include "pipeweave/checkpoint/safetensors.hpp"
#include "pipeweave/checkpoint/store.hpp"
#include "pipeweave/cpu/pipeline.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/schedule/generators.hpp"

using namespace pipeweave;
namespace ck = pipeweave::checkpoint;
namespace fs = std::filesystem;

namespace {

// A fresh directory of its own under the system's temporary directory.
fs::path fresh(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("pipeweave-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<char> bytes_of(const fs::path& p) { return ck::read_bytes(p); }

void write_bytes(const fs::path& p, const std::vector<char>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}

// Every file below `root` with its bytes: what a failed load must leave as it was.
std::map<std::string, std::vector<char>> snapshot(const fs::path& root) {
  std::map<std::string, std::vector<char>> out;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) out[e.path().string()] = bytes_of(e.path());
  return out;
}

// Rewrites the manifest's record of `file` (size, checksum) after the file changed on purpose, and optionally
// which file holds `tensor` (erased when `holder` is empty).
void reseal(const fs::path& dir, const std::string& file, const std::string& tensor = "", const std::string& holder = "-") {
  nlohmann::ordered_json m = nlohmann::ordered_json::parse(std::ifstream(dir / "manifest.json"));
  const std::vector<char> b = bytes_of(dir / file);
  for (auto& f : m["files"])
    if (f["name"] == file) {
      f["bytes"] = b.size();
      f["crc32"] = ck::crc_text(ck::crc32_of(0, b.data(), b.size()));
    }
  if (!tensor.empty()) {
    if (holder.empty())
      m["tensors"].erase(tensor);
    else if (holder != "-")
      m["tensors"][tensor] = holder;
  }
  std::ofstream(dir / "manifest.json", std::ios::trunc) << m.dump(1);
}

struct Run {
  MlpSpec spec = MlpSpec::uniform(8, 6, 10, 4, 3);  // spec.layers_per_stage: the pipelines' allocation
  RegressionTask task = make_regression_task(spec, 16, 5);
  OptimizerConfig opt{OptimizerKind::kAdam, 0.01f};
  ck::MlpRun saved() const { return {spec, opt, 16, 5}; }
  std::unique_ptr<cpu::CpuMlpPipeline> pipeline(const Program& p) const {
    return make_mlp_pipeline(p, spec, init_mlp(spec), {16, opt});
  }
  void train(cpu::CpuMlpPipeline& pipe, int steps) const {
    for (int s = 0; s < steps; ++s) pipe.train_step(task.inputs, task.targets);
  }
  // A 1F1B pipeline on 2 devices (4 micro-batches), trained `steps` steps and saved
  // under `root` as step `steps`.
  struct Saved {
    Program program;
    std::unique_ptr<cpu::CpuMlpPipeline> pipe;
    fs::path dir;  // the step directory
  };
  Saved trained_and_saved(const fs::path& root, int steps) const {
    Saved s{make_schedule(ScheduleKind::kOneFOneB, 2, 1, 4), nullptr, {}};
    s.pipe = pipeline(s.program);
    train(*s.pipe, steps);
    s.dir = ck::save_mlp(root, saved(), s.program.shape, s.pipe->state(), steps, 0, "threads");
    return s;
  }
};

// The whole model's state (one stage of every layer), read back from a checkpoint.
TrainingState whole(const fs::path& dir, const Run& r) { return ck::load_mlp_whole(dir, r.saved()).state; }

// "1,3,3,1", or "even" for an empty list.
std::string split_words(const std::vector<int>& per_stage) {
  std::string out;
  for (int n : per_stage) out += (out.empty() ? "" : ",") + std::to_string(n);
  return out.empty() ? "even" : out;
}

// The run `r` with its pipelines' layers split `per_stage` (empty: evenly).
Run split(const Run& r, std::vector<int> per_stage) {
  Run out = r;
  out.spec.layers_per_stage = std::move(per_stage);
  return out;
}

}  // namespace

TEST_CASE("safetensors: the file is the format's, its checksum zlib's, and it reads back bit for bit",
          "[checkpoint]") {
  const fs::path d = fresh("format");
  const std::vector<float> w = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-38f}, b = {7.0f, 8.0f};
  const std::vector<ck::TensorOut> tensors = {{"layers.0.weight", {2, 3}, w}, {"layers.0.bias", {2}, b}};
  const ck::FileRecord r = ck::write_safetensors(d / "x.safetensors", tensors, {{"format", "pt"}});
  const std::vector<char> bytes = bytes_of(d / "x.safetensors");
  CHECK(r.bytes == bytes.size());
  CHECK(r.crc32 == ck::crc32_of(0, bytes.data(), bytes.size()));
  CHECK(r.crc32 == static_cast<std::uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>(bytes.data()),
                                                       static_cast<uInt>(bytes.size()))));
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK((8 + n) % 8 == 0);
  CHECK(bytes.size() == 8 + n + 8 * sizeof(float));
  const auto header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  CHECK(header["layers.0.weight"]["dtype"] == "F32");
  CHECK(header["layers.0.weight"]["shape"] == nlohmann::json::array({2, 3}));
  CHECK(header["layers.0.weight"]["data_offsets"] == nlohmann::json::array({0, 24}));
  CHECK(header["layers.0.bias"]["data_offsets"] == nlohmann::json::array({24, 32}));
  CHECK(header["__metadata__"]["format"] == "pt");
  const ck::SafetensorsFile f(bytes, "x");
  const std::vector<float> back = f.read("layers.0.weight", std::vector<std::int64_t>{2, 3});
  CHECK(std::memcmp(back.data(), w.data(), w.size() * sizeof(float)) == 0);
  CHECK_THROWS_WITH(f.read("layers.0.weight", std::vector<std::int64_t>{3, 2}),
                    "checkpoint: x: tensor layers.0.weight has shape [2, 3]; this model's is [3, 2]");
  CHECK_THROWS_WITH(f.read("layers.1.bias", std::vector<std::int64_t>{2}), "checkpoint: x: tensor layers.1.bias is missing");
  // A shape that the values do not fill is refused before anything is written.
  const std::vector<ck::TensorOut> bad = {{"t", {4}, b}};
  CHECK_THROWS_WITH(ck::write_safetensors(d / "y.safetensors", bad, {}), "checkpoint: tensor t of shape [4] has 2 values");
  CHECK_FALSE(fs::exists(d / "y.safetensors"));
  fs::remove_all(d);
}

TEST_CASE("safetensors: damaged headers are refused by name", "[checkpoint]") {
  auto parse = [](std::string header, std::size_t data) {
    std::vector<char> b(8);
    const std::uint64_t n = header.size();
    std::memcpy(b.data(), &n, 8);
    b.insert(b.end(), header.begin(), header.end());
    b.resize(b.size() + data);
    return ck::SafetensorsFile(b, "f");
  };
  CHECK_THROWS_WITH(parse("{\"a\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8),
                    "checkpoint: f: tensor a has 8 bytes, but dtype F16 and shape [2] need 4");
  CHECK_THROWS_WITH(parse("{\"a\": {\"dtype\": \"Q4\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8),
                    "checkpoint: f: tensor a has dtype Q4, which safetensors does not define");
  CHECK_THROWS_WITH(parse("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4),
                    Catch::Contains("outside the 4 data bytes (truncated?)"));
  CHECK_THROWS_WITH(parse("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8),
                    "checkpoint: f: its tensors leave a gap or overlap at data byte 0");
  CHECK_THROWS_WITH(parse("{\"a\": ", 0), Catch::StartsWith("checkpoint: f: the header is not JSON"));
  CHECK_THROWS_WITH(ck::SafetensorsFile(std::vector<char>(5), "f"),
                    "checkpoint: f: is 5 bytes long, shorter than the 8-byte header length");
  const ck::SafetensorsFile f16 = parse("{\"a\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4);
  CHECK_THROWS_WITH(f16.read("a", std::vector<std::int64_t>{2}),
                    "checkpoint: f: tensor a has dtype F16; expected F32 or BF16");
  // A BF16 tensor reads as fp32, widened exactly: 1.5, -2 and 3.140625 are bf16 values.
  std::vector<char> b(8);
  const std::string header = "{\"a\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 6]}}";
  const std::uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  b.insert(b.end(), header.begin(), header.end());
  for (const float v : {1.5f, -2.0f, 3.140625f}) {
    const std::uint16_t h = to_bf16(v).bits;
    b.insert(b.end(), reinterpret_cast<const char*>(&h), reinterpret_cast<const char*>(&h) + 2);
  }
  CHECK(ck::SafetensorsFile(b, "f").read("a", std::vector<std::int64_t>{3}) == std::vector<float>{1.5f, -2.0f, 3.140625f});
}

TEST_CASE("a run saved and resumed under another schedule, P or V trains on bit for bit", "[checkpoint]") {
  struct Case {
    Program first, second;
    DType activations = DType::kF32;
  };
  const std::vector<Case> cases = {
      {make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4), make_schedule(ScheduleKind::kOneFOneB, 4, 1, 4)},
      {make_schedule(ScheduleKind::kGPipe, 1, 1, 4), make_schedule(ScheduleKind::kZeroBubbleV, 2, 2, 4)},
      {make_schedule(ScheduleKind::kDualPipeV, 2, 2, 4), make_schedule(ScheduleKind::kInterleaved1F1B, 2, 4, 4)},
      {make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4), make_schedule(ScheduleKind::kZeroBubbleV, 2, 2, 4),
       DType::kBF16},
  };
  for (const Case& c : cases) {
    Run r;
    r.spec.dtype = c.activations;
    INFO(schedule_name(c.first.shape.kind) << " P=" << c.first.shape.devices << " then "
                                           << schedule_name(c.second.shape.kind) << " P=" << c.second.shape.devices
                                           << ", " << dtype_name(c.activations) << " activations");
    const fs::path d = fresh("resume");
    auto whole_run = r.pipeline(c.first);
    r.train(*whole_run, 6);
    ck::save_mlp(d / "whole", r.saved(), c.first.shape, whole_run->state(), 6, 0, "threads");

    auto first = r.pipeline(c.first);
    r.train(*first, 3);
    const TrainingState at3 = first->state();
    ck::save_mlp(d / "part", r.saved(), c.first.shape, at3, 3, 0, "threads");
    const ck::Loaded loaded = ck::load_mlp(d / "part", r.saved(), c.second.shape);
    CHECK(loaded.step == 3);
    CHECK(loaded.state.updates == 3);
    auto second = r.pipeline(c.second);
    second->set_state(loaded.state);
    r.train(*second, 3);
    ck::save_mlp(d / "cont", r.saved(), c.second.shape, second->state(), 6, 0, "threads");
    CHECK(whole(d / "whole", r) == whole(d / "cont", r));
    CHECK(download_weights(*whole_run, r.spec) == download_weights(*second, r.spec));
    // What was saved is what the pipeline held: the same shape reads back the same state.
    CHECK(ck::load_mlp(d / "part", r.saved(), c.first.shape).state == at3);
    fs::remove_all(d);
  }
}

TEST_CASE("a run saved under one layer allocation resumes under another bit for bit", "[checkpoint]") {
  // Tensors are stored per layer: the stages that read them need not be those that wrote them.
  const Run r;
  struct Case {
    Program first;
    std::vector<int> first_split;
    Program second;
    std::vector<int> second_split;
  };
  const std::vector<Case> cases = {
      {make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4), {1, 3, 3, 1},
       make_schedule(ScheduleKind::kOneFOneB, 2, 1, 4), {5, 3}},
      {make_schedule(ScheduleKind::kZeroBubbleV, 2, 2, 4), {2, 1, 1, 4},
       make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4), {}},
      {make_schedule(ScheduleKind::kOneFOneB, 4, 1, 4), {},
       make_schedule(ScheduleKind::kDualPipeV, 2, 2, 4), {3, 2, 2, 1}},
  };
  for (const Case& c : cases) {
    const Run a = split(r, c.first_split), b = split(r, c.second_split);
    INFO(schedule_name(c.first.shape.kind) << " split " << split_words(c.first_split) << " then "
                                           << schedule_name(c.second.shape.kind) << " split "
                                           << split_words(c.second_split));
    const fs::path d = fresh("resplit");
    auto whole_run = a.pipeline(c.first);
    a.train(*whole_run, 6);

    auto first = a.pipeline(c.first);
    a.train(*first, 3);
    ck::save_mlp(d / "part", a.saved(), c.first.shape, first->state(), 3, 0, "threads");
    const ck::Opened opened = ck::open_checkpoint(d / "part");
    CHECK(opened.manifest.at("written_by").at("layers_per_stage").get<std::vector<int>>() == c.first_split);
    const ck::Loaded loaded = ck::load_mlp(d / "part", b.saved(), c.second.shape);
    auto second = b.pipeline(c.second);
    // The stages hold other layers: the first run's state does not fit the second pipeline as it is.
    CHECK_THROWS_WITH(second->set_state(first->state()), Catch::StartsWith("state: "));
    second->set_state(loaded.state);
    CHECK(download_weights(*second, b.spec) == download_weights(*first, a.spec));
    b.train(*second, 3);
    CHECK(download_weights(*whole_run, a.spec) == download_weights(*second, b.spec));
    ck::save_mlp(d / "cont", b.saved(), c.second.shape, second->state(), 6, 0, "threads");
    ck::save_mlp(d / "whole", a.saved(), c.first.shape, whole_run->state(), 6, 0, "threads");
    CHECK(whole(d / "whole", a) == whole(d / "cont", b));  // optimizer state too
    // The sequential reference (every layer in one stage) resumes from either split.
    SequentialTrainer<cpu::CpuBackend> seq(cpu::CpuBackend{}, r.spec, init_mlp(r.spec), 16, 4, r.opt);
    seq.set_state(whole(d / "part", b));
    for (int s = 0; s < 3; ++s) seq.train_step(r.task.inputs, r.task.targets);
    CHECK(seq.weights() == download_weights(*second, b.spec));
    fs::remove_all(d);
  }
  // A list that does not fit the shape it loads into is refused by name.
  const fs::path d = fresh("resplit-bad");
  const Program p = r.trained_and_saved(d, 0).program;
  CHECK_THROWS_WITH(ck::load_mlp(d, split(r, {1, 2, 5}).saved(), p.shape),
                    "layers per stage has 3 entries; it must have one per virtual stage, devices * chunks (2 * 1 = 2)");
  CHECK_THROWS_WITH(ck::load_mlp(d, split(r, {1, 2}).saved(), p.shape),
                    "layers per stage sum to 3; they must sum to the model's layers (8)");
  fs::remove_all(d);
}

TEST_CASE("the sequential reference resumes from a pipeline's checkpoint", "[checkpoint]") {
  const Run r;
  const fs::path d = fresh("reference");
  auto [p, pipe, dir] = r.trained_and_saved(d, 2);
  SequentialTrainer<cpu::CpuBackend> seq(cpu::CpuBackend{}, r.spec, init_mlp(r.spec), 16, 4, r.opt);
  seq.set_state(whole(d, r));
  r.train(*pipe, 2);
  for (int s = 0; s < 2; ++s) seq.train_step(r.task.inputs, r.task.targets);
  CHECK(seq.weights() == download_weights(*pipe, r.spec));
  fs::remove_all(d);
}

TEST_CASE("bad checkpoints are refused by name, before anything changes", "[checkpoint]") {
  const Run r;
  const fs::path d = fresh("bad");
  const Run::Saved saved = r.trained_and_saved(d, 1);  // (named: the lambda below refers to its parts)
  const Program& p = saved.program;
  const auto& pipe = saved.pipe;
  const fs::path& dir = saved.dir;
  const std::string model0 = (dir / "model-0-of-2.safetensors").string();
  const TrainingState before = pipe->state();
  auto refused = [&](const std::string& what, const ck::MlpRun& run) {
    const auto files = snapshot(d);
    CHECK_THROWS_WITH(pipe->set_state(ck::load_mlp(d, run, p.shape).state), what);
    CHECK(snapshot(d) == files);  // nothing written over
    CHECK(pipe->state() == before);
  };
  SECTION("a truncated file") {
    std::vector<char> b = bytes_of(model0);
    b.resize(b.size() - 10);
    write_bytes(model0, b);
    refused("checkpoint: " + model0 + " has " + std::to_string(b.size()) + " bytes; the manifest says " +
                std::to_string(b.size() + 10) + " (truncated, or written over)",
            r.saved());
  }
  SECTION("a flipped byte") {
    std::vector<char> b = bytes_of(model0);
    b[b.size() - 3] ^= 0x10;
    write_bytes(model0, b);
    const auto files = snapshot(d);
    CHECK_THROWS_WITH(ck::load_mlp(d, r.saved(), p.shape),
                      Catch::StartsWith("checkpoint: " + model0 + " has checksum 0x") &&
                          Catch::EndsWith(": the file is damaged"));
    CHECK(snapshot(d) == files);
  }
  SECTION("a missing tensor") {
    reseal(dir, "model-0-of-2.safetensors", "layers.1.bias", "");
    CHECK_THROWS_WITH(ck::load_mlp(d, r.saved(), p.shape),
                      "checkpoint " + dir.string() + ": tensor layers.1.bias is missing (no file holds it)");
  }
  SECTION("a file without the tensor the manifest puts in it") {
    reseal(dir, "model-0-of-2.safetensors", "layers.7.bias", "model-0-of-2.safetensors");
    CHECK_THROWS_WITH(ck::load_mlp(d, r.saved(), p.shape), "checkpoint: " + model0 + ": tensor layers.7.bias is missing");
  }
  SECTION("a tensor of the wrong shape") {
    const std::vector<float> w(10 * 6, 0.5f);
    fs::remove(model0);
    ck::write_safetensors(model0, std::vector<ck::TensorOut>{{"layers.0.weight", {6, 10}, w}}, {});
    reseal(dir, "model-0-of-2.safetensors");
    CHECK_THROWS_WITH(ck::load_mlp(d, r.saved(), p.shape),
                      "checkpoint: " + model0 + ": tensor layers.0.weight has shape [6, 10]; this model's is [10, 6]");
  }
  SECTION("a tensor of the wrong dtype") {
    const std::string header = "{\"layers.0.weight\":{\"dtype\":\"F64\",\"shape\":[10,6],\"data_offsets\":[0,480]}}";
    std::vector<char> b(8);
    const std::uint64_t n = header.size();
    std::memcpy(b.data(), &n, 8);
    b.insert(b.end(), header.begin(), header.end());
    b.resize(b.size() + 480);
    write_bytes(model0, b);
    reseal(dir, "model-0-of-2.safetensors");
    CHECK_THROWS_WITH(ck::load_mlp(d, r.saved(), p.shape),
                      "checkpoint: " + model0 + ": tensor layers.0.weight has dtype F64; expected F32 or BF16");
  }
  SECTION("a checkpoint of another model") {
    ck::MlpRun other = r.saved();
    other.spec = MlpSpec::uniform(8, 6, 12, 4, 3);
    refused("checkpoint " + dir.string() + ": holds a model of widths 6 10 10 10 10 10 10 10 4 (8 layers); this run's "
                                           "has widths 6 12 12 12 12 12 12 12 4 (8 layers)",
            other);
  }
  SECTION("a checkpoint of other activations") {
    ck::MlpRun other = r.saved();
    other.spec.dtype = DType::kBF16;
    refused("checkpoint " + dir.string() + ": holds a model trained with fp32 activations; this run's are bf16: a run "
                                           "resumes with the activations it was trained with",
            other);
  }
  SECTION("a checkpoint of another optimizer") {
    ck::MlpRun other = r.saved();
    other.optimizer = {OptimizerKind::kSgd, 0.01f, 0.9f};
    refused("checkpoint " + dir.string() +
                ": was written with optimizer {\"beta1\":0.9,\"beta2\":0.999,\"epsilon\":1e-08,\"learning_rate\":0.01,"
                "\"rule\":\"adam\",\"updates\":1}; this run's rule is \"sgd\": resume with the checkpoint's optimizer "
                "settings",
            other);
  }
  SECTION("other data") {
    ck::MlpRun other = r.saved();
    other.rows = 32;
    refused("checkpoint " + dir.string() + ": was written by a run of 16 samples per batch with data seed 5; this run "
                                           "has 32 and 5",
            other);
  }
  SECTION("a directory without a checkpoint") {
    const fs::path empty = fresh("empty");
    CHECK_THROWS_WITH(ck::load_mlp(empty, r.saved(), p.shape),
                      "checkpoint: " + empty.string() + " holds no checkpoint (neither manifest.json nor latest)");
    CHECK_THROWS_WITH(ck::load_mlp(empty / "nothing", r.saved(), p.shape),
                      "checkpoint: " + (empty / "nothing").string() + " is not a directory");
    fs::remove_all(empty);
  }
  SECTION("a state that does not fit the pipeline") {
    TrainingState wrong = before;
    wrong.stages[1].optimizer.pop_back();
    CHECK_THROWS_WITH(pipe->set_state(wrong),
                      "state: stage 1 has 1 optimizer state buffers; the update rule keeps 2");
    wrong = before;
    wrong.stages[0].parameters.pop_back();
    CHECK_THROWS_WITH(pipe->set_state(wrong), Catch::StartsWith("state: stage 0 has "));
    CHECK(pipe->state() == before);
  }
  fs::remove_all(d);
}

TEST_CASE("a save is atomic: the previous checkpoint stays the latest until the new one is complete",
          "[checkpoint]") {
  const Run r;
  const fs::path d = fresh("atomic");
  auto [p, pipe, first] = r.trained_and_saved(d, 0);
  const TrainingState s0 = pipe->state();
  CHECK(first == d / "step-00000000");
  // What a save killed half-way leaves: a temporary directory and a pointer being written.
  fs::create_directory(d / ".tmp-step-00000001-dead");
  std::ofstream(d / ".tmp-step-00000001-dead" / "model-0-of-2.safetensors") << "half";
  std::ofstream(d / "latest.tmp") << "step-000";
  CHECK(ck::find_checkpoint(d) == first);
  // A save that fails half-way (a state that does not fit its shape) commits nothing.
  TrainingState broken = s0;
  broken.stages[1].parameters.resize(3);
  CHECK_THROWS_WITH(ck::save_mlp(d, r.saved(), p.shape, broken, 1, 0, "threads"),
                    Catch::StartsWith("checkpoint: stage 1 holds 3 parameters"));
  CHECK(ck::find_checkpoint(d) == first);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"latest", "step-00000000"});  // the next save removed the leftovers
  // The same step saved again never writes over the first.
  r.train(*pipe, 1);
  const fs::path again = ck::save_mlp(d, r.saved(), p.shape, pipe->state(), 0, 0, "threads");
  CHECK(again == d / "step-00000000.1");
  CHECK(ck::find_checkpoint(d) == again);
  CHECK(ck::load_mlp(first, r.saved(), p.shape).state == s0);
  // keep: the newest N by step stay.
  for (int s = 1; s <= 3; ++s) ck::save_mlp(d, r.saved(), p.shape, pipe->state(), s, 2, "threads");
  names.clear();
  for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"latest", "step-00000002", "step-00000003"});
  fs::remove_all(d);
}

TEST_CASE("a background save holds the pipeline only for the copy, and reports its error at the next wait",
          "[checkpoint]") {
  const Run r;
  const fs::path d = fresh("background");
  const Program p = make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4);
  auto pipe = r.pipeline(p);
  ck::BackgroundSaver saver(d, r.saved(), p.shape, 0, "threads");
  std::vector<TrainingState> held;
  for (int step = 1; step <= 3; ++step) {
    r.train(*pipe, 1);
    held.push_back(pipe->state());
    const auto before = saver.save(step, [&](TrainingState& s) { pipe->copy_state(s); });
    CHECK(before.has_value() == (step > 1));
    // The pipeline trains on while the files are written; the copy it saves is its own.
  }
  r.train(*pipe, 1);
  const auto last = saver.wait();
  REQUIRE(last.has_value());
  CHECK(last->directory == d / "step-00000003");
  CHECK(ck::find_checkpoint(d) == last->directory);
  for (int step = 1; step <= 3; ++step)
    CHECK(ck::load_mlp(d / ck::step_directory(step), r.saved(), p.shape).state == held[static_cast<std::size_t>(step - 1)]);
  CHECK_FALSE(saver.wait().has_value());
  // A root that cannot be made: the error comes at wait(), and nothing is committed.
  std::ofstream(d / "a-file") << "x";
  ck::BackgroundSaver broken(d / "a-file" / "ckpt", r.saved(), p.shape, 0, "threads");
  broken.save(4, [&](TrainingState& s) { pipe->copy_state(s); });
  CHECK_THROWS_WITH(broken.wait(), Catch::StartsWith("checkpoint: cannot create " + (d / "a-file" / "ckpt").string()));
  fs::remove_all(d);
}

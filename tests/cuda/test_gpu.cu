// The CUDA backend on a GPU: its primitives against the same computation on the
// CPU, the transports this machine can run (virtual devices always, NCCL with two
// GPUs or more), GPU pipelines against sequential training on the GPU and on the
// CPU, failures, steady-state allocations and the measured trace. Needs a GPU
// (gpu_main.cpp exits 77 without one).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../common/threads.hpp"
#include "cases.hpp"
#include "cpu_reference.hpp"
#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/cuda.hpp"
#include "pipeweave/schedule/offload.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/recompute.hpp"

// No `using namespace pipeweave;` in a .cu file: it would make the name `cuda`
// ambiguous (pipeweave::cuda and CCCL's ::cuda) in the code nvcc generates.
namespace pc = pipeweave::cuda;

// The GPU pipeline's chunk splits its backward, so the zero-bubble schedules run on it.
static_assert(pipeweave::SplitChunk<pc::GpuMlpChunk, pc::CudaBackend>);
// The layers' bias gradients take the CUDA backend's own column-parallel column_sums.
static_assert(requires(pc::CudaBackend& b, float* out) {
  b.column_sums(std::size_t{1}, std::size_t{1}, pipeweave::ActivationGradient<true>{}, out);
});
namespace test = pipeweave::test;
using pipeweave::ActivationGradient;
using pipeweave::AdamUpdate;
using pipeweave::BiasActivation;
using pipeweave::Chunk;
using pipeweave::ChunkCall;
using pipeweave::column_sums;
using pipeweave::chunk_layers;
using pipeweave::DeviceParts;
using pipeweave::Error;
using pipeweave::for_each_element;
using pipeweave::HostModel;
using pipeweave::init_mlp;
using pipeweave::make_regression_task;
using pipeweave::make_schedule;
using pipeweave::max_abs_difference;
using pipeweave::Message;
using pipeweave::MlpChunk;
using pipeweave::MlpSpec;
using pipeweave::MomentumUpdate;
using pipeweave::MseGradient;
using pipeweave::NonFinite;
using pipeweave::OptimizerConfig;
using pipeweave::OptimizerKind;
using pipeweave::ParameterView;
using pipeweave::Pipeline;
using pipeweave::Program;
using pipeweave::RegressionTask;
using pipeweave::Rng;
using pipeweave::schedule_name;
using pipeweave::ScheduleKind;
using pipeweave::SgdUpdate;
using pipeweave::SquaredError;
using pipeweave::TensorKind;
using pipeweave::Trace;
using pipeweave::TransportKind;
using pipeweave::test::act;
using pipeweave::test::on_threads;
using pipeweave::Transpose;
using namespace std::chrono_literals;

namespace {

std::vector<float> random_values(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}

// A device buffer holding `host`, on backend b.
pc::DeviceBuffer on_device(pc::CudaBackend& b, const std::vector<float>& host) {
  pc::DeviceBuffer buf = b.allocate(host.size());
  b.upload(host.data(), buf.data(), host.size());
  return buf;
}

std::vector<float> to_host(pc::CudaBackend& b, const pc::DeviceBuffer& buf) {
  std::vector<float> host(buf.size());
  b.download(buf.data(), host.data(), host.size());
  b.synchronize();
  return host;
}

// Row-major reference GEMM in double precision on the host, with the operands
// rounded as in `mode`; also returns sum |a||b| per element (the error scale).
void host_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const std::vector<float>& a, int lda,
               const std::vector<float>& b, int ldb, float beta, std::vector<float>& c, int ldc, pc::MathMode mode,
               std::vector<double>& scale) {
  scale.assign(c.size(), 0.0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double acc = 0, mag = 0;
      for (int p = 0; p < k; ++p) {
        const double x = pc::round_operand(ta ? a[static_cast<std::size_t>(p * lda + i)] : a[static_cast<std::size_t>(i * lda + p)], mode);
        const double y = pc::round_operand(tb ? b[static_cast<std::size_t>(j * ldb + p)] : b[static_cast<std::size_t>(p * ldb + j)], mode);
        acc += x * y;
        mag += std::fabs(x * y);
      }
      const auto idx = static_cast<std::size_t>(i * ldc + j);
      c[idx] = static_cast<float>(alpha * acc + (beta == 0.0f ? 0.0 : beta * static_cast<double>(c[idx])));
      scale[idx] = std::fabs(alpha) * mag + std::fabs(beta * static_cast<double>(c[idx]));
    }
}

// A transport and the GPU of each device.
struct Link {
  TransportKind kind;
  std::vector<int> gpus;
  friend std::ostream& operator<<(std::ostream& out, const Link& l) {
    out << pipeweave::transport_name(l.kind) << " on GPUs";
    for (int g : l.gpus) out << ' ' << g;
    return out;
  }
};

// The links this machine runs for P devices: virtual devices on one GPU always;
// with two GPUs or more, virtual devices spread over the GPUs (copies and events
// across GPUs) and, with a GPU per device, NCCL.
std::vector<Link> links_for(int devices) {
  const int gpus = pc::gpu_count();
  std::vector<Link> links{{TransportKind::kVirtual, std::vector<int>(static_cast<std::size_t>(devices), 0)}};
  if (devices > 1 && gpus >= 2) links.push_back({TransportKind::kVirtual, pipeweave::place_devices(devices, gpus)});
  if (devices > 1 && gpus >= devices) links.push_back({TransportKind::kNccl, pipeweave::place_devices(devices, gpus)});
  return links;
}

pc::CudaOptions options_for(const Link& link, pc::MathMode math = pc::MathMode::kFp32) {
  pc::CudaOptions o;
  o.transport = link.kind;
  o.math = math;
  o.gpus = link.gpus;
  return o;
}

// What auto picks for P devices on this machine.
Link auto_link(int devices) {
  return {TransportKind::kAuto, pipeweave::place_devices(devices, pc::gpu_count())};
}

// Trains `program` over `link` for three steps of `rows` samples beside sequential
// training on GPU 0 (fp32), checking each loss and the weights after (within 1e-6,
// and a warning where they are not bit for bit); returns the pipeline.
auto train_beside_sequential(const Program& program, const MlpSpec& spec, const HostModel& init,
                             const RegressionTask& task, int rows, const OptimizerConfig& opt, const Link& link) {
  auto pipe = pipeweave::make_mlp_pipeline(program, spec, init, {rows, opt, 20s}, options_for(link));
  auto reference = pc::make_sequential(0, pc::MathMode::kFp32, spec, init, rows, program.shape.micro_batches, opt);
  reference->set_gradient_order(gradient_order(program));
  for (int step = 0; step < 3; ++step) {
    const double loss = pipe->train_step(task.inputs, task.targets).loss;
    const double want = reference->train_step(task.inputs, task.targets);
    CHECK(std::fabs(loss - want) <= 1e-6 * std::fabs(want));
  }
  const HostModel got = pipeweave::download_weights(*pipe, spec), want = reference->weights();
  const double diff = max_abs_difference(got, want);
  CHECK(diff <= 1e-6);
  if (!(got == want)) WARN("not bit-for-bit equal to sequential training on the GPU: max difference " << diff);
  return pipe;
}

}  // namespace

TEST_CASE("backend: copies, fills and the allocation count", "[cuda]") {
  pc::CudaBackend b(0);
  const std::vector<float> x = random_values(1000, 1);
  pc::DeviceBuffer d = on_device(b, x);
  pc::DeviceBuffer e = b.allocate(1000);
  b.copy(d.data(), e.data(), 1000);
  CHECK(to_host(b, e) == x);
  b.fill(e.data(), 1000, 0.0f);
  CHECK(to_host(b, e) == std::vector<float>(1000, 0.0f));
  b.fill(e.data() + 10, 5, -2.5f);
  std::vector<float> want(1000, 0.0f);
  std::fill(want.begin() + 10, want.begin() + 15, -2.5f);
  CHECK(to_host(b, e) == want);
  CHECK(b.allocations() == 2);
  CHECK_THAT(std::string(b.name()), Catch::StartsWith("cuda ("));
  CHECK_THROWS_WITH(pc::CudaBackend(pc::gpu_count()), Catch::Contains("does not exist"));
}

TEST_CASE("checks: a CUDA error after which the process cannot go on says so; another does not", "[cuda]") {
  CHECK_THROWS_WITH(PIPEWEAVE_CHECK_CUDA(cudaErrorIllegalAddress),
                    Catch::Contains("returned cudaErrorIllegalAddress (an illegal memory access was encountered); "
                                    "after this error no CUDA work of this process can succeed: end the process and "
                                    "start it again (a checkpoint resumes the run)"));
  try {
    PIPEWEAVE_CHECK_CUDA(cudaErrorMemoryAllocation);
    FAIL("no error");
  } catch (const pipeweave::Error& e) {
    CHECK_THAT(e.what(), Catch::EndsWith("returned cudaErrorMemoryAllocation (out of memory)"));
  }
}

TEST_CASE("backend: GEMM in every transpose and stride, in fp32, TF32 and bf16, against the CPU", "[cuda]") {
  for (pc::MathMode mode : {pc::MathMode::kFp32, pc::MathMode::kTf32, pc::MathMode::kBf16}) {
    pc::CudaBackend b(0, {mode});
    for (const auto& [m, n, k] : {std::tuple{37, 53, 29}, std::tuple{128, 64, 256}, std::tuple{1, 7, 300}}) {
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (float beta : {0.0f, 1.0f}) {
            const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
            const std::vector<float> a = random_values(static_cast<std::size_t>((ta ? k : m) * lda), 11);
            const std::vector<float> bm = random_values(static_cast<std::size_t>((tb ? n : k) * ldb), 12);
            std::vector<float> c = random_values(static_cast<std::size_t>(m * ldc), 13);
            pc::DeviceBuffer da = on_device(b, a), db = on_device(b, bm), dc = on_device(b, c);
            b.gemm(ta ? Transpose::kYes : Transpose::kNo, tb ? Transpose::kYes : Transpose::kNo, m, n, k, 0.5f,
                   da.data(), lda, db.data(), ldb, beta, dc.data(), ldc);
            const std::vector<float> got = to_host(b, dc);
            std::vector<double> scale;
            // bf16: the backend rounds the operands exactly as the host emulation does.
            // TF32: the tensor cores' own rounding may differ from round-to-nearest by
            // one unit of the 10-bit mantissa, so compare with the fp32 operands.
            host_gemm(ta, tb, m, n, k, 0.5f, a, lda, bm, ldb, beta, c, ldc,
                      mode == pc::MathMode::kBf16 ? mode : pc::MathMode::kFp32, scale);
            const double rel = mode == pc::MathMode::kTf32 ? 2 * std::ldexp(1.0, -10) : 1e-5;
            int bad = 0;
            for (int i = 0; i < m; ++i)
              for (int j = 0; j < n; ++j) {
                const auto idx = static_cast<std::size_t>(i * ldc + j);
                if (std::fabs(got[idx] - c[idx]) > rel * scale[idx] + 1e-6) ++bad;
              }
            INFO(pc::math_name(mode) << " m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb
                                     << " beta=" << beta);
            CHECK(bad == 0);
            // The padding between rows of C is never written.
            for (int i = 0; i < m; ++i)
              for (int j = n; j < ldc; ++j)
                CHECK(got[static_cast<std::size_t>(i * ldc + j)] == c[static_cast<std::size_t>(i * ldc + j)]);
          }
    }
  }
}

TEST_CASE("backend: the shared functors on the GPU equal the same functors on the CPU", "[cuda]") {
  pc::CudaBackend b(0);
  const std::size_t rows = 33, cols = 70, n = rows * cols;
  const std::vector<float> x = random_values(n, 21), y = random_values(n, 22), t = random_values(n, 23);
  const std::vector<float> bias = random_values(cols, 24);
  // One value of each kind per functor, on both sides, compared within an ulp or
  // two (nvcc may fuse a multiply and an add where the CPU rounds twice).
  auto close = [](const std::vector<float>& got, const std::vector<float>& want) {
    int bad = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      if (!(std::fabs(got[i] - want[i]) <= 4e-7 * std::max(1.0f, std::fabs(want[i])))) ++bad;
    return bad;
  };
  {
    // The layer's forward pass through the portable path (one call per element).
    pc::DeviceBuffer d = on_device(b, x), db = on_device(b, bias);
    for_each_element(b, rows, cols, BiasActivation<true>{d.data(), db.data(), cols});
    std::vector<float> want = x;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) BiasActivation<true>{want.data(), bias.data(), cols}(r, c);
    CHECK(to_host(b, d) == want);
  }
  {
    // The layer's first backward pass: dz and the bias gradient, rows in increasing order on both sides.
    pc::DeviceBuffer dy = on_device(b, y), dg = on_device(b, x), dz = b.allocate(n), out = on_device(b, bias);
    column_sums(b, rows, cols, ActivationGradient<true>{dy.data(), dg.data(), dz.data(), cols}, out.data());
    std::vector<float> want_dz(n), want = bias;
    const ActivationGradient<true> on_host{y.data(), x.data(), want_dz.data(), cols};
    for (std::size_t c = 0; c < cols; ++c) {
      float s = 0.0f;
      for (std::size_t r = 0; r < rows; ++r) s += on_host(r, c);
      want[c] += s;
    }
    CHECK(to_host(b, dz) == want_dz);
    CHECK(to_host(b, out) == want);
  }
  {
    pc::DeviceBuffer dy = on_device(b, y), dt = on_device(b, t), dg = b.allocate(n);
    b.for_each(n, MseGradient<float>{dy.data(), dt.data(), dg.data(), 2.0f / n});
    std::vector<float> want(n);
    for (std::size_t i = 0; i < n; ++i) MseGradient<float>{y.data(), t.data(), want.data(), 2.0f / n}(i);
    CHECK(close(to_host(b, dg), want) == 0);
  }
  {
    pc::DeviceBuffer w = on_device(b, x), g = on_device(b, y), v = on_device(b, t);
    b.for_each(n, MomentumUpdate{w.data(), g.data(), v.data(), 0.1f, 0.9f, 0.25f});
    std::vector<float> ww = x, vv = t;
    for (std::size_t i = 0; i < n; ++i) MomentumUpdate{ww.data(), y.data(), vv.data(), 0.1f, 0.9f, 0.25f}(i);
    CHECK(close(to_host(b, w), ww) == 0);
    CHECK(close(to_host(b, v), vv) == 0);
  }
  {
    const std::vector<float> m0 = random_values(n, 31), v0 = random_values(n, 32, 0.0f, 1.0f);
    pc::DeviceBuffer w = on_device(b, x), g = on_device(b, y), m = on_device(b, m0), v = on_device(b, v0);
    const AdamUpdate dev{w.data(), g.data(), m.data(), v.data(), 0.01f, 0.9f, 0.999f, 1e-8f, 0.5f, 0.1f, 0.001f};
    b.for_each(n, dev);
    std::vector<float> ww = x, mm = m0, vv = v0;
    for (std::size_t i = 0; i < n; ++i)
      AdamUpdate{ww.data(), y.data(), mm.data(), vv.data(), 0.01f, 0.9f, 0.999f, 1e-8f, 0.5f, 0.1f, 0.001f}(i);
    CHECK(close(to_host(b, m), mm) == 0);
    CHECK(close(to_host(b, v), vv) == 0);
    const std::vector<float> got = to_host(b, w);
    int bad = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (!(std::fabs(got[i] - ww[i]) <= 1e-6f)) ++bad;
    CHECK(bad == 0);
  }
}

TEST_CASE("backend: column sums add each column in row order, bit for bit as the CPU, in every tiling", "[cuda]") {
  pc::CudaBackend b(0);
  // Rows around the kernel's tile of 64 (none, part of one, one, one and a bit,
  // several), columns around its block of 32 (part of one, one and a bit, many).
  for (const std::size_t rows : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{65},
                                 std::size_t{200}, std::size_t{513}})
    for (const std::size_t cols : {std::size_t{1}, std::size_t{31}, std::size_t{33}, std::size_t{1000}}) {
      const std::size_t n = rows * cols;
      const std::vector<float> y = random_values(n, 31), dy = random_values(n, 32, -1e3f, 1e3f);
      const std::vector<float> init = random_values(cols, 33);
      pc::DeviceBuffer dy_d = on_device(b, dy), y_d = on_device(b, y), dz = b.allocate(n), out = on_device(b, init),
                       plain = on_device(b, init);
      column_sums(b, rows, cols, ActivationGradient<true>{y_d.data(), dy_d.data(), dz.data(), cols}, out.data());
      column_sums(b, rows, cols, ActivationGradient<false>{y_d.data(), dy_d.data(), nullptr, cols}, plain.data());
      std::vector<float> want_dz(n), want = init, want_plain = init;
      const ActivationGradient<true> relu{y.data(), dy.data(), want_dz.data(), cols};
      const ActivationGradient<false> identity{y.data(), dy.data(), nullptr, cols};
      for (std::size_t c = 0; c < cols; ++c) {
        float s = 0.0f, t = 0.0f;
        for (std::size_t r = 0; r < rows; ++r) {
          s += relu(r, c);
          t += identity(r, c);
        }
        want[c] += s;
        want_plain[c] += t;
      }
      INFO("rows=" << rows << " cols=" << cols);
      if (n > 0) CHECK(to_host(b, dz) == want_dz);  // every element's f ran once, and only in the matrix
      CHECK(to_host(b, out) == want);
      CHECK(to_host(b, plain) == want_plain);
    }
}

TEST_CASE("backend: sums reduce into device memory", "[cuda]") {
  pc::CudaBackend b(0);
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
    const std::vector<float> y = random_values(n, 41), t = random_values(n, 42);
    pc::DeviceBuffer dy = on_device(b, y), dt = on_device(b, t), out = b.allocate(1);
    b.sum(n, SquaredError<float>{dy.data(), dt.data(), 1.0f / static_cast<float>(n)}, out.data());
    double want = 0;
    for (std::size_t i = 0; i < n; ++i) want += SquaredError<float>{y.data(), t.data(), 1.0f / static_cast<float>(n)}(i);
    CHECK(std::fabs(to_host(b, out)[0] - want) <= 1e-5 * want);
  }
  std::vector<float> x = random_values(5000, 43);
  x[7] = std::numeric_limits<float>::quiet_NaN();
  x[4999] = std::numeric_limits<float>::infinity();
  x[100] = -std::numeric_limits<float>::infinity();
  pc::DeviceBuffer dx = on_device(b, x), out = b.allocate(1);
  b.sum(x.size(), NonFinite{dx.data()}, out.data());
  CHECK(to_host(b, out)[0] == 3.0f);
  b.sum(0, NonFinite{dx.data()}, out.data());
  CHECK(to_host(b, out)[0] == 0.0f);
}

TEST_CASE("backend: the CUDA-event clock and a wait check that stops synchronize()", "[cuda]") {
  pc::CudaBackend b(0);
  const int n = 2048;
  pc::DeviceBuffer a = on_device(b, random_values(static_cast<std::size_t>(n) * n, 51)), c = b.allocate(static_cast<std::size_t>(n) * n);
  b.synchronize();
  b.reset_clock();
  const std::size_t s0 = b.time_stamp();
  for (int i = 0; i < 4; ++i) b.gemm(Transpose::kNo, Transpose::kNo, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n);
  const std::size_t s1 = b.time_stamp();
  b.synchronize();
  CHECK(b.elapsed_us(s0) >= 0.0);
  CHECK(b.elapsed_us(s1) > b.elapsed_us(s0));
  CHECK_THROWS_WITH(b.elapsed_us(s1 + 1), Catch::Contains("was not taken"));

  int calls = 0;
  b.set_wait_check([&](std::chrono::steady_clock::duration) {
    if (++calls >= 1) throw Error("stop waiting");
  });
  for (int i = 0; i < 20; ++i) b.gemm(Transpose::kNo, Transpose::kNo, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n);
  CHECK_THROWS_WITH(b.synchronize(), "stop waiting");
  b.set_wait_check({});
  b.synchronize();
}

TEST_CASE("backend: a side backend's time stamps count from the origin of the backend it was made from", "[cuda]") {
  pc::CudaBackend b(0);
  pc::CudaBackend side = b.side();
  const int n = 2048;
  pc::DeviceBuffer a = on_device(b, random_values(static_cast<std::size_t>(n) * n, 52)), c = b.allocate(static_cast<std::size_t>(n) * n);
  b.synchronize();
  b.reset_clock();
  for (int i = 0; i < 4; ++i) b.gemm(Transpose::kNo, Transpose::kNo, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n);
  const std::size_t main_end = b.time_stamp();
  // As the session does: the side's clock is reset after the main one's, and its
  // work follows the main stream's through wait_for.
  side.reset_clock();
  side.wait_for(b);
  const std::size_t side_start = side.time_stamp();
  side.gemm(Transpose::kNo, Transpose::kNo, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n);
  const std::size_t side_end = side.time_stamp();
  b.wait_for(side);
  const std::size_t main_after = b.time_stamp();
  b.synchronize();
  side.synchronize();
  // Had the side its own origin (recorded on its idle stream at once), its stamps
  // would count from well after the main origin and come out before main_end.
  CHECK(b.elapsed_us(main_end) > 0.0);
  CHECK(side.elapsed_us(side_start) >= b.elapsed_us(main_end));
  CHECK(side.elapsed_us(side_end) > side.elapsed_us(side_start));
  CHECK(b.elapsed_us(main_after) >= side.elapsed_us(side_end));
  CHECK_THROWS_WITH(side.elapsed_us(side_end + 1), Catch::Contains("was not taken"));
}

TEST_CASE("backend: in bf16 mode the weights are rounded once per optimizer step, not in every GEMM", "[cuda]") {
  const int m = 64, n = 48, k = 80;
  pc::CudaBackend b(0, {pc::MathMode::kBf16}), plain(0, {pc::MathMode::kBf16});
  const std::vector<float> x = random_values(static_cast<std::size_t>(m) * k, 71);
  std::vector<float> w = random_values(static_cast<std::size_t>(n) * k, 72);
  const std::vector<float> g = random_values(w.size(), 73);
  pc::DeviceBuffer dx = on_device(b, x), dw = on_device(b, w), dg = on_device(b, g), y = b.allocate(static_cast<std::size_t>(m) * n);
  pc::DeviceBuffer px = on_device(plain, x), pw = plain.allocate(w.size()), py = plain.allocate(y.size());
  // y = x w^T, as Linear's forward; `plain` rounds both operands in every GEMM (it
  // has seen no update), so both must give the same bits.
  auto same_as_plain = [&] {
    b.gemm(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, dx.data(), k, dw.data(), k, 0.0f, y.data(), n);
    plain.upload(w.data(), pw.data(), w.size());
    plain.gemm(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, px.data(), k, pw.data(), k, 0.0f, py.data(), n);
    return to_host(b, y) == to_host(plain, py);
  };
  std::size_t rounded = b.bf16_rounded();
  CHECK(same_as_plain());
  CHECK(b.bf16_rounded() - rounded == x.size() + w.size());  // no copy yet: both operands rounded
  CHECK(b.bf16_parameter_copies() == 0);

  // An optimizer step makes the weights' copy, in the update's kernel.
  b.for_each(w.size(), SgdUpdate{dw.data(), dg.data(), 0.1f, 1.0f});
  w = to_host(b, dw);
  CHECK(b.bf16_parameter_copies() == 1);
  rounded = b.bf16_rounded();
  CHECK(same_as_plain());  // reads the updated weights
  CHECK(b.bf16_rounded() - rounded == x.size());  // only the activations were rounded
  // The input-gradient GEMM (dx = dy W) reads W through the copy too, from an offset inside it.
  rounded = b.bf16_rounded();
  b.gemm(Transpose::kNo, Transpose::kNo, m, k - 8, n, 1.0f, y.data(), n, dw.data() + 8, k, 0.0f, dx.data(), k);
  CHECK(b.bf16_rounded() - rounded == static_cast<std::size_t>(m) * n);
  b.upload(x.data(), dx.data(), x.size());

  // The next update refreshes the copy; so does an upload into the weights.
  b.for_each(w.size(), SgdUpdate{dw.data(), dg.data(), 0.1f, 1.0f});
  w = to_host(b, dw);
  CHECK(same_as_plain());
  w = random_values(w.size(), 74);
  b.upload(w.data(), dw.data(), w.size());
  CHECK(same_as_plain());
  b.fill(dw.data() + 5, 10, 0.25f);
  w = to_host(b, dw);
  CHECK(same_as_plain());
  CHECK(b.bf16_parameter_copies() == 1);

  // Outside bf16 mode no copy is made.
  pc::CudaBackend f(0, {pc::MathMode::kFp32});
  pc::DeviceBuffer fw = on_device(f, w), fg = on_device(f, g);
  f.for_each(w.size(), SgdUpdate{fw.data(), fg.data(), 0.1f, 1.0f});
  CHECK(f.bf16_parameter_copies() == 0);
}

TEST_CASE("pipelines: in bf16 a step after the first rounds no weights, and equals sequential training", "[cuda]") {
  const MlpSpec spec = MlpSpec::uniform(8, 64, 64, 64, 2);
  const RegressionTask task = make_regression_task(spec, 64, 5);
  const HostModel init = init_mlp(spec);
  const Program program = make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4);
  const OptimizerConfig opt{OptimizerKind::kAdam, 0.003f};
  auto pipe = pipeweave::make_mlp_pipeline(program, spec, init, {64, opt, 20s}, options_for(auto_link(2), pc::MathMode::kBf16));
  auto reference = pc::make_sequential(0, pc::MathMode::kBf16, spec, init, 64, 4, opt);
  for (int step = 0; step < 3; ++step) {
    std::vector<std::size_t> before(2);
    pipe->for_each_device([&](int d, auto& parts) { before[static_cast<std::size_t>(d)] = parts.backend.bf16_rounded(); });
    pipe->train_step(task.inputs, task.targets);
    reference->train_step(task.inputs, task.targets);
    // Each device rounds, per micro-batch and layer, its input activation (forward
    // and weight gradient) and the output gradient (input gradient, weight gradient):
    // 64/4 rows x 64 features, 4 times; from the second step on, no weight.
    std::vector<std::size_t> rounded(2);
    pipe->for_each_device([&](int d, auto& parts) {
      rounded[static_cast<std::size_t>(d)] = parts.backend.bf16_rounded() - before[static_cast<std::size_t>(d)];
      CHECK(parts.backend.bf16_parameter_copies() == 2);  // one per chunk
    });
    INFO("step " << step);
    if (step > 0)
      for (int d = 0; d < 2; ++d) {
        const std::size_t per_call = 16 * 64, layers = 4, micro_batches = 4;
        // forward: x; backward: dz and x (weight gradient), dz (input gradient, but
        // not for the model's first layer, on device 0)
        const std::size_t calls = micro_batches * (layers * 4 - (d == 0 ? 1 : 0));
        CHECK(rounded[static_cast<std::size_t>(d)] == calls * per_call);
      }
  }
  CHECK(pipeweave::download_weights(*pipe, spec) == reference->weights());
}

TEST_CASE("NCCL: closing a non-blocking communicator finalizes it, without aborting", "[cuda]") {
  ncclUniqueId id;
  PIPEWEAVE_CHECK_NCCL(ncclGetUniqueId(&id));
  std::vector<pc::NcclComm> comms = pc::NcclComm::create_all({0}, id, 20s);
  REQUIRE(comms.size() == 1);
  CHECK(comms[0].state() == ncclSuccess);
  CHECK(pc::NcclComm::close_all(comms, 20s) == 0);
  CHECK(comms[0].get() == nullptr);
}

TEST_CASE("transports: reset drains the transfers of a failed group before any device goes on", "[cuda]") {
  // Virtual devices: a group's copies are enqueued as its messages match, so a
  // failing group may leave some queued. (NCCL moves nothing until the host has
  // matched the whole group.)
  for (const Link& link : links_for(2)) {
    if (link.kind != TransportKind::kVirtual) continue;
    INFO(link);
    auto fabric = pc::make_fabric(link.kind, link.gpus, {20s});
    std::vector<pc::Endpoint> ends = fabric->endpoints();
    const std::size_t big = std::size_t{16} << 20;  // 64 MiB
    std::vector<float> landed(8, -1.0f), at_end(8, -1.0f);
    auto errors = on_threads(2, [&](int d) {
      pc::CudaBackend b = fabric->make_backend(d);
      pc::Endpoint& t = ends[static_cast<std::size_t>(d)];
      pc::DeviceBuffer buf = b.allocate(big), small = b.allocate(10);
      b.fill(buf.data(), big, d == 0 ? 1.0f : 0.0f);
      pc::DeviceBuffer a, c;  // freed only at the end: cudaFree would wait for the GPU
      if (d == 1) {
        // Keep the receiver's stream busy, so that the copy of the group (which
        // waits for it) is still queued when the group fails.
        const int n = 4096;
        a = b.allocate(static_cast<std::size_t>(n) * n);
        c = b.allocate(static_cast<std::size_t>(n) * n);
        b.fill(a.data(), a.size(), 0.5f);
        for (int i = 0; i < 60; ++i)
          b.gemm(Transpose::kNo, Transpose::kNo, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n);
      }
      t.group_begin(3);
      if (d == 0) {
        t.send(1, act(0, 0, big * sizeof(float)), buf.data());
        t.send(1, act(0, 2, 40), small.data());
      } else {
        t.recv(0, act(0, 0, big * sizeof(float)), buf.data());
        t.recv(0, act(0, 1, 40), small.data());  // the second message does not match: the group fails
      }
      try {
        t.group_end();
      } catch (const std::exception& e) {
        t.abort(e.what());
      }
      t.reset();
      if (d == 1) {
        // Right after reset, nothing synchronized (cudaMemcpy does not wait for the
        // backend's non-blocking streams): the first message has landed.
        PIPEWEAVE_CHECK_CUDA(cudaMemcpy(landed.data(), buf.data() + big - landed.size(), landed.size() * sizeof(float),
                                        cudaMemcpyDeviceToHost));
      } else {
        b.fill(buf.data(), big, 2.0f);  // the next step may overwrite the send buffer
        b.synchronize();
      }
      t.agree(true);  // device 0 has overwritten its send buffer
      if (d == 1) {
        b.synchronize();
        PIPEWEAVE_CHECK_CUDA(cudaMemcpy(at_end.data(), buf.data(), at_end.size() * sizeof(float), cudaMemcpyDeviceToHost));
      }
    });
    CHECK(errors == std::vector<std::string>{"", ""});
    CHECK(landed == std::vector<float>(8, 1.0f));
    CHECK(at_end == std::vector<float>(8, 1.0f));
  }
}

TEST_CASE("transports: messages move between devices in FIFO order with their checks", "[cuda]") {
  for (const Link& link : links_for(3)) {
    INFO(link);
    auto fabric = pc::make_fabric(link.kind, link.gpus, {5s});
    std::string copies;  // how the GPUs reach each other here
    for (int from : link.gpus)
      for (int to : link.gpus)
        if (from != to)
          copies += "GPU " + std::to_string(to) + (fabric->direct_copies(from, to) ? " reads GPU " : " gets staged copies of GPU ") +
                    std::to_string(from) + "; ";
    INFO(copies);
    std::vector<pc::Endpoint> ends = fabric->endpoints();
    const std::vector<float> a = random_values(1000, 61), c = random_values(10, 62);
    std::vector<std::vector<float>> got(3);
    std::vector<int> agreed(3, -1);  // Catch2's assertions are not thread-safe: collect, check after
    auto errors = on_threads(3, [&](int d) {
      pc::CudaBackend b = fabric->make_backend(d);
      pc::Endpoint& t = ends[static_cast<std::size_t>(d)];
      if (d == 0) {
        pc::DeviceBuffer x = on_device(b, a), y = on_device(b, c);
        t.group_begin(0);
        t.send(1, act(0, 0, 4000), x.data());
        t.send(2, act(0, 1, 40), y.data());
        t.group_end();
        b.fill(x.data(), 1000, 0.0f);  // may overwrite the send buffer once the group is done
        b.synchronize();
      } else {
        pc::DeviceBuffer r = b.allocate(d == 1 ? 1000 : 10);
        t.group_begin(0);
        t.recv(0, act(0, d - 1, d == 1 ? 4000 : 40), r.data());
        t.group_end();
        got[static_cast<std::size_t>(d)] = to_host(b, r);
      }
      agreed[static_cast<std::size_t>(d)] = t.agree(true) ? 1 : 0;
    });
    CHECK(errors == std::vector<std::string>{"", "", ""});
    CHECK(agreed == std::vector<int>{1, 1, 1});
    CHECK(got[1] == a);
    CHECK(got[2] == c);

    // A mismatch stops both sides, before the data moves, and reset makes the fabric usable again.
    errors = on_threads(2 + 1, [&](int d) {
      pc::CudaBackend b = fabric->make_backend(d);
      pc::Endpoint& t = ends[static_cast<std::size_t>(d)];
      if (d == 2) {
        t.agree(true);
        return;
      }
      pc::DeviceBuffer x = b.allocate(10);
      t.group_begin(4);
      if (d == 0)
        t.send(1, act(0, 3, 40), x.data());
      else
        t.recv(0, act(0, 2, 40), x.data());
      try {
        t.group_end();
      } catch (const std::exception& e) {
        t.abort(e.what());
        throw;
      }
    });
    CHECK_THAT(errors[0] + errors[1],
               Catch::Contains("expects from device 0 activation(stage 0, micro-batch 2), 40 bytes of fp32, but the message it "
                               "matches, sent by device 0 at its step 4, is activation(stage 0, micro-batch 3)"));
    CHECK_FALSE(errors[2].empty());  // stopped in its agreement
    errors = on_threads(3, [&](int d) {
      pc::CudaBackend b = fabric->make_backend(d);
      ends[static_cast<std::size_t>(d)].reset();
      agreed[static_cast<std::size_t>(d)] = ends[static_cast<std::size_t>(d)].agree(true) ? 1 : 0;
    });
    CHECK(errors == std::vector<std::string>{"", "", ""});
    CHECK(agreed == std::vector<int>{1, 1, 1});
  }
}

TEST_CASE("transports: a device that never sends is a timeout error, not a hang", "[cuda]") {
  for (const Link& link : links_for(2)) {
    INFO(link);
    auto fabric = pc::make_fabric(link.kind, link.gpus, {std::chrono::milliseconds(300)});
    std::vector<pc::Endpoint> ends = fabric->endpoints();
    const auto t0 = std::chrono::steady_clock::now();
    auto errors = on_threads(2, [&](int d) {
      pc::CudaBackend b = fabric->make_backend(d);
      if (d == 1) return;
      pc::DeviceBuffer r = b.allocate(4);
      ends[0].group_begin(2);
      ends[0].recv(1, act(0, 0, 16), r.data());
      ends[0].group_end();
    });
    CHECK(std::chrono::steady_clock::now() - t0 < 10s);
    CHECK_THAT(errors[0], Catch::Contains("device 0, step 2: timed out after 300 ms waiting for device 1 to send"));
  }
}

TEST_CASE("pipelines: every schedule and transport equals sequential training on the GPU", "[cuda]") {
  const MlpSpec spec = MlpSpec::uniform(8, 48, 64, 40, 5);
  const RegressionTask task = make_regression_task(spec, 64, 9);
  const HostModel init = init_mlp(spec);
  const OptimizerConfig opt{OptimizerKind::kAdam, 0.003f};
  // Overlapped pairs run their backward on each device's second stream.
  for (const auto& [kind, P, V, M, pairs] :
       {std::tuple{ScheduleKind::kInterleaved1F1B, 2, 2, 4, false}, std::tuple{ScheduleKind::kOneFOneB, 2, 1, 4, false},
        std::tuple{ScheduleKind::kGPipe, 2, 1, 2, false}, std::tuple{ScheduleKind::kInterleaved1F1B, 4, 2, 8, false},
        std::tuple{ScheduleKind::kZeroBubbleH1, 2, 1, 4, false},  // split backwards (I, W)
        std::tuple{ScheduleKind::kZeroBubbleV, 2, 2, 4, false},   // and the v placement
        std::tuple{ScheduleKind::kLoopedBFS, 2, 2, 4, false},     // backwards in reverse
        std::tuple{ScheduleKind::kInterleaved1F1B, 2, 2, 4, true},  // overlapped pairs
        std::tuple{ScheduleKind::kInterleaved1F1B, 4, 2, 8, true},  // the seed's pairs
        std::tuple{ScheduleKind::kDualPipeV, 2, 2, 4, false}}) {
    const Program program = pairs ? overlap(make_schedule(kind, P, V, M)) : make_schedule(kind, P, V, M);
    CHECK(has_pairs(program) == (pairs || kind == ScheduleKind::kDualPipeV));
    for (const Link& link : links_for(P)) {
      INFO(schedule_name(kind) << (pairs ? "+overlap" : "") << " P=" << P << " V=" << V << " M=" << M << ", " << link);
      auto pipe = train_beside_sequential(program, spec, init, task, 64, opt, link);
      CHECK(pc::transport_of(*pipe) == link.kind);
      // The measured trace: every action of every device, in order, in microseconds.
      const Trace& t = pipe->trace();
      CHECK(t.time_unit == "us");
      for (int d = 0; d < P; ++d) {
        const auto& events = t.compute[static_cast<std::size_t>(d)];
        CHECK(events.size() == program.devices[static_cast<std::size_t>(d)].size());
        double floor = 0, pair_floor = 0;  // one stream, in order (event resolution); a pair's halves both after floor
        for (std::size_t i = 0; i < events.size(); ++i) {
          CHECK(events[i].end >= events[i].start);
          const bool second_half = event_lane(events, i) == 1;
          CHECK(events[i].start >= (second_half ? pair_floor : floor) - 1.0);
          // The side stream's stamps count from the main stream's origin, and its
          // backward waits (wait_for) for everything before the pair: no slack.
          if (second_half) CHECK(events[i].start >= pair_floor);
          if (!second_half) pair_floor = floor;
          floor = second_half ? std::max(floor, events[i].end) : events[i].end;
        }
        CHECK(t.peak_activations[static_cast<std::size_t>(d)] == pipe->plan(d).peak_kept);
      }
    }
  }
}

TEST_CASE("pipelines: offloaded and recomputed programs equal sequential training, the copies beside the compute",
          "[cuda]") {
  // An offload's copy goes to page-locked host memory on the device's copy stream when its forward (or its I)
  // ends, and the compute stream waits for it at the O; a reload's at the L, waited for by its backward.
  const MlpSpec spec = MlpSpec::uniform(8, 48, 64, 40, 5);
  const RegressionTask task = make_regression_task(spec, 64, 9);
  const HostModel init = init_mlp(spec);
  const OptimizerConfig opt{OptimizerKind::kAdam, 0.003f};
  static_assert(pipeweave::CopyLaneBackend<pc::CudaBackend>);
  long overlapped = 0;  // copies that ran while their device computed
  for (const auto& [kind, P, V, M, recompute, offload] :
       {std::tuple{ScheduleKind::kOneFOneB, 2, 1, 4, false, true},
        std::tuple{ScheduleKind::kInterleaved1F1B, 2, 2, 4, false, true},
        std::tuple{ScheduleKind::kZeroBubbleH1, 2, 1, 4, true, true},  // recomputed, offloaded in weight windows
        std::tuple{ScheduleKind::kZeroBubbleV, 2, 2, 4, false, true},
        std::tuple{ScheduleKind::kOneFOneB, 2, 1, 4, true, false}}) {
    Program program = make_schedule(kind, P, V, M);
    if (recompute) program = pipeweave::with_recompute(program, pipeweave::all_stages(program.shape));
    if (offload) program = pipeweave::with_offload(program, pipeweave::all_stages(program.shape));
    for (const Link& link : links_for(P)) {
      INFO(schedule_name(kind) << (recompute ? "+recompute" : "") << (offload ? "+offload" : "") << " P=" << P
                               << " V=" << V << " M=" << M << ", " << link);
      auto pipe = train_beside_sequential(program, spec, init, task, 64, opt, link);
      const Trace& t = pipe->trace();
      CHECK(t.peak_memory == pipeweave::peak_memory(program));
      for (int d = 0; d < P; ++d) {
        const auto at = static_cast<std::size_t>(d);
        const auto& copies = t.copies[at];
        CHECK(static_cast<long>(copies.size()) ==
              std::count_if(program.devices[at].begin(), program.devices[at].end(),
                            [](const pipeweave::Action& a) { return pipeweave::is_copy(a.phase); }));
        for (const auto& e : copies) {
          CHECK(e.end >= e.start);
          for (const auto& c : t.compute[at]) overlapped += c.start < e.end && e.start < c.end ? 1 : 0;
        }
      }
    }
  }
  WARN("copies overlapping their device's compute: " << overlapped);
  CHECK(overlapped > 0);
}

TEST_CASE("pipelines: TF32 and bf16 stay within the documented tolerance of fp32 training on the CPU", "[cuda]") {
  for (const test::ToleranceCase& tc : test::kToleranceCases) {
    const MlpSpec spec = tc.spec();
    const RegressionTask task = make_regression_task(spec, tc.rows, 11);
    const HostModel init = init_mlp(spec);
    const test::CpuRun cpu = test::train_on_cpu(spec, init, task, tc.micro_batches, test::tolerance_optimizer(), tc.steps);
    const Program program = make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, tc.micro_batches);
    for (pc::MathMode math : {pc::MathMode::kFp32, pc::MathMode::kTf32, pc::MathMode::kBf16}) {
      auto pipe = pipeweave::make_mlp_pipeline(program, spec, init, {tc.rows, test::tolerance_optimizer(), 20s},
                                        options_for(auto_link(2), math));
      double worst_loss = 0;
      for (int s = 0; s < tc.steps; ++s) {
        const double l = pipe->train_step(task.inputs, task.targets).loss;
        const double want = cpu.losses[static_cast<std::size_t>(s)];
        worst_loss = std::max(worst_loss, std::fabs(l - want) / std::fabs(want));
      }
      const double worst_param = max_abs_difference(pipeweave::download_weights(*pipe, spec), cpu.weights);
      const pc::Tolerance tol = pc::tolerance(math);
      std::printf("GPU %s against CPU fp32, %s: loss %.2e (tolerance %.0e), parameters %.2e (tolerance %.0e)\n",
                  std::string(pc::math_name(math)).c_str(), tc.name, worst_loss, tol.loss_relative, worst_param,
                  tol.parameter_absolute);
      INFO(tc.name << ", " << pc::math_name(math));
      CHECK(worst_loss <= tol.loss_relative);
      CHECK(worst_param <= tol.parameter_absolute);
    }
  }
}

TEST_CASE("pipelines: steps after the first allocate nothing on the device", "[cuda]") {
  const MlpSpec spec = MlpSpec::uniform(8, 32, 32, 32);
  const RegressionTask task = make_regression_task(spec, 32, 3);
  auto pipe = pipeweave::make_mlp_pipeline(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4), spec, init_mlp(spec), {32, {}, 20s},
                                    options_for(auto_link(2)));
  pipe->train_step(task.inputs, task.targets);
  std::vector<std::size_t> after_first(2);
  pipe->for_each_device([&](int d, auto& parts) { after_first[static_cast<std::size_t>(d)] = parts.backend.allocations(); });
  for (int s = 0; s < 3; ++s) pipe->train_step(task.inputs, task.targets);
  std::vector<std::size_t> after_more(2);
  pipe->for_each_device([&](int d, auto& parts) { after_more[static_cast<std::size_t>(d)] = parts.backend.allocations(); });
  CHECK(after_more == after_first);
}

namespace {

// A chunk that throws when told to, to make one device fail in the middle of a step.
struct FailingChunk {
  pc::GpuMlpChunk inner;
  std::shared_ptr<std::atomic<int>> fail_micro_batch;  // -1: never
  std::size_t input_size() const { return inner.input_size(); }
  std::size_t output_size() const { return inner.output_size(); }
  void reserve(pc::CudaBackend& b, int slots, int rows) { inner.reserve(b, slots, rows); }
  void forward(pc::CudaBackend& b, const ChunkCall& call, const float* x, float* y) {
    if (call.micro_batch == fail_micro_batch->load()) throw Error("injected failure");
    inner.forward(b, call, x, y);
  }
  void backward(pc::CudaBackend& b, const ChunkCall& call, const float* dy, float* dx) { inner.backward(b, call, dy, dx); }
  std::span<const ParameterView> parameters() const { return inner.parameters(); }
};
static_assert(Chunk<FailingChunk, pc::CudaBackend>);

}  // namespace

TEST_CASE("pipelines: a failing device stops every device with an error, and the next step works", "[cuda]") {
  const MlpSpec spec = MlpSpec::uniform(8, 32, 32, 32);
  const RegressionTask task = make_regression_task(spec, 32, 3);
  const HostModel init = init_mlp(spec);
  const Program program = make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4);
  const OptimizerConfig opt{OptimizerKind::kSgd, 0.01f};
  for (const Link& link : links_for(2)) {
    INFO(link);
    auto fabric = pc::make_fabric(link.kind, link.gpus, {10s});
    std::vector<pc::Endpoint> ends = fabric->endpoints();
    auto fail = std::make_shared<std::atomic<int>>(-1);
    auto make_device = [&](int d) {
      pc::CudaBackend b = fabric->make_backend(d);
      std::vector<FailingChunk> chunks;
      for (int c = 0; c < 2; ++c)
        chunks.push_back({pc::GpuMlpChunk(MlpChunk<pc::CudaBackend>(b, spec, chunk_layers(program.shape, 8, d, c), init), c),
                          d == 1 ? fail : std::make_shared<std::atomic<int>>(-1)});
      return DeviceParts<pc::CudaBackend, pc::Endpoint, FailingChunk>{std::move(b), std::move(ends[static_cast<std::size_t>(d)]),
                                                                      std::move(chunks)};
    };
    Pipeline<pc::CudaBackend, pc::Endpoint, FailingChunk> pipe(program, make_device, {32, opt});
    auto reference = pc::make_sequential(0, pc::MathMode::kFp32, spec, init, 32, 4, opt);
    pipe.train_step(task.inputs, task.targets);
    reference->train_step(task.inputs, task.targets);
    fail->store(2);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(pipe.train_step(task.inputs, task.targets),
                      Catch::Contains("device 1") && Catch::Contains("injected failure") &&
                          Catch::Contains("the step was not applied"));
    CHECK(std::chrono::steady_clock::now() - t0 < 10s);
    fail->store(-1);
    for (int s = 0; s < 2; ++s) {
      const double loss = pipe.train_step(task.inputs, task.targets).loss;
      CHECK(std::fabs(loss - reference->train_step(task.inputs, task.targets)) <= 1e-6);
    }
  }
  // A non-finite loss: every device keeps its parameters.
  auto pipe = pipeweave::make_mlp_pipeline(program, spec, init, {32, {OptimizerKind::kSgd, 1e30f}, 20s}, options_for(auto_link(2)));
  pipe->train_step(task.inputs, task.targets);
  const HostModel before = pipeweave::download_weights(*pipe, spec);
  CHECK_THROWS_WITH(pipe->train_step(task.inputs, task.targets), Catch::Contains("the step was not applied"));
  CHECK(pipeweave::download_weights(*pipe, spec) == before);
}

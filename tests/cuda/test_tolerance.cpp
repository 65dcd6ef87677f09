// The tolerances of precision.hpp, checked on the CPU: a backend that rounds every
// GEMM operand as TF32 or bf16 tensor cores do (and, for fp32, one that sums in
// double precision, standing for a different summation order) trains the test
// cases; the loss and the parameters stay within the documented tolerance of the
// fp32 CPU run. TF32 is emulated with both roundings the GPU may apply (to
// nearest, and truncation of the low 13 bits): the bound must hold for the worse.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

#include "cases.hpp"
#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/cuda/precision.hpp"
#include "pipeweave/model/sequential.hpp"

using namespace pipeweave;

namespace {

// The CPU backend with the GEMM operands rounded to a math mode's precision; in
// fp32 mode the GEMM is computed in double precision and rounded once.
class RoundingBackend {
 public:
  using Buffer = cpu::HostBuffer;
  RoundingBackend(pipeweave::cuda::MathMode mode, pipeweave::cuda::Rounding rounding)
      : mode_(mode), rounding_(rounding) {}

  Buffer allocate(std::size_t n) { return inner_.allocate(n); }
  std::size_t allocations() const { return inner_.allocations(); }
  void upload(const float* h, float* d, std::size_t n) { inner_.upload(h, d, n); }
  void download(const float* d, float* h, std::size_t n) { inner_.download(d, h, n); }
  void copy(const float* s, float* d, std::size_t n) { inner_.copy(s, d, n); }
  void fill(float* d, std::size_t n, float v) { inner_.fill(d, n, v); }
  void gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
            int ldb, float beta, float* c, int ldc) {
    const bool at = ta == Transpose::kYes, bt = tb == Transpose::kYes;
    if (mode_ == pipeweave::cuda::MathMode::kFp32) {
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double acc = 0;
          for (int p = 0; p < k; ++p)
            acc += static_cast<double>(at ? a[p * lda + i] : a[i * lda + p]) *
                   static_cast<double>(bt ? b[j * ldb + p] : b[p * ldb + j]);
          float& out = c[i * ldc + j];
          out = static_cast<float>(alpha * acc + (beta == 0.0f ? 0.0 : static_cast<double>(beta) * out));
        }
      return;
    }
    round_into(a_, a, at ? k : m, at ? m : k, lda);
    round_into(b_, b, bt ? n : k, bt ? k : n, ldb);
    inner_.gemm(ta, tb, m, n, k, alpha, a_.data(), lda, b_.data(), ldb, beta, c, ldc);
  }
  template <class F>
  void for_each(std::size_t n, F f) {
    inner_.for_each(n, f);
  }
  template <class F>
  void sum(std::size_t n, F f, float* out) {
    inner_.sum(n, f, out);
  }
  void synchronize() {}
  void reset_clock() { inner_.reset_clock(); }
  std::size_t time_stamp() { return inner_.time_stamp(); }
  double elapsed_us(std::size_t i) const { return inner_.elapsed_us(i); }
  std::string_view name() const { return "cpu, operands rounded"; }

 private:
  void round_into(std::vector<float>& out, const float* x, int rows, int cols, int ld) {
    out.assign(rows > 0 ? static_cast<std::size_t>(rows - 1) * ld + cols : 0, 0.0f);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = pipeweave::cuda::round_operand(x[i], mode_, rounding_);
  }
  cpu::CpuBackend inner_;
  pipeweave::cuda::MathMode mode_;
  pipeweave::cuda::Rounding rounding_;
  std::vector<float> a_, b_;
};
static_assert(Backend<RoundingBackend>);

}  // namespace

TEST_CASE("TF32 and bf16 operand rounding stays within the documented tolerance of fp32", "[cuda]") {
  using pipeweave::cuda::MathMode;
  using pipeweave::cuda::Rounding;
  cpu::set_blas_threads(1);
  for (const test::ToleranceCase& tc : test::kToleranceCases) {
    const MlpSpec spec = tc.spec();
    const RegressionTask task = make_regression_task(spec, tc.rows, 11);
    const HostModel init = init_mlp(spec);
    SequentialTrainer<cpu::CpuBackend> exact(cpu::CpuBackend{}, spec, init, tc.rows, tc.micro_batches,
                                             test::tolerance_optimizer());
    std::vector<double> losses;
    for (int s = 0; s < tc.steps; ++s) losses.push_back(exact.train_step(task.inputs, task.targets));
    const HostModel want = exact.weights();
    for (MathMode mode : {MathMode::kFp32, MathMode::kTf32, MathMode::kBf16})
      for (Rounding rounding : {Rounding::kNearestEven, Rounding::kTruncate}) {
        if (!pipeweave::cuda::may_round(mode, rounding)) continue;
        SequentialTrainer<RoundingBackend> rounded(RoundingBackend(mode, rounding), spec, init, tc.rows,
                                                   tc.micro_batches, test::tolerance_optimizer());
        double worst_loss = 0;
        for (int s = 0; s < tc.steps; ++s) {
          const double l = rounded.train_step(task.inputs, task.targets);
          worst_loss = std::max(worst_loss, std::fabs(l - losses[static_cast<std::size_t>(s)]) /
                                                std::fabs(losses[static_cast<std::size_t>(s)]));
        }
        const double worst_param = max_abs_difference(rounded.weights(), want);
        const pipeweave::cuda::Tolerance tol = pipeweave::cuda::tolerance(mode);
        const char* how = rounding == Rounding::kTruncate ? "truncated" : "to nearest";
        std::printf("%s, %s (%s): loss differs by %.2e (relative, tolerance %.0e), parameters by %.2e (tolerance %.0e)\n",
                    tc.name, std::string(pipeweave::cuda::math_name(mode)).c_str(), how, worst_loss, tol.loss_relative,
                    worst_param, tol.parameter_absolute);
        INFO(tc.name << ", " << pipeweave::cuda::math_name(mode) << ", " << how);
        CHECK(worst_loss <= tol.loss_relative);
        CHECK(worst_param <= tol.parameter_absolute);
      }
  }
}

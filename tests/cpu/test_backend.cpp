// The CPU backend and the layer set: GEMM with transposes, functors, reductions,
// allocation counting, and the MLP chunk's gradients against finite differences.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/model/layers.hpp"
#include "pipeweave/model/loss.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/runtime/finite.hpp"
#include "pipeweave/runtime/optimizer_state.hpp"

using namespace pipeweave;
using cpu::CpuBackend;

namespace {

// Row-major op(A) (m x k) times op(B) (k x n) the plain way.
std::vector<float> naive_gemm(bool ta, bool tb, int m, int n, int k, const std::vector<float>& a,
                              const std::vector<float>& b) {
  std::vector<float> c(static_cast<std::size_t>(m * n), 0.0f);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) {
        const float x = ta ? a[static_cast<std::size_t>(p * m + i)] : a[static_cast<std::size_t>(i * k + p)];
        const float y = tb ? b[static_cast<std::size_t>(j * k + p)] : b[static_cast<std::size_t>(p * n + j)];
        s += static_cast<double>(x) * y;
      }
      c[static_cast<std::size_t>(i * n + j)] = static_cast<float>(s);
    }
  return c;
}

std::vector<float> random_values(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
  return v;
}

}  // namespace

TEST_CASE("gemm computes row-major products with every combination of transposes", "[cpu]") {
  CpuBackend b;
  const int m = 5, n = 3, k = 4;
  const auto a = random_values(static_cast<std::size_t>(m * k), 1);
  const auto bb = random_values(static_cast<std::size_t>(k * n), 2);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<float> c(static_cast<std::size_t>(m * n), 100.0f);
      b.gemm(ta ? Transpose::kYes : Transpose::kNo, tb ? Transpose::kYes : Transpose::kNo, m, n, k, 1.0f, a.data(),
             ta ? m : k, bb.data(), tb ? k : n, 0.0f, c.data(), n);
      const auto want = naive_gemm(ta, tb, m, n, k, a, bb);
      for (std::size_t i = 0; i < c.size(); ++i) CHECK(c[i] == Approx(want[i]).margin(1e-5));
    }
  }
  // beta = 1 accumulates.
  std::vector<float> c(static_cast<std::size_t>(m * n), 1.0f);
  b.gemm(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a.data(), k, bb.data(), n, 1.0f, c.data(), n);
  const auto want = naive_gemm(false, false, m, n, k, a, bb);
  for (std::size_t i = 0; i < c.size(); ++i) CHECK(c[i] == Approx(want[i] + 1.0f).margin(1e-5));
}

TEST_CASE("the shared functors run through for_each, sum and the matrix passes", "[cpu]") {
  CpuBackend b;
  std::vector<float> y = {-1.0f, 0.0f, 2.0f, NAN, 5.0f, -7.0f}, bias = {1.0f, -1.0f, 0.5f};
  for_each_element(b, 2, 3, BiasActivation<true>{y.data(), bias.data(), 3});  // 2 rows x 3 columns
  CHECK(y[0] == 0.0f);  // -1 + 1
  CHECK(y[1] == 0.0f);  // 0 - 1, rectified
  CHECK(y[2] == 2.5f);
  CHECK(std::isnan(y[3]));  // not hidden
  CHECK(y[4] == 4.0f);
  CHECK(y[5] == 0.0f);
  std::vector<float> z = {-1.0f, 0.0f, 2.0f};
  for_each_element(b, 1, 3, BiasActivation<false>{z.data(), bias.data(), 3});
  CHECK(z == std::vector<float>{0.0f, -1.0f, 2.5f});

  // 3 rows x 2 columns: dz = dy where y > 0; the bias gradient adds dz's column sums.
  std::vector<float> out = {0, 1, 2, -3, 4, 5}, dy = {5, 6, 7, 8, 9, 10}, dz(6, -1.0f), db = {1, 1};
  column_sums(b, 3, 2, ActivationGradient<true>{out.data(), dy.data(), dz.data(), 2}, db.data());
  CHECK(dz == std::vector<float>{0, 6, 7, 0, 9, 10});
  CHECK(db == std::vector<float>{1 + 0 + 7 + 9, 1 + 6 + 0 + 10});
  std::vector<float> db2 = {0, 0};
  column_sums(b, 3, 2, ActivationGradient<false>{out.data(), dy.data(), nullptr, 2}, db2.data());
  CHECK(db2 == std::vector<float>{5 + 7 + 9, 6 + 8 + 10});

  std::vector<float> pred = {1, 2, 3, 4}, target = {1, 0, 3, 2}, g(4);
  float loss = -1;
  MseLoss{}.forward_backward(b, LossCall{0, 2, 2}, pred.data(), target.data(), g.data(), &loss);  // 2 rows x 2
  CHECK(loss == Approx((0 + 4 + 0 + 4) / 4.0));
  CHECK(g == std::vector<float>{0, 1, 0, 1});

  std::vector<float> bad = {1, INFINITY, NAN, -2};
  float count = -1;
  b.sum(bad.size(), NonFinite{bad.data()}, &count);
  CHECK(count == 2);
  CHECK(is_finite(1.0f));
  CHECK_FALSE(is_finite(-INFINITY));

  // A sum past several blocks, of values whose sum is exact in any order.
  std::vector<float> many(1003);
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = static_cast<float>(i % 7);
  float total = -1;
  b.sum(many.size(), [&](std::size_t i) { return many[i]; }, &total);
  double want = 0;
  for (float v : many) want += v;
  CHECK(total == static_cast<float>(want));
  std::vector<float> filled(37, 1.0f);
  b.fill(filled.data(), filled.size(), 0.0f);
  CHECK(filled == std::vector<float>(37, 0.0f));
  b.fill(filled.data(), filled.size(), -2.5f);
  CHECK(filled == std::vector<float>(37, -2.5f));
}

TEST_CASE("the CPU backend's matrix passes compute what the per-element functors define, bit for bit", "[cpu]") {
  CpuBackend b;
  // Widths that leave a remainder after whole blocks, and one wider than a tile of column sums.
  for (const std::size_t cols : {std::size_t{41}, std::size_t{300}}) {
    const std::size_t rows = 37, n = rows * cols;
    const auto y0 = random_values(n, 3), dy = random_values(n, 4), bias = random_values(cols, 5);
    std::vector<float> y = y0, y_ref = y0;
    for_each_element(b, rows, cols, BiasActivation<true>{y.data(), bias.data(), cols});
    const detail::AtElement<BiasActivation<true>> each{{y_ref.data(), bias.data(), cols}, cols};
    for (std::size_t i = 0; i < n; ++i) each(i);
    CHECK(y == y_ref);

    std::vector<float> dz(n), dz_ref(n), db(cols, 0.5f), db_ref(cols, 0.5f);
    column_sums(b, rows, cols, ActivationGradient<true>{y.data(), dy.data(), dz.data(), cols}, db.data());
    const detail::ColumnSumOf<ActivationGradient<true>> column{{y.data(), dy.data(), dz_ref.data(), cols}, db_ref.data(),
                                                              rows};
    for (std::size_t c = 0; c < cols; ++c) column(c);
    CHECK(dz == dz_ref);
    CHECK(db == db_ref);
  }
}

TEST_CASE("the CPU backend runs the OpenBLAS kernels of this CPU", "[cpu]") {
  CpuBackend b;
  INFO("OpenBLAS kernels: " << cpu::blas_kernels() << "; best for this CPU: " << cpu::blas_kernels_for_this_cpu());
  CHECK(std::string(b.name()) == "cpu (OpenBLAS " + cpu::blas_kernels() + " kernels)");
  // Prescott is what OpenBLAS falls back on for a CPU model it does not know.
  if (!cpu::blas_kernels_for_this_cpu().empty() && std::getenv("OPENBLAS_CORETYPE") == nullptr &&
      gotoblas_dynamic_init != nullptr)
    CHECK(cpu::blas_kernels() != "Prescott");
}

// The built-in rules' functors are the ParameterUpdates (the functors whose pass a
// backend with a copy of the parameters, the CUDA backend's bf16 copy, extends to
// refresh that copy); no other functor may write parameters.
static_assert(ParameterUpdate<SgdUpdate> && ParameterUpdate<MomentumUpdate> && ParameterUpdate<AdamUpdate>);
static_assert(!ParameterUpdate<MseGradient<float>> && !ParameterUpdate<NonFinite> && !ParameterUpdate<BiasActivation<true>>);

TEST_CASE("the optimizer updates follow SGD, momentum and Adam", "[cpu]") {
  CpuBackend b;
  std::vector<float> w = {1.0f}, g = {4.0f};
  const ParameterView view{w.data(), g.data(), 1};
  const std::span<const ParameterView> params(&view, 1);
  using State = OptimizerState<CpuBackend, OptimizerConfig>;
  SECTION("sgd averages the gradient by the scale") {
    State opt(b, params, {OptimizerKind::kSgd, 0.5f});
    opt.step(b, 0.25f);
    CHECK(w[0] == Approx(1.0f - 0.5f * 1.0f));
  }
  SECTION("momentum accumulates a velocity") {
    State opt(b, params, {OptimizerKind::kSgd, 0.1f, 0.5f});
    opt.step(b, 1.0f);  // v = 4
    opt.step(b, 1.0f);  // v = 2 + 4 = 6
    CHECK(w[0] == Approx(1.0f - 0.1f * 4.0f - 0.1f * 6.0f));
  }
  SECTION("adam's first step moves by the learning rate") {
    State opt(b, params, {OptimizerKind::kAdam, 0.01f});
    opt.step(b, 1.0f);
    CHECK(w[0] == Approx(1.0f - 0.01f).epsilon(1e-5));
    CHECK(opt.steps() == 1);
  }
  SECTION("the rules themselves are optimizers, and the configuration applies exactly them") {
    static_assert(Optimizer<Sgd, CpuBackend> && Optimizer<Adam, CpuBackend> && Optimizer<OptimizerConfig, CpuBackend>);
    std::vector<float> w2 = w, g2 = g;
    const ParameterView view2{w2.data(), g2.data(), 1};
    OptimizerState<CpuBackend, Adam> rule(b, std::span<const ParameterView>(&view2, 1), Adam{0.01f});
    State config(b, params, {OptimizerKind::kAdam, 0.01f});
    for (int i = 0; i < 3; ++i) {
      rule.step(b, 0.5f);
      config.step(b, 0.5f);
    }
    CHECK(w2[0] == w[0]);
    CHECK(Sgd{0.1f, 0.5f}.state_buffers() == 1);
    CHECK(Sgd{0.1f}.state_buffers() == 0);
  }
  CHECK_THROWS_WITH(State(b, params, {OptimizerKind::kSgd, -1.0f}), Catch::Contains("learning rate must be positive"));
  CHECK_THROWS_WITH(State(b, params, {OptimizerKind::kSgd, 0.1f, 1.0f}), Catch::Contains("momentum must be in [0, 1)"));
  CHECK_THROWS_WITH(Adam({0.1f, 1.5f}).check(), Catch::Contains("Adam needs beta1, beta2 in [0, 1)"));
}

TEST_CASE("allocations are counted", "[cpu]") {
  CpuBackend b;
  CHECK(b.allocations() == 0);
  auto x = b.allocate(10);
  auto y = b.allocate(0);
  CHECK(b.allocations() == 2);
  CHECK(x.size() == 10);
  CHECK(y.data() == nullptr);
  auto z = std::move(x);
  CHECK(z.size() == 10);
  CHECK(x.data() == nullptr);
}

TEST_CASE("a side backend's time stamps count from the origin of the backend it was made from", "[cpu]") {
  CpuBackend b;
  CpuBackend side = b.side();
  b.reset_clock();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  side.reset_clock();  // as the session resets both, after the main one: it sets no origin of its own
  const std::size_t s = side.time_stamp();
  const std::size_t m = b.time_stamp();
  CHECK(side.elapsed_us(s) >= 2000.0);
  CHECK(b.elapsed_us(m) >= side.elapsed_us(s));
  // A later reset of the main backend moves the side's origin too, even when the
  // side is reset first: a side stamp is no further from the origin than a later
  // stamp of the main backend.
  side.reset_clock();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  b.reset_clock();
  const std::size_t s2 = side.time_stamp();
  const std::size_t m2 = b.time_stamp();
  CHECK(s2 == 0);  // the side's reset forgot its earlier stamps
  CHECK(side.elapsed_us(s2) >= 0.0);
  CHECK(side.elapsed_us(s2) <= b.elapsed_us(m2));
}

// The MSE of the MLP in double precision, for finite differences.
static double reference_loss(const MlpSpec& spec, const std::vector<std::vector<double>>& layers, const std::vector<double>& x,
                      const std::vector<float>& t, int rows) {
  std::vector<double> in = x, out;
  for (int l = 0; l < spec.layers(); ++l) {
    const int n_in = spec.widths[static_cast<std::size_t>(l)], n_out = spec.widths[static_cast<std::size_t>(l) + 1];
    const auto& w = layers[static_cast<std::size_t>(l)];
    out.assign(static_cast<std::size_t>(rows * n_out), 0.0);
    for (int r = 0; r < rows; ++r)
      for (int o = 0; o < n_out; ++o) {
        double acc = w[static_cast<std::size_t>(n_out * n_in + o)];
        for (int k = 0; k < n_in; ++k)
          acc += in[static_cast<std::size_t>(r * n_in + k)] * w[static_cast<std::size_t>(o * n_in + k)];
        if (l + 1 < spec.layers() && acc < 0) acc = 0;
        out[static_cast<std::size_t>(r * n_out + o)] = acc;
      }
    in.swap(out);
  }
  double loss = 0;
  for (std::size_t i = 0; i < in.size(); ++i) loss += (in[i] - t[i]) * (in[i] - t[i]);
  return loss / static_cast<double>(in.size());
}

TEST_CASE("the MLP chunk's gradients match finite differences", "[cpu]") {
  CpuBackend b;
  const MlpSpec spec{{3, 4, 5, 2}, 11};
  const HostModel init = init_mlp(spec);
  MlpChunk<CpuBackend> chunk(b, spec, {0, 3}, init);
  const int rows = 3;
  chunk.reserve(b, 1, rows);
  const auto x = random_values(static_cast<std::size_t>(rows * 3), 5);
  const auto t = random_values(static_cast<std::size_t>(rows * 2), 6);
  std::vector<float> y(static_cast<std::size_t>(rows * 2)), dy(y.size()), dx(x.size());
  const ParameterView p = chunk.parameters()[0];
  b.fill(p.gradient, p.count, 0.0f);
  float loss = 0;
  chunk.forward(b, {0, 0, rows}, x.data(), y.data());
  MseLoss{}.forward_backward(b, LossCall{0, rows, 2}, y.data(), t.data(), dy.data(), &loss);
  chunk.backward(b, {0, 0, rows}, dy.data(), dx.data());
  std::vector<std::vector<double>> w;
  for (const auto& layer : init.layers) w.emplace_back(layer.begin(), layer.end());
  const std::vector<double> xd(x.begin(), x.end());
  CHECK(loss == Approx(reference_loss(spec, w, xd, t, rows)).epsilon(1e-5));
  const double h = 1e-5;
  std::size_t i = 0;
  for (std::size_t l = 0; l < w.size(); ++l) {
    for (std::size_t k = 0; k < w[l].size(); ++k, ++i) {
      const double keep = w[l][k];
      w[l][k] = keep + h;
      const double up = reference_loss(spec, w, xd, t, rows);
      w[l][k] = keep - h;
      const double down = reference_loss(spec, w, xd, t, rows);
      w[l][k] = keep;
      INFO("parameter " << i);
      CHECK(p.gradient[i] == Approx((up - down) / (2 * h)).margin(1e-4));
    }
  }
  for (std::size_t j = 0; j < x.size(); ++j) {
    auto xs = xd;
    xs[j] += h;
    const double up = reference_loss(spec, w, xs, t, rows);
    xs[j] -= 2 * h;
    const double down = reference_loss(spec, w, xs, t, rows);
    INFO("input " << j);
    CHECK(dx[j] == Approx((up - down) / (2 * h)).margin(1e-4));
  }
}

TEST_CASE("initialisation is deterministic and depends only on the widths and the seed", "[cpu]") {
  const MlpSpec spec = MlpSpec::uniform(4, 3, 5, 2, 42);
  CHECK(init_mlp(spec) == init_mlp(spec));
  MlpSpec other = spec;
  other.seed = 43;
  CHECK_FALSE(init_mlp(spec) == init_mlp(other));
  CHECK(init_mlp(spec).layers[0].size() == 3 * 5 + 5);
  CHECK_THROWS_WITH(init_mlp(MlpSpec{{4, 0, 2}, 1}), Catch::Contains("width 1 is 0"));
  CHECK_THROWS_WITH(init_mlp(MlpSpec{{4}, 1}), Catch::Contains("at least 1 layer"));
  CHECK_THROWS_WITH(init_mlp(MlpSpec{{4, kMaxWidth + 1}, 1}), Catch::Contains("widths must be 1.."));
  CHECK_THROWS_WITH(init_mlp(MlpSpec::uniform(1024, 40000, 40000, 1)), Catch::Contains("more than the limit"));
}

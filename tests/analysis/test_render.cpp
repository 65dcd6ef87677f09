// The renderers: ASCII, Chrome trace JSON, SVG and the text summary, on simulated
// traces and on a hand-made "measured" one.
#include <catch2/catch.hpp>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "pipeweave/analysis/ascii.hpp"
#include "pipeweave/analysis/chrome_trace.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/analysis/summary.hpp"
#include "pipeweave/analysis/svg.hpp"
#include "pipeweave/schedule/generators.hpp"

using namespace pipeweave;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;
using Catch::Matchers::StartsWith;

namespace {

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t pos = s.find(what); pos != std::string::npos; pos = s.find(what, pos + what.size())) ++n;
  return n;
}

const Trace& seed_trace() {
  static const Trace t = simulate(make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8));
  return t;
}

// A trace as an executor would record it: microseconds, uneven times.
Trace measured() {
  Trace t;
  t.shape = {ScheduleKind::kOneFOneB, 2, 1, 1};
  t.source = TraceSource::kMeasured;
  t.time_unit = "ms";
  t.compute = {{{0, 0, fwd(0, 0), 0, 0.0, 1.5}, {0, 2, bwd(0, 0), 0, 6.25, 9.0}},
               {{1, 1, fwd(0, 0), 1, 1.75, 3.0}, {1, 2, bwd(0, 0), 1, 3.0, 6.0}}};
  t.comm = {{{0, 1, 1, 0, 1.5, 1.75}}, {{1, 0, 0, 1, 0.0, 1.75}}};
  t.peak_activations = {1, 1};
  return t;
}

}  // namespace

TEST_CASE("ASCII: a row per device, labels, idle dots, axis and legend", "[analysis]") {
  const std::string a = render_ascii(seed_trace());
  const auto l = lines(a);
  REQUIRE(l.size() == 8);  // title, axis numbers, ticks, 4 devices, legend
  CHECK_THAT(l[0], Contains("Interleaved 1F1B: P=4 devices, V=2 chunks, M=8 micro-batches; simulated, makespan 57"));
  CHECK_THAT(l[1], StartsWith("units     0         5         10"));
  // 2 columns per unit: device 3 waits 3 units for its first input.
  CHECK_THAT(l[6], StartsWith("device 3  ......0-1-2-3-0-0===1"));
  for (int d = 0; d < 4; ++d) CHECK(l[static_cast<std::size_t>(3 + d)].size() == 10 + 114);
  CHECK_THAT(l[7], Contains("0.5 units per column"));
  // Wide enough: full tokens.
  AsciiOptions wide;
  wide.columns_per_unit = 6;
  wide.width = 1000;
  CHECK_THAT(render_ascii(seed_trace(), wide), Contains("F0.0--F0.1--"));
  CHECK_THAT(render_ascii(seed_trace(), wide), Contains("B1.0========"));
  // Squeezed: one column spans several units.
  AsciiOptions narrow;
  narrow.width = 40;
  const auto squeezed = lines(render_ascii(seed_trace(), narrow));
  CHECK(squeezed[3].size() <= 40);
  CHECK_THAT(squeezed.back(), Contains("F forward, B backward"));
  AsciiOptions bare;
  bare.header = false;
  CHECK(lines(render_ascii(seed_trace(), bare)).size() == 6);
}

TEST_CASE("Chrome trace: metadata, one track per device, an event per action", "[analysis]") {
  const std::string j = render_chrome_trace(seed_trace());
  CHECK_THAT(j, StartsWith("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"schedule\":\"interleaved\""));
  CHECK_THAT(j, EndsWith("\n]}\n"));
  CHECK(count(j, "\"ph\":\"X\",\"pid\":0") == 128 + count(j, "\"cat\":\"p2p\""));
  CHECK(count(j, "\"cat\":\"forward\"") == 64);
  CHECK(count(j, "\"cat\":\"backward\"") == 64);
  CHECK(count(j, "\"name\":\"thread_name\"") == 4);
  CHECK_THAT(j, Contains("{\"name\":\"F c1 m3\",\"cat\":\"forward\",\"ph\":\"X\",\"pid\":0,\"tid\":0,"));
  CHECK_THAT(j, Contains("\"args\":{\"stage\":4,\"chunk\":1,\"micro_batch\":3,"));
  CHECK_THAT(j, Contains("\"bubble_ratio\":0.1875"));
  CHECK(count(j, "{") == count(j, "}"));
  CHECK(count(j, "[") == count(j, "]"));
  // Measured in milliseconds: written in microseconds.
  const std::string m = render_chrome_trace(measured(), "run \"7\"");
  CHECK_THAT(m, Contains("\"args\":{\"name\":\"run \\\"7\\\"\"}"));
  CHECK_THAT(m, Contains("\"name\":\"B c0 m0\",\"cat\":\"backward\",\"ph\":\"X\",\"pid\":0,\"tid\":0,\"ts\":6250,\"dur\":2750"));
  CHECK_THAT(m, Contains("\"name\":\"p2p 0 send 1 recv\",\"cat\":\"p2p\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":0,\"dur\":1750"));
  CHECK(microseconds_per_unit("units") == 1);
  CHECK(microseconds_per_unit("ns") == 1e-3);
}

TEST_CASE("SVG: a document with title, boxes, axis and legend", "[analysis]") {
  const std::string s = render_svg(seed_trace());
  CHECK_THAT(s, StartsWith("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1200\""));
  CHECK_THAT(s, EndsWith("</svg>\n"));
  CHECK_THAT(s, Contains(">Interleaved 1F1B: P=4 devices, V=2 chunks, M=8 micro-batches</text>"));
  CHECK_THAT(s, Contains("bubble ratio 0.1875 · peak activations 11, 9, 7, 5"));
  CHECK(count(s, "<g><title>") == 128);
  CHECK(count(s, "fill=\"url(#idle)\"") == 4 + 1);  // a row background each, and the legend swatch
  CHECK_THAT(s, Contains("chunk 1 forward, backward"));
  CHECK_THAT(s, Contains(">time (units)</text>"));
  CHECK_THAT(s, Contains(std::string("fill=\"") + std::string(chunk_colors(1).backward) + "\""));
  CHECK(count(s, "<text") == count(s, "</text>"));
  CHECK(count(s, "<g>") == count(s, "</g>"));
  SvgOptions o;
  o.title = "a <b> & c";
  o.subtitle = "measured";
  o.width = 50;  // raised to the least width
  const std::string m = render_svg(measured(), o);
  CHECK_THAT(m, Contains(">a &lt;b&gt; &amp; c</text>"));
  CHECK_THAT(m, Contains("width=\"400\""));
  CHECK_THAT(m, Contains(">time (ms)</text>"));
  CHECK(chunk_colors(9).forward == chunk_colors(1).forward);
}

TEST_CASE("summary: makespan, bubble ratio and a line per device", "[analysis]") {
  const std::string s = render_summary(seed_trace());
  CHECK_THAT(s, Contains("makespan: 57 units"));
  CHECK_THAT(s, Contains("bubble ratio: 0.1875"));
  CHECK(lines(s).size() == 5 + 4);
  CHECK_THAT(lines(s)[5], StartsWith("0       48           9 "));
  CHECK_THAT(render_summary(measured()), Contains("source: measured"));
  CHECK(format_number(0.1875) == "0.1875");
  CHECK(format_number(57) == "57");
  CHECK(format_number(-0.0) == "0");
  CHECK(format_decimal(2.0 / 3, 3) == "0.667");
  CHECK(format_decimal(66, 3) == "66");
  CHECK(describe_shape({ScheduleKind::kGPipe, 1, 1, 1}) == "GPipe: P=1 device, V=1 chunk, M=1 micro-batch");
}

TEST_CASE("split backwards are drawn and named as I and W, the v placement stated", "[analysis]") {
  const Trace t = simulate(make_schedule(ScheduleKind::kZeroBubbleV, 2, 2, 4));
  // ASCII: each kind its fill, full tokens when the boxes have room.
  AsciiOptions wide;
  wide.columns_per_unit = 8;
  wide.width = 400;
  const std::string a = render_ascii(t, wide);
  CHECK_THAT(a, StartsWith("ZB-V: P=2 devices, V=2 chunks in a v, M=4 micro-batches; simulated"));
  CHECK_THAT(a, Contains("I1.0~~~~") && Contains("W1.0++++") && Contains("F0.0----"));
  CHECK_THAT(a, Contains("I<c>.<m> and W<c>.<m> its input and weight halves") && Contains("'~' an I, '+' a W"));
  CHECK(count(render_ascii(seed_trace()), "'~'") == 0);  // no I, no legend for it
  // Chrome trace: categories of their own.
  const std::string c = render_chrome_trace(t);
  CHECK(count(c, "\"cat\":\"backward-input\"") == 16);
  CHECK(count(c, "\"cat\":\"backward-weight\"") == 16);
  CHECK_THAT(c, Contains("\"name\":\"W c1 m3\""));
  // SVG: W in its own shade, named in the hover text and the legend.
  const std::string s = render_svg(t);
  CHECK(count(s, "input gradient (I) of chunk") == 16);
  CHECK(count(s, "weight gradient (W) of chunk 1") == 8);
  CHECK_THAT(s, Contains("fill=\"" + std::string(chunk_colors(0).weight) + "\""));
  CHECK_THAT(s, Contains("chunk 1 forward, backward or I, W"));
  // Summary: peak memory beside the peak activations.
  const std::string sum = render_summary(t);
  CHECK_THAT(sum, Contains("peak activations  peak memory"));
  CHECK_THAT(sum, Contains("4                 5\n"));
  CHECK_THAT(render_summary(seed_trace()), !Contains("peak memory"));
}

TEST_CASE("an overlapped pair is drawn as two lanes of its device", "[analysis]") {
  const Program p{{ScheduleKind::kCustom, 1, 1, 2}, {{fwd(0, 0), fwd(0, 1).paired(), bwd(0, 0), bwd(0, 1)}}};
  CostModel c;
  c.overlap_efficiency = 1;
  const Trace t = simulate(p, c);  // F0.0 0-1, F0.1 1-2 beside B0.0 1-3, B0.1 3-5
  AsciiOptions wide;
  wide.columns_per_unit = 8;
  const std::vector<std::string> a = lines(render_ascii(t, wide));
  REQUIRE(a.size() == 6);
  CHECK(a[3] == "device 0  F0.0----F0.1----........B0.1============");
  CHECK(a[4] == "device 0'         B0.0============");
  CHECK_THAT(a[5], Contains("device d' holds the backward half of each of d's overlapped pairs"));
  CHECK_THAT(render_ascii(seed_trace()), !Contains("device 0'"));
  // Chrome trace: the backward halves on a second track of the device.
  const std::string ct = render_chrome_trace(t);
  CHECK_THAT(ct, Contains("\"tid\":1,\"args\":{\"name\":\"device 0 (overlapped backward)\"}"));
  CHECK(count(ct, "\"ph\":\"X\",\"pid\":0,\"tid\":1,") == 1);
  CHECK(count(ct, "\"ph\":\"X\",\"pid\":0,\"tid\":0,") == 3);
  // SVG: the pair's boxes take half a row each, named as overlapped.
  const std::string s = render_svg(t);
  CHECK(count(s, ", overlapped, ") == 2);
}

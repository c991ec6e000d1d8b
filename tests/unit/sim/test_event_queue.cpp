// EventQueue ordering (time, then priority, then scheduling order), now(), determinism, a large
// random stress run; ClockDomain conversions.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "sim/event_queue.h"
#include "sim/time.h"

namespace {

using nsim::sim::ClockDomain;
using nsim::sim::EventQueue;
using nsim::sim::Ps;

std::vector<int> drain(EventQueue<int>& q) {
  std::vector<int> out;
  while (!q.empty()) out.push_back(q.pop().payload);
  return out;
}

}  // namespace

TEST_CASE("EventQueue pops in time order", "[sim][event_queue]") {
  EventQueue<int> q;
  q.schedule(300, 0, 3);
  q.schedule(100, 0, 1);
  q.schedule(500, 0, 5);
  q.schedule(200, 0, 2);
  q.schedule(400, 0, 4);
  REQUIRE(q.size() == 5);
  CHECK(q.top().time == 100);
  CHECK(q.top().payload == 1);
  CHECK(drain(q) == std::vector<int>{1, 2, 3, 4, 5});
  CHECK(q.empty());
  CHECK(q.size() == 0);
}

TEST_CASE("EventQueue breaks time ties by priority, lower first", "[sim][event_queue]") {
  EventQueue<int> q;
  q.schedule(100, 5, 50);
  q.schedule(100, -2, -20);
  q.schedule(100, 0, 0);
  q.schedule(100, 3, 30);
  q.schedule(50, 99, 990);  // an earlier time beats any priority
  CHECK(drain(q) == std::vector<int>{990, -20, 0, 30, 50});
}

TEST_CASE("EventQueue keeps scheduling order for equal (time, priority)", "[sim][event_queue]") {
  EventQueue<int> q;
  for (int i = 0; i < 20; ++i) q.schedule(7, 1, i);
  q.schedule(7, 0, 100);  // lower priority value runs first even though scheduled last
  std::vector<int> expect{100};
  for (int i = 0; i < 20; ++i) expect.push_back(i);
  CHECK(drain(q) == expect);
}

TEST_CASE("EventQueue sequence numbers increase in scheduling order", "[sim][event_queue]") {
  EventQueue<int> q;
  q.schedule(10, 0, 0);
  q.schedule(5, 0, 1);
  q.schedule(10, 0, 2);
  auto a = q.pop();
  auto b = q.pop();
  auto c = q.pop();
  CHECK(a.payload == 1);
  CHECK(a.seq == 1);
  CHECK(b.payload == 0);
  CHECK(b.seq == 0);
  CHECK(c.payload == 2);
  CHECK(c.seq == 2);
}

TEST_CASE("EventQueue now() advances to the time of the popped event", "[sim][event_queue]") {
  EventQueue<int> q;
  CHECK(q.now() == 0);
  q.schedule(1000, 0, 1);
  q.schedule(250, 0, 2);
  CHECK(q.now() == 0);  // scheduling does not move time
  auto e = q.pop();
  CHECK(e.time == 250);
  CHECK(q.now() == 250);
  q.schedule(600, 0, 3);
  CHECK(q.pop().time == 600);
  CHECK(q.now() == 600);
  CHECK(q.pop().time == 1000);
  CHECK(q.now() == 1000);
  CHECK(q.empty());
  CHECK(q.now() == 1000);  // stays at the last event
}

TEST_CASE("EventQueue reserve() keeps behaviour", "[sim][event_queue]") {
  EventQueue<int> q;
  q.reserve(1024);
  CHECK(q.empty());
  q.schedule(2, 0, 2);
  q.schedule(1, 0, 1);
  q.schedule(2, -1, 3);
  CHECK(drain(q) == std::vector<int>{1, 3, 2});
}

TEST_CASE("EventQueue reserve() on a non-empty queue keeps the scheduled events",
          "[sim][event_queue]") {
  // Like std::vector::reserve, pre-sizing must not drop what is already scheduled.
  EventQueue<int> q;
  q.schedule(30, 0, 3);
  q.schedule(10, 0, 1);
  q.reserve(1024);
  CHECK(q.size() == 2);
  q.schedule(20, 0, 2);
  CHECK(drain(q) == std::vector<int>{1, 2, 3});
}

TEST_CASE("EventQueue is deterministic: same input, same output", "[sim][event_queue]") {
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<Ps> tdist(0, 50);  // small range: many ties
  std::uniform_int_distribution<int32_t> pdist(-2, 2);
  EventQueue<int> a, b;
  for (int i = 0; i < 5000; ++i) {
    const Ps t = tdist(rng);
    const int32_t p = pdist(rng);
    a.schedule(t, p, i);
    b.schedule(t, p, i);
  }
  std::vector<std::tuple<Ps, int32_t, uint64_t, int>> ra, rb;
  while (!a.empty()) {
    auto e = a.pop();
    ra.emplace_back(e.time, e.priority, e.seq, e.payload);
  }
  while (!b.empty()) {
    auto e = b.pop();
    rb.emplace_back(e.time, e.priority, e.seq, e.payload);
  }
  REQUIRE(ra.size() == 5000);
  CHECK(ra == rb);
  // And the order is the total order (time, priority, seq).
  for (size_t i = 1; i < ra.size(); ++i) {
    const auto& x = ra[i - 1];
    const auto& y = ra[i];
    REQUIRE(std::make_tuple(std::get<0>(x), std::get<1>(x), std::get<2>(x)) <
            std::make_tuple(std::get<0>(y), std::get<1>(y), std::get<2>(y)));
    // payload == seq here because payload i was scheduled i-th
    REQUIRE(static_cast<uint64_t>(std::get<3>(y)) == std::get<2>(y));
  }
}

TEST_CASE("EventQueue: 100k random events pop in non-decreasing time", "[sim][event_queue]") {
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<Ps> tdist(0, 1'000'000'000);
  std::uniform_int_distribution<int32_t> pdist(-100, 100);
  EventQueue<uint32_t> q;
  constexpr uint32_t kN = 100'000;
  for (uint32_t i = 0; i < kN; ++i) q.schedule(tdist(rng), pdist(rng), i);
  REQUIRE(q.size() == kN);
  Ps last = -1;
  int32_t last_prio = 0;
  uint32_t popped = 0;
  bool ordered = true;
  std::vector<bool> seen(kN, false);
  while (!q.empty()) {
    auto e = q.pop();
    if (e.time < last || (e.time == last && e.priority < last_prio)) ordered = false;
    if (q.now() != e.time) ordered = false;
    last = e.time;
    last_prio = e.priority;
    seen[e.payload] = true;
    ++popped;
  }
  CHECK(ordered);
  CHECK(popped == kN);
  bool all = true;
  for (bool s : seen) all = all && s;
  CHECK(all);
}

TEST_CASE("ClockDomain converts cycles to picoseconds", "[sim][time]") {
  const ClockDomain c(2.8);
  CHECK(c.ghz() == Approx(2.8));
  CHECK(c.period_ps() == Approx(1000.0 / 2.8));
  CHECK(c.cycles_to_ps(512) == 182857);  // 512 / 2.8 GHz = 182857.142... ps
  CHECK(c.cycles_to_ps(0) == 0);
  CHECK(c.cycles_to_ps(1) == 357);       // 357.142857 -> 357
  CHECK(c.cycles_to_ps(2) == 714);       // 714.2857 -> 714
  CHECK(c.cycles_to_ps(7) == 2500);      // exactly 2500
  CHECK(c.cycles_to_ps(1.5) == 536);     // 535.714 -> 536 (rounds to nearest, not down)

  const ClockDomain one;  // default 1 GHz
  CHECK(one.ghz() == Approx(1.0));
  CHECK(one.cycles_to_ps(3) == 3000);
  CHECK(one.ps_to_cycles(4500) == Approx(4.5));

  const ClockDomain c14(1.4);
  CHECK(c14.cycles_to_ps(64) == 45714);  // 45714.2857
  CHECK(nsim::sim::ps_to_ns(1500) == Approx(1.5));
  CHECK(nsim::sim::kPsPerNs == 1000);
}

TEST_CASE("ClockDomain ps_to_cycles round trip", "[sim][time]") {
  const ClockDomain c(2.8);
  CHECK(c.ps_to_cycles(182857) == Approx(512.0).epsilon(1e-5));
  CHECK(c.ps_to_cycles(2500) == Approx(7.0));
  // cycles -> ps -> cycles stays within half a picosecond of the start.
  for (int cyc : {1, 3, 17, 512, 4096, 1'000'000}) {
    const Ps t = c.cycles_to_ps(cyc);
    CHECK(std::abs(c.ps_to_cycles(t) - cyc) * c.period_ps() <= 0.5 + 1e-9);
  }
  // ps -> cycles -> ps is the identity.
  for (Ps t : {Ps{0}, Ps{1}, Ps{357}, Ps{999}, Ps{182857}, Ps{123'456'789}}) CHECK(c.cycles_to_ps(c.ps_to_cycles(t)) == t);
}

TEST_CASE("round_nonneg rounds as std::llround does", "[sim][time]") {
  using nsim::sim::round_nonneg;
  // Halves and their neighbours, where adding 0.5 and truncating goes wrong (0.49999999999999994 + 0.5
  // rounds to 1.0 in double arithmetic), huge values, and what falls back to llround.
  for (double x : {0.0, 0.5, 1.5, 2.5, 0.49999999999999994, std::nextafter(0.5, 1.0), 4503599627370495.5,
                   4503599627370497.0, 9007199254740993.0, 0x1p62 - 1024.0, 0x1p62, 1e300, -0.5, -2.5, -1e-300})
    CHECK(round_nonneg(x) == std::llround(x));
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> frac(0.0, 1.0);
  for (int i = 0; i < 100000; ++i) {
    const double x = std::ldexp(frac(rng), static_cast<int>(rng() % 64)) + static_cast<double>(rng() % 4) * 0.5;
    REQUIRE(round_nonneg(x) == std::llround(x));
  }
}

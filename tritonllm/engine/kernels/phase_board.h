// A forward pass as one parallel region of phases that no thread waits out for a preempted partner.
//
// With a parallel region per matrix, a thread that the OS preempts (on 2 cores: for the server's other processes,
// ~10 times a token) holds every other thread at the region's end until it runs again, so another process's
// 150 us costs the forward 150 us on every core. Here every thread runs the same sequence of phases (a matrix, the
// attention, ...), each phase cut into units: a thread takes the units of its own part of the phase front to
// back, then the other parts' free units from their backs, and then waits for the phase's units to be done. A unit
// that stays taken past a grace period is computed again by the waiting thread: its owner is off the CPU.
//
// That is safe because a unit writes only its final values, computed from inputs that the next phases do not
// overwrite (each phase writes buffers of its own, reused only after every thread has left the phases that used
// them: wait_for_all): a preempted owner that comes back finishes its unit and writes the very bits the other
// thread wrote, whatever the others read meanwhile. A unit must not update a value in place (x += ...) nor write an
// intermediate value where another thread may read it. Every thread of the team must hold a seat of its own.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

namespace phase_board {

constexpr int64_t kMaxUnits = 1024;

// The units' states of every phase of one forward, and how many of each phase are done.
class Board {
 public:
  enum : uint8_t { kFree = 0, kTaken = 1, kDone = 2 };

  // Every state kFree, every count 0 (value-initialized: zeroed in one pass).
  Board(int64_t phases, int64_t threads)
      : states_(new std::atomic<uint8_t>[phases * kMaxUnits]()),
        done_(new std::atomic<int64_t>[phases]()),
        progress_(new std::atomic<int64_t>[threads]()) {
    static_assert(kFree == 0);
  }
  std::atomic<uint8_t>* states(int64_t phase) const { return states_.get() + phase * kMaxUnits; }
  std::atomic<int64_t>& done(int64_t phase) const { return done_[phase]; }
  // How many phases thread t has left behind.
  std::atomic<int64_t>& progress(int64_t t) const { return progress_[t]; }
  // Whether a thread holds a unit for a test (Seat::hold_every): one at a time, so that two never wait on each other.
  mutable std::atomic<bool> holding{false};

 private:
  std::unique_ptr<std::atomic<uint8_t>[]> states_;
  std::unique_ptr<std::atomic<int64_t>[]> done_;
  std::unique_ptr<std::atomic<int64_t>[]> progress_;
};

// A thread's place at the board: which phase it has come to.
struct Seat {
  const Board* board;
  int64_t thread, threads;
  int64_t phase = 0;
  int64_t recomputed = 0;  // units this thread computed again after their owner overran the grace period
  // This thread's units so far in the forward and the time they took: the grace period's yardstick in a phase
  // where this thread has computed no unit yet.
  int64_t computed = 0;
  std::chrono::steady_clock::duration busy{0};
  // Fault injection for tests: with more than one thread, whichever thread takes unit u of a phase with
  // u % hold_every == 0 holds it until another thread has done it, then computes it too, as a preempted owner does
  // (unless another thread holds one at the time). 0: never.
  int64_t hold_every = 0;
};

// The least time a waiting thread gives a taken unit before computing it itself, and the multiple of the mean time
// of its own units in the phase (where it computed none yet: in the forward so far). A unit is a few to a few
// tens of microseconds; a preemption, a hundred and more.
constexpr std::chrono::nanoseconds kLeastGrace{5000};
constexpr int64_t kGraceUnits = 3;

// Runs phase `seat.phase` of `units` (<= kMaxUnits) units on this thread's seat: compute(u) for the units this
// thread takes, until every unit of the phase is done by some thread. Every thread calls it for the same phases
// in the same order.
template <typename F>
void run(Seat& seat, int64_t units, const F& compute) {
  using Clock = std::chrono::steady_clock;
  const int64_t phase = seat.phase++;
  std::atomic<uint8_t>* states = seat.board->states(phase);
  std::atomic<int64_t>& done = seat.board->done(phase);
  int64_t computed = 0;  // in this phase
  Clock::duration busy{0};
  auto finish = [&](int64_t u) {
    const Clock::time_point began = Clock::now();
    compute(u);
    const Clock::duration took = Clock::now() - began;
    busy += took;
    seat.busy += took;
    ++computed;
    ++seat.computed;
    if (states[u].exchange(Board::kDone, std::memory_order_acq_rel) != Board::kDone)
      done.fetch_add(1, std::memory_order_acq_rel);
  };
  auto take = [&](int64_t u) {
    uint8_t expected = Board::kFree;
    if (!states[u].compare_exchange_strong(expected, Board::kTaken, std::memory_order_acq_rel)) return false;
    bool free_to_hold = false;
    if (seat.hold_every > 0 && seat.threads > 1 && u % seat.hold_every == 0 &&
        seat.board->holding.compare_exchange_strong(free_to_hold, true)) {
      while (states[u].load(std::memory_order_acquire) != Board::kDone)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      seat.board->holding.store(false);
    }
    return true;
  };
  const int64_t threads = seat.threads;
  auto part_begin = [&](int64_t t) { return units * t / threads; };
  for (int64_t u = part_begin(seat.thread); u < part_begin(seat.thread + 1); ++u)
    if (take(u)) finish(u);
  for (int64_t other = 1; other < threads; ++other) {
    const int64_t t = (seat.thread + other) % threads;
    for (int64_t u = part_begin(t + 1) - 1; u >= part_begin(t); --u)
      if (take(u)) finish(u);
  }
  int64_t seen = done.load(std::memory_order_acquire);
  Clock::time_point since = Clock::now();
  while (seen < units) {
    _mm_pause();
    const int64_t now_done = done.load(std::memory_order_acquire);
    const Clock::time_point now = Clock::now();
    if (now_done != seen) {
      seen = now_done;
      since = now;
      continue;
    }
    const Clock::duration mean =
        computed ? busy / computed : seat.computed ? seat.busy / seat.computed : Clock::duration{};
    const Clock::duration grace = std::max<Clock::duration>(kLeastGrace, mean * kGraceUnits);
    if (now - since < grace) continue;
    for (int64_t u = 0; u < units; ++u)
      if (states[u].load(std::memory_order_acquire) == Board::kTaken) {
        ++seat.recomputed;
        finish(u);
        break;
      }
    seen = done.load(std::memory_order_acquire);
    since = Clock::now();
  }
  seat.board->progress(seat.thread).store(seat.phase, std::memory_order_release);
}

// Waits until every thread has left the first `phases` phases behind, a preempted one included: before buffers
// that those phases used are written again (a thread that comes back mid-unit still reads and writes them).
inline void wait_for_all(const Seat& seat, int64_t phases) {
  for (int64_t t = 0; t < seat.threads; ++t)
    while (seat.board->progress(t).load(std::memory_order_acquire) < phases) _mm_pause();
}

}  // namespace phase_board

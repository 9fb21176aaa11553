"""The torch thread count of each round on CPU: fewer threads while another process contends for the cores.

A multi-threaded torch product waits at its end for its slowest thread, and on cores that another process keeps
busy the OS deschedules one of them for whole time slices. Measured on a 2-core AMD EPYC (fp32 SmolLM2-135M, torch
2.13.0+cpu, 120 cached tokens): quiet, a one-token step took 34 ms on 2 threads and on 1, an 8-row forward 56 and
62 ms; beside a CPU-bound process on 2 threads, the one-token step took 110 ms on 2 threads and 40 ms on 1 (and an
8-row forward 4 s against 85 ms, session 18). So on a busy machine the thread count moves the speed far more than
any tree shape, and a tree, whose rounds hold more products, loses most.

`ThreadChooser` keeps the rounds on the user's count (`torch.get_num_threads()` when `generate` starts) unless a
smaller count's plain steps are measured clearly faster (by `switch_margin`), and probes the other counts now and
then with a few plain steps, the planner not told, so that a load that comes or goes is followed:

- **A probe** of count `t` is `probe_steps` plain steps at the current count, then as many at `t`, both counts'
  estimates started afresh: the two are timed back to back under the same load. (While trees win, the current count
  runs no plain step of its own, and its estimate would be a step timed long ago, under another load.)
- **What a probe loses.** Its plain steps cost their seconds, where the rounds at the current count would have
  produced as many tokens at the planner's expected rate (trees included). Probes of `t` come once the seconds
  decoded since `t` last ran, times `probe_budget`, cover that loss (each step charged at least `min_loss_share` of
  its own seconds, so that equal counts are not probed every round): probing loses at most `probe_budget` of the
  time. A count never timed is probed after `first_probe_rounds` rounds.
- **Switching.** The count chosen is the largest whose plain-step estimate is within `switch_margin` of the fastest
  one's: equal counts keep the user's, a contended one gives way to one more than 20% faster. Between probes the
  current count's estimate also follows the plain steps the planner chooses. When the rounds run with another count
  than the planner's costs were timed with, the decoder makes it forget them (`RoundPlanner.forget_costs`), keeping
  what it learned of acceptance.
- **A disturbance does not stick.** A probe's estimates leave out each count's slowest step (`RecentSeconds`, three
  steps), and a switch to fewer threads waits for a second probe of the same two counts, run at once, that agrees;
  going back up needs no confirmation. Measured on a 2-core Intel Xeon (session 26, fp32 SmolLM2-135M, 120 cached
  tokens, quiet): a plain step took 51 ms on 2 threads and 77 ms on 1, an 8-row forward 91 and 157 ms, so a round
  on the wrong count costs a tree far more than a probe. In session 25's benchmark one probe taken during a slow
  spell, two steps each, timed 2 threads so slow that the rounds stayed on 1 thread for some 200 rounds (about
  30 s) with no probe back: the stale estimate also priced the probe back as too costly to run soon.

Changing the count is process-wide (`torch.set_num_threads`): the decoder restores the caller's count when the
call ends, and `generate(..., tree_adapt_threads=False)` keeps it fixed throughout. Pure Python: tested with
injected timings.
"""

import math
from typing import NamedTuple

from .cost_model import RecentSeconds


class ThreadChoice(NamedTuple):
    """The thread count of the next round, and whether the round is a probe (a plain step the planner is not told
    of)."""

    threads: int
    probe: bool


def candidate_thread_counts(threads: int) -> tuple[int, ...]:
    """The counts tried with `threads` set by the caller, largest first: it, half of it, and one."""
    return tuple(sorted({threads, max(1, threads // 2), 1}, reverse=True))


class ThreadChooser:
    """Chooses the torch thread count of each round from the plain steps timed at each (see the module docstring).

    Args:
        counts (`tuple[int]`): the counts to choose from; the largest is the caller's, where the rounds start.
        probe_steps (`int`): plain steps per count in a probe; both counts' estimates restart from them (from three
            on, each leaves its slowest step out).
        probe_budget (`float`): the share of the time probes may lose.
        min_loss_share (`float`): the least loss a probe is charged, as a share of its own seconds.
        first_probe_rounds (`int`): rounds at the current count before a count never timed is probed.
        switch_margin (`float`): a smaller count is chosen only when its plain steps are faster than a larger one's
            by more than this share.
        window (`int`): plain steps each count's estimate looks back on.
    """

    def __init__(
        self,
        counts: tuple[int, ...],
        probe_steps: int = 3,
        probe_budget: float = 0.01,
        min_loss_share: float = 0.1,
        first_probe_rounds: int = 4,
        switch_margin: float = 0.2,
        window: int = 8,
    ):
        if not counts or min(counts) < 1:
            raise ValueError(f"ThreadChooser: `counts` must hold thread counts >= 1, got {counts!r}.")
        self.counts = tuple(sorted(set(counts), reverse=True))
        self.probe_steps, self.probe_budget, self.min_loss_share = probe_steps, probe_budget, min_loss_share
        self.first_probe_rounds, self.switch_margin, self.window = first_probe_rounds, switch_margin, window
        self.current = self.counts[0]
        self.steps = {count: RecentSeconds(window) for count in self.counts}
        self.since = {count: 0.0 for count in self.counts}  # seconds decoded since the count last ran a round
        self.rounds_here = 0  # rounds at the current count since it became current
        self.switches = 0
        self._probe: list[ThreadChoice] = []  # the rest of the probe under way
        self._confirming: int | None = None  # the smaller count a confirming probe is under way for

    def next_round(self, expected_rate: float = math.nan) -> ThreadChoice:
        """The count of the next round. `expected_rate` is the planner's tokens per second at the current count
        (`RoundPlanner.expected_rate`; `nan` when unknown: a plain step's rate is assumed)."""
        if self._probe:
            return self._probe.pop(0)
        preferred = self._preferred()
        if preferred < self.current and self._confirming != preferred:
            self._confirming = preferred  # fewer threads only once a second probe, now, agrees
            return self._start_probe(preferred)
        self._confirming = None
        if preferred != self.current:
            self.current, self.rounds_here = preferred, 0
            self.switches += 1
        probed = self._due_probe(expected_rate)
        if probed is None:
            return ThreadChoice(self.current, False)
        return self._start_probe(probed)

    def _start_probe(self, probed: int) -> ThreadChoice:
        """Restart the current count's and `probed`'s estimates and return the first of the probe's plain steps."""
        for count in (self.current, probed):
            self.steps[count] = RecentSeconds(self.window)
        self._probe = [ThreadChoice(count, True) for count in (self.current, probed) for _ in range(self.probe_steps)]
        return self._probe.pop(0)

    def record(self, choice: ThreadChoice, plain: bool, seconds: float) -> None:
        """A round chosen as `choice` took `seconds`; `plain`: it was a one-token step without a draft."""
        for count in self.counts:
            self.since[count] = 0.0 if count == choice.threads else self.since[count] + seconds
        if plain:
            self.steps[choice.threads].add(seconds)
        if not choice.probe:
            self.rounds_here += 1

    def estimate(self, count: int) -> float | None:
        """Seconds of a plain step at `count` threads, `None` until timed."""
        return self.steps[count].value

    def _preferred(self) -> int:
        """The largest count whose plain steps are within `switch_margin` of the fastest count's (the current one
        until it is timed)."""
        timed = {count: self.estimate(count) for count in self.counts if self.estimate(count) is not None}
        if self.current not in timed:
            return self.current
        fastest = min(timed.values())
        return max(count for count, seconds in timed.items() if seconds * (1 - self.switch_margin) <= fastest)

    def _due_probe(self, expected_rate: float) -> int | None:
        """The count to probe now, if any: a count never timed after `first_probe_rounds` rounds here, else one whose
        expected loss the seconds decoded since it last ran, times `probe_budget`, cover."""
        here = self.estimate(self.current)
        if here is None or self.rounds_here < self.first_probe_rounds:
            return None
        per_token = 1.0 / expected_rate if expected_rate > 0 and math.isfinite(expected_rate) else here
        for count in self.counts:
            if count == self.current:
                continue
            there = self.estimate(count)
            if there is None:
                return count
            steps = (here, there)  # the current count's plain steps, then the probed count's
            loss = self.probe_steps * sum(max(step - per_token, self.min_loss_share * step) for step in steps)
            if self.since[count] * self.probe_budget >= loss:
                return count
        return None


__all__ = ["ThreadChoice", "ThreadChooser", "candidate_thread_counts"]

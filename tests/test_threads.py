"""The thread-count chooser, with injected timings: it stays on the caller's count on a quiet machine, gives way to
fewer threads when they are clearly faster, comes back when the load is gone, and probes within its budget."""

import pytest

from eagle3_hf.generation.threads import ThreadChooser, candidate_thread_counts


def simulate(chooser, plain_seconds, rounds, tokens_per_second, trees=False, slow_probe_steps=frozenset()):
    """Run `rounds` rounds: a probe is a plain step at its count (`plain_seconds[count]`), any other round produces
    tokens at `tokens_per_second[count]` in one plain step's time (a plain step, or a tree when `trees`: the planner
    then runs no plain step the chooser could time, but the first on a count). The probe steps on the caller's
    count numbered in `slow_probe_steps` (0-based, over the run) take 250 ms: a disturbance. Returns the seconds
    spent in probes, all seconds, and the count of each round."""
    probe_seconds, total, counts, probe_steps_on_callers = 0.0, 0.0, [], 0
    for _ in range(rounds):
        choice = chooser.next_round(tokens_per_second[chooser.current])
        seconds = plain_seconds[choice.threads]
        if choice.probe and choice.threads == chooser.counts[0]:
            seconds = 0.250 if probe_steps_on_callers in slow_probe_steps else seconds
            probe_steps_on_callers += 1
        # a planner whose costs are new times a plain step first, whatever wins then
        plain = choice.probe or not trees or chooser.estimate(choice.threads) is None
        chooser.record(choice, plain=plain, seconds=seconds)
        probe_seconds += seconds if choice.probe else 0.0
        total += seconds
        counts.append(choice.threads)
    return probe_seconds, total, counts


def test_candidate_counts_are_the_callers_half_of_it_and_one():
    assert candidate_thread_counts(2) == (2, 1)
    assert candidate_thread_counts(16) == (16, 8, 1)
    assert candidate_thread_counts(1) == (1,)
    assert ThreadChooser((1, 2)).counts == (2, 1) and ThreadChooser((1, 2)).current == 2
    with pytest.raises(ValueError, match="counts"):
        ThreadChooser((0, 2))


def test_one_thread_means_no_choice_and_no_probe():
    chooser = ThreadChooser((1,))
    assert chooser.counts == (1,)
    _, _, counts = simulate(chooser, {1: 0.03}, 500, {1: 1 / 0.03})
    assert set(counts) == {1} and chooser.switches == 0


def test_a_quiet_machine_keeps_the_callers_count_and_probes_within_the_budget():
    """1 and 2 threads cost the same for a plain step (the 2-core EPYC, SmolLM2: 34 ms both) while trees make 1.3
    plain steps' tokens per step's time: the caller's 2 threads stay, the probes of 1 thread lose about 1%."""
    chooser = ThreadChooser((2, 1))
    plain = {2: 0.034, 1: 0.034}
    probe_seconds, total, counts = simulate(chooser, plain, 6000, {2: 1.3 / 0.034, 1: 1.3 / 0.034})
    assert chooser.switches == 0 and chooser.current == 2
    assert counts.count(1) >= 10  # it keeps looking: a load that comes is seen
    lost = probe_seconds * (1 - 1 / 1.3)  # what the probes' plain steps lost against the trees
    assert lost < 0.015 * total


def test_a_contended_machine_gives_way_to_one_thread_and_comes_back_when_the_load_goes():
    """Beside a CPU-bound process, 2 threads cost 110 ms a step and 1 thread 40 ms (measured, session 19): after the
    first probe the rounds run on 1 thread; the 2-thread probes then lose about 1% of the time; once the load is gone
    (both 34 ms), the next probe brings the caller's count back."""
    chooser = ThreadChooser((2, 1))
    busy = {2: 0.110, 1: 0.040}
    _, _, counts = simulate(chooser, busy, 19, {2: 1 / 0.110, 1: 1 / 0.040})
    probe = [2] * 3 + [1] * 3  # 3 steps on 2 threads, then 3 on 1
    assert counts == [2] * 4 + probe + probe + [1] * 3  # 4 rounds, the probe and the one confirming it, then 1 thread
    assert chooser.current == 1 and chooser.switches == 1
    probe_seconds, total, counts = simulate(chooser, busy, 2000, {2: 1 / 0.110, 1: 1 / 0.040})
    assert chooser.current == 1 and counts.count(2) >= 2
    assert probe_seconds * (1 - 0.040 / 0.110) < 0.015 * total

    quiet = {2: 0.034, 1: 0.034}
    _, total, counts = simulate(chooser, quiet, 2000, {2: 1 / 0.034, 1: 1 / 0.034})
    back = counts.index(2)
    assert chooser.current == 2 and chooser.switches == 2
    assert back * 0.034 < chooser.probe_steps * 0.110 / chooser.probe_budget  # within one probe interval


def test_a_count_that_is_only_a_little_faster_does_not_take_over():
    """Within `switch_margin` the caller's count is kept: noise between equal counts never flips it."""
    chooser = ThreadChooser((2, 1))
    simulate(chooser, {2: 0.036, 1: 0.032}, 2000, {2: 1 / 0.036, 1: 1 / 0.032})
    assert chooser.current == 2 and chooser.switches == 0
    simulate(chooser, {2: 0.050, 1: 0.032}, 300, {2: 1 / 0.050, 1: 1 / 0.032})
    assert chooser.current == 1  # 36% faster: it does


def test_a_probe_times_both_counts_afresh_back_to_back():
    """While trees win the current count runs no plain step of its own: a probe times it again beside the other
    count, so a load that came meanwhile is seen (2 threads timed at 34 ms when quiet, now 60 ms; 1 thread 40 ms)."""
    chooser = ThreadChooser((2, 1))
    simulate(chooser, {2: 0.034, 1: 0.034}, 100, {2: 1.3 / 0.034, 1: 1.3 / 0.034}, trees=True)
    assert chooser.current == 2 and chooser.estimate(2) == pytest.approx(0.034)
    loaded = {2: 0.060, 1: 0.040}
    _, _, counts = simulate(chooser, loaded, 400, {2: 1.3 / 0.060, 1: 1.3 / 0.040}, trees=True)
    assert chooser.current == 1 and chooser.switches == 1
    assert chooser.estimate(1) == pytest.approx(0.040) and chooser.estimate(2) == pytest.approx(0.060)
    # the first probe after the load came already found it and the one right after confirmed it, then 1 thread
    first = counts.index(1)
    assert counts[first - 3 : first + 10] == [2, 2, 2, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1]


QUIET_INTEL = {2: 0.051, 1: 0.077}  # the quiet 2-core Intel Xeon (session 26, fp32 SmolLM2): a plain step's seconds


def run_quiet_intel(chooser, rounds, slow_probe_steps):
    """`simulate` on the quiet Intel Xeon, trees making 1.3 plain steps' tokens per step's time. Returns the counts."""
    rates = {count: 1.3 / seconds for count, seconds in QUIET_INTEL.items()}
    return simulate(chooser, QUIET_INTEL, rounds, rates, trees=True, slow_probe_steps=slow_probe_steps)[2]


def test_one_slow_step_in_a_probe_is_left_out():
    """A hiccup in one of a probe's three 2-thread steps (another process waking, a page fault) moves nothing."""
    chooser = ThreadChooser((2, 1))
    counts = run_quiet_intel(chooser, 3000, slow_probe_steps={0, 4, 8, 12})
    assert chooser.switches == 0 and chooser.current == 2
    assert counts.count(1) >= 10  # it went on probing


def test_a_probe_taken_in_a_slow_spell_does_not_stick():
    """Session 25's failure: the first probe's 2-thread steps all fell in a slow spell (250 ms instead of 51), which
    alone would have sent the rounds to 1 thread; the confirming probe right after runs quiet, and 2 threads stay."""
    chooser = ThreadChooser((2, 1))
    counts = run_quiet_intel(chooser, 3000, slow_probe_steps={0, 1, 2})
    assert chooser.switches == 0 and chooser.current == 2
    first = counts.index(1)  # the first probe, its confirmation, then the trees on 2 threads again
    assert counts[first - 3 : first + 10] == [2, 2, 2, 1, 1, 1, 2, 2, 2, 1, 1, 1, 2]

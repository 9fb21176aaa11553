"""A cost model measured online, inside `generate`: before each round, the shape that yields the most tokens per
second, or no draft at all.

Speculation pays only when `tokens per round / seconds per round` beats `1 / seconds per plain step`, and every
term of that moves with the head, the target, the vocabulary, the machine, its load and the context. So
`eagle3_generate` measures them from its own rounds and asks `RoundPlanner.choose()` before each one:

- **Costs.** Seconds of a plain one-token step; of verifying `n` nodes (per node count seen, interpolated
  linearly in `n` between and beyond them, a plain step being the one-node case); of the draft's root expansion
  and of each further draft level; of the draft update and of the rest of a round. Each is the mean of its last
  `cost_window` observations without the slowest: robust to one slow step, unbiased for the throughput (a low
  quantile would favour the tree, whose rounds a busy machine slows more unevenly than plain steps), and following
  a machine that gets busier or a context that gets longer.
- **Acceptance.** The conditional acceptance rate at each draft position, `alpha[j] = P(position j accepted | positions
  < j accepted)`, per tree shape, from the rounds themselves: a round that accepted `a` draft tokens reached positions
  `1 .. a + 1` and passed `1 .. a` (a position past the tree's depth passes only through a grafted prompt-lookup
  chain). The expected draft tokens of a depth `d` tree are `sum_j prod_{i <= j} alpha[i]`, over its `d` positions and
  the lookup positions past them that rounds reached. A shape with few observations leans on the nearest measured shape
  (a prior worth `prior_weight` rounds), and a position beyond that on the one before it, which is optimistic for
  depths not tried yet; every `explore_every` tree rounds a neighbour of the best shape is tried, as long as its
  estimate is within `explore_margin` of the best, or rests on fewer than `explore_min_rounds` rounds (so that one
  unlucky first round cannot condemn a depth; a neighbour measured clearly worse in enough rounds costs nothing more).
- **Probing.** While plain steps win, a tree round is still tried after `probe_interval` plain steps. After each
  probe the interval is what the probe budget allows: a probe is expected to lose `seconds * (1 - r)` against plain
  steps, `r` being the best tree's estimated tokens per second over plain steps', so probing every
  `seconds * (1 - r) / (probe_budget * plain seconds)` plain steps loses at most `probe_budget` of the time. It grows
  at most twofold per probe (one unlucky round after a few is weak evidence) up to `max_probe_interval`. A head that
  does not pay (`r` near 0.5) is thus probed every 100 steps or so, while near break-even, where the estimate is
  uncertain and a wrong choice costs a few percent either way, probes come every few steps and keep it right.
  On a busy machine a tree can cost many plain steps (2 contended cores, session 17: an 8-node verification of
  SmolLM2 took 16 one-token steps' time, as every multi-threaded matrix product waited for a descheduled thread),
  and probes every few steps, then doubling, lost a third of the time. So no probe may lose more than
  `probe_loss_ceiling` of the plain steps before it (the interval jumps there at once, from the first plain step
  after the start shape on), and the longest interval grows with the plain steps a probe loses.
  The deferred draft update that plain steps leave (their tokens are encoded into the head, in one forward, when
  the next tree is drafted) is the cost of switching back: its seconds are added to every tree's estimate while a
  plain streak runs, and to nothing else. One more plain step adds next to nothing to that batched forward, so
  charging its mean per token to plain steps (session 10) made them look 5-8% dearer whenever streaks were short,
  and kept the planner in trees that lose at T=1.

- **The head's confidence.** Right after a tree round the head has already read the accepted tokens, and its
  distribution for the next root's first draft token is at hand for free (`TreeDrafter.root_confidence`: the
  largest probability, at the sampling temperature). EAGLE-2 ranks nodes by such confidences because they predict
  acceptance; measured here (the shipped SmolLM2 head, MT-bench, 8/3 tree + 6 lookup), a round rooted at a
  confidence under 0.2 produced 1.51 tokens at T=1 and 1.87 at T=0, one over 0.9 produced 2.80 and 2.83. So
  acceptance is also counted per confidence bucket (`CONFIDENCE_EDGES`), all shapes pooled, and a shape's rates are
  scaled by how a bucket's differ from all rounds'. A round whose confidence is known takes the shape, or the plain
  step, that pays for that bucket: trees where the head is sure, plain steps where it is not. After a plain step
  the head has not read the newest token (its update waits for the next tree), so the confidence is unknown: the
  estimate is then the buckets' mixture in the proportions met by earlier rounds chosen without it ("blind" rounds).
- **What trees really gained.** Estimates near break-even err towards trees: a tree is chosen when its estimate is
  high, which is when the noise made it high, and a bucket's estimate borrows from rounds of other stretches. So the
  planner also keeps the account of what the trees it chose really did: per tree round, the plain-step seconds its
  tokens would have cost minus its own seconds (the deferred draft update before it included), summed with a decay
  per round, against all rounds' seconds. While that account stands below `-probe_budget` of the time, trees are
  treated as losing whatever the estimates say: plain steps, and probes whose interval is budgeted by the loss a
  tree really had. Measured on the shipped SmolLM2 head at T=1 (session 12), the trees the estimates chose produced
  1.8-1.9 tokens in rounds that cost 2.0-2.4 plain steps, 2-4% of the time lost; a tree or two that pay put the
  account back above the line.

Only what happened before a round decides its shape, never anything of the round itself, so decoding stays exact:
greedy output bit-identical to plain `generate`, and the target's distribution when sampling.

Pure Python, no tensors: the planner is tested with injected timings and acceptances.
"""

import bisect
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TreeShape:
    """One candidate of a round: a tree of `total_tokens` nodes and `depth` levels (`depth=0`: a plain step)."""

    total_tokens: int
    depth: int

    @property
    def is_plain(self) -> bool:
        return self.depth == 0


PLAIN_STEP = TreeShape(total_tokens=1, depth=0)

# Bucket edges of the head's root confidence (its largest next-token probability). Five buckets: enough to tell the
# rounds that lose from the ones that pay (measured tau per bucket on MT-bench T=1: 1.51 / 1.80 / 1.88 / 2.25 / 2.65),
# few enough that each fills within a few answers.
CONFIDENCE_EDGES = (0.2, 0.4, 0.6, 0.8)


def confidence_bucket(confidence: float) -> int:
    """The index in `[0, len(CONFIDENCE_EDGES)]` of the bucket holding `confidence`."""
    return bisect.bisect_right(CONFIDENCE_EDGES, confidence)


class RecentSeconds:
    """A robust running cost: the mean of the last `window` observations without the slowest one (`None` until the
    first).

    One-off work (a kernel's first call, a page fault, another process waking up) makes a single step slow, and the
    slowest observation is left out; the rest are averaged, since tokens per second follow the mean cost. A machine
    that stays busier moves the whole window, and so the estimate, within `window / 2` observations.
    """

    def __init__(self, window: int):
        self.window, self.recent = window, []

    def add(self, value: float) -> None:
        self.recent = [*self.recent[-(self.window - 1) :], value]

    @property
    def value(self) -> float | None:
        if not self.recent:
            return None
        kept = sorted(self.recent)[:-1] if len(self.recent) > 2 else self.recent
        return sum(kept) / len(kept)


@dataclass
class _Acceptance:
    """Decayed counts of reaching and passing each draft position (1-based), for one tree shape."""

    reached: list[float] = field(default_factory=list)
    passed: list[float] = field(default_factory=list)

    def add(self, accepted: int, depth: int, decay: float) -> None:
        # positions 1 .. accepted + 1 were reached and the last failed: a rejected node, or none (the tree ended, so
        # a position past its depth passes only through a prompt-lookup chain grafted that deep)
        reachable = accepted + 1
        while len(self.reached) < max(depth, reachable):
            self.reached.append(0.0)
            self.passed.append(0.0)
        for j in range(len(self.reached)):
            self.reached[j] *= decay
            self.passed[j] *= decay
            if j < reachable:
                self.reached[j] += 1.0
                self.passed[j] += float(j < accepted)

    def rates(self, depth: int, prior: float | list[float], prior_weight: float) -> list[float]:
        """`alpha[1..depth]`: each position's rate, shrunk towards its prior: `prior[j]` where given (another
        shape's rates), else the previous position's rate (the first towards `prior` itself when a number)."""
        priors = prior if isinstance(prior, list) else [prior]
        rates, previous = [], priors[0]
        for j in range(depth):
            reached = self.reached[j] if j < len(self.reached) else 0.0
            passed = self.passed[j] if j < len(self.passed) else 0.0
            anchor = priors[j] if j < len(priors) else previous
            rate = (passed + prior_weight * anchor) / (reached + prior_weight)
            rates.append(rate)
            previous = rate
        return rates

    def extension_rates(self, depth: int, previous: float, prior_weight: float) -> list[float]:
        """The rates of the positions past `depth` that rounds reached (accepting `depth` tokens, then more through a
        grafted prompt-lookup chain), each shrunk towards the one before it (the first towards `previous`). A tree
        without a chain that deep fails there, so rounds that accept it all drive these rates down."""
        rates = []
        for reached, passed in zip(self.reached[depth:], self.passed[depth:]):
            previous = (passed + prior_weight * previous) / (reached + prior_weight)
            rates.append(previous)
        return rates

    @property
    def weight(self) -> float:
        return self.reached[0] if self.reached else 0.0


class _Histogram:
    """Decayed counts of the confidence buckets met, each count multiplied by `decay` per observation."""

    def __init__(self):
        self.counts = [0.0] * (len(CONFIDENCE_EDGES) + 1)

    def add(self, bucket: int, decay: float) -> None:
        self.counts = [count * decay for count in self.counts]
        self.counts[bucket] += 1.0

    @property
    def total(self) -> float:
        return sum(self.counts)


@dataclass
class PlannerConfig:
    """Knobs of `RoundPlanner`; the defaults are what `eagle3_generate` uses.

    Args:
        decay (`float`): weight of the past in the acceptance counts, per round.
        cost_window (`int`): observations each cost estimate looks back on.
        prior_acceptance (`float`): the rate assumed at draft position 1 before any round ran.
        prior_weight (`float`): how many rounds the prior of a position is worth.
        probe_interval (`int`): plain steps before the first probe round once plain steps win, and the shortest
            interval between probes.
        max_probe_interval (`int`): the longest interval between probes that lose one plain step or less. A probe
            with a head that does not pay costs about one plain step more than it brings (a verification of a few
            nodes plus the deferred draft update), so this bounds what such a head costs to under 1% of the time,
            while a useful passage is still found within two short answers. A probe that loses `s > 1` plain steps
            may wait `s` times longer.
        probe_budget (`float`): the share of the time that probes may lose against plain steps, by the current
            estimates; it sets the interval between probes (see the module docstring).
        probe_loss_ceiling (`float`): the most one probe may lose against the plain steps before it. A probe that
            costs many plain steps (on a busy machine: 8 nodes verified in 16 plain steps' time) sets the interval to
            at least `loss / (probe_loss_ceiling * plain seconds)` at once, past the twofold growth, and the first
            plain step after the start shape's round does so too.
        explore_every (`int`): every this many tree rounds, try the best shape one level deeper (or shallower, in
            turn).
        explore_margin (`float`): explore a neighbour only while its estimated rate is at least `1 - explore_margin`
            times the best's, or while it was measured in fewer than `explore_min_rounds` rounds.
        explore_min_rounds (`float`): the (decayed) rounds a neighbour is measured in before its estimate may stop
            its exploration, so that one unlucky first round cannot condemn a depth for good; 0 turns the floor
            off. What it costs is bounded: a shape's weight grows only with its own rounds (1, 1.95, 2.85, 3.71 at
            `decay` 0.95), so the floor forces at most 4 rounds of each depth in a planner's life, which spans
            every `generate` call of a head and target. Without it the shipped head fell into 8-node depth-1 trees
            on held-out ShareGPT at T=0 in two of three runs (0.958 and 0.976 of the fixed depth-3 tree, sessions
            17 and 18); with it, 1.003 and 1.012. Paired against the planner without it (`scripts/measure_planner.py
            --measure gating`, 24 prompts, session 18): 0.998 (0.978-1.016) on ShareGPT at T=0 where neither fell
            into the trap, 0.978 (0.941-1.016) on HumanEval and 1.004 (0.978-1.034) on MT-bench at T=1, within
            run-to-run noise.
        use_confidence (`bool`): choose by the head's root confidence when the loop knows it (`choose(confidence=)`);
            `False` chooses every round blind, as the planner did before it knew confidences (for comparisons).
        gain_decay (`float`): weight of the past, per round (plain or tree), in the account of what trees really
            gained (see the module docstring); 0.99 looks back about a hundred rounds.
        gain_min_trees (`float`): the (decayed) number of trees that account must hold before it can overrule the
            estimates: one or two unlucky first trees are no evidence.
        use_gain_account (`bool`): treat trees as losing while that account says they lose; `False` trusts the
            estimates alone, as the planner did before (for comparisons).
    """

    decay: float = 0.95
    cost_window: int = 8
    prior_acceptance: float = 0.5
    prior_weight: float = 2.0
    probe_interval: int = 4
    max_probe_interval: int = 128
    probe_budget: float = 0.01
    probe_loss_ceiling: float = 0.1
    explore_every: int = 8
    explore_margin: float = 0.1
    explore_min_rounds: float = 3.0
    use_confidence: bool = True
    gain_decay: float = 0.99
    gain_min_trees: float = 4.0
    use_gain_account: bool = True


class RoundPlanner:
    """Chooses each round's `TreeShape` from measured costs and acceptance (see the module docstring).

    Args:
        node_counts (`list[int]`): the node counts a tree may have (on CPU: the ones whose weights are packed).
        max_depth (`int`): the deepest tree to consider.
        top_k (`int`): children per expanded node: a tree of depth `d` holds at most `1 + k + (d - 1) k**2` nodes.
        start (`TreeShape`): the shape of the first tree round (the head's tuned `generation_config`).
        config ([`PlannerConfig`], *optional*).
    """

    def __init__(
        self,
        node_counts: list[int],
        max_depth: int,
        top_k: int,
        start: TreeShape,
        config: PlannerConfig | None = None,
    ):
        self.config = config or PlannerConfig()
        self.top_k = top_k
        self.node_counts = sorted(set(node_counts) | {start.total_tokens})
        self.max_depth = max(max_depth, start.depth)
        self.start = start
        self.acceptance: dict[TreeShape, _Acceptance] = {}
        # counts of the rounds whose confidence is known, all shapes pooled: all of them and per confidence bucket;
        # and the buckets met by all tree rounds and by blind ones
        self.pooled_acceptance = _Acceptance()
        self.bucket_acceptance: dict[int, _Acceptance] = {}
        self.buckets_met, self.blind_buckets_met = _Histogram(), _Histogram()
        self.tree_rounds = 0
        self.forget_costs()

    def forget_costs(self) -> None:
        """Start every cost afresh, and the probing and the account of what trees gained with them, keeping what was
        learned of acceptance: the rounds now run where the costs measured so far no longer hold (with another torch
        thread count, `threads.ThreadChooser`). Until a tree round is timed again the start shape comes first."""
        window = self.config.cost_window
        self.plain_seconds = RecentSeconds(window)
        self.verify_seconds: dict[int, RecentSeconds] = {}
        self.root_seconds, self.level_seconds = RecentSeconds(window), RecentSeconds(window)
        self.update_seconds, self.other_seconds = RecentSeconds(window), RecentSeconds(window)
        self.switch_seconds = RecentSeconds(window)  # the draft update a tree after plain steps does first
        self.plain_streak, self.probe_interval = 0, self.config.probe_interval
        # the account of what trees really gained (decayed per round): plain-step seconds their tokens would have
        # cost minus their own seconds, how many trees that is, and all rounds' seconds; the deferred draft update
        # recorded before the next tree is part of that tree's seconds
        self.tree_gain, self.trees_counted, self.all_seconds = 0.0, 0.0, 0.0
        self._switch_spent = 0.0
        # `_best_tree()` until the next tree round: a streak of plain steps asks for it every step, and it is the
        # planner's main cost (0.2 ms of a 55 ms SmolLM2 step on a 2-core CPU)
        # by (whether a plain streak runs (a switch is due), the confidence bucket or None)
        self._best: dict[tuple[bool, int | None], tuple[TreeShape, float]] = {}

    # ------------------------------------------------------------------------------------------- observations
    def record_plain(self, seconds: float) -> None:
        """A plain step took `seconds` (its draft update excluded)."""
        self.plain_seconds.add(seconds)
        self.plain_streak += 1
        self._account(seconds)
        if self.plain_streak == 1 and self.tree_rounds:
            # the first plain step after trees prices what the next probe would lose (after the start shape's
            # round, the first chance to): a probe that costs many plain steps waits as many times longer
            self.probe_interval = max(self.probe_interval, self._probe_floor(self._probe_steps_lost()))

    def record_deferred_update(self, seconds: float, tokens: int) -> None:
        """Encoding the `tokens` of earlier plain steps into the draft took `seconds` (before a tree round)."""
        if tokens:
            self.switch_seconds.add(seconds)
            self._switch_spent = seconds
            self._best = {}

    def record_tree(
        self,
        shape: TreeShape,
        accepted: int,
        tree_depth: int,
        verify_seconds: float,
        draft_seconds: float,
        update_seconds: float,
        other_seconds: float,
        confidence: float | None = None,
        blind: bool = True,
    ) -> None:
        """A tree round of `shape` accepted `accepted` draft tokens (the bonus token not counted) of a verified
        tree `tree_depth` deep (a grafted prompt-lookup chain can make it deeper than `shape.depth`). `confidence` is
        the head's root confidence the tree was drafted from; `blind` whether the round was chosen without it."""
        self._best = {}
        self.verify_seconds.setdefault(shape.total_tokens, RecentSeconds(self.config.cost_window)).add(verify_seconds)
        # Level 1 comes from the logits the last draft update left (no head forward); each further level is one
        # head forward over the frontier.
        levels = max(shape.depth - 1, 0)
        if levels:
            self.level_seconds.add(max(draft_seconds - (self.root_seconds.value or 0.0), 0.0) / levels)
        else:
            self.root_seconds.add(draft_seconds)
        self.update_seconds.add(update_seconds)
        self.other_seconds.add(other_seconds)
        self.acceptance.setdefault(shape, _Acceptance()).add(accepted, tree_depth, self.config.decay)
        if confidence is not None:
            bucket = confidence_bucket(confidence)
            self.pooled_acceptance.add(accepted, tree_depth, self.config.decay)
            self.bucket_acceptance.setdefault(bucket, _Acceptance()).add(accepted, tree_depth, self.config.decay)
            self.buckets_met.add(bucket, self.config.decay)
            if blind:
                self.blind_buckets_met.add(bucket, self.config.decay)
        spent = self._switch_spent + verify_seconds + draft_seconds + update_seconds + other_seconds
        self._switch_spent = 0.0
        plain = self.plain_seconds.value
        self._account(spent, None if plain is None else (1 + accepted) * plain - spent)
        if self.plain_streak:  # a probe
            self.probe_interval = self._budgeted_probe_interval()
        self.plain_streak = 0
        self.tree_rounds += 1

    def _account(self, seconds: float, tree_gain: float | None = None) -> None:
        """Age the account of what trees gained by one round of `seconds`, a tree that gained `tree_gain` seconds
        over plain steps (`None`: a plain step, or a tree before any plain step priced the alternative)."""
        decay = self.config.gain_decay
        self.all_seconds = decay * self.all_seconds + seconds
        self.tree_gain *= decay
        self.trees_counted *= decay
        if tree_gain is not None:
            self.tree_gain += tree_gain
            self.trees_counted += 1.0

    @property
    def trees_losing(self) -> bool:
        """Whether the trees chosen lately lost more than `probe_budget` of the time against plain steps."""
        if not self.config.use_gain_account or self.trees_counted < self.config.gain_min_trees:
            return False
        return self.tree_gain < -self.config.probe_budget * self.all_seconds

    def _probe_steps_lost(self) -> float:
        """Plain steps' worth of time a probe of the best tree is expected to lose against plain steps (0 when trees
        win or nothing is known): the estimate's, or while trees are losing what a tree really lost on average, if
        more."""
        best, best_rate = self._best_tree()
        plain_rate = self.plain_rate()
        if math.isnan(best_rate) or math.isnan(plain_rate):
            return 0.0
        loss = self.round_seconds(best) * (1 - best_rate / plain_rate) if best_rate < plain_rate else 0.0
        if self.trees_losing:
            loss = max(loss, -self.tree_gain / self.trees_counted)
        return max(loss, 0.0) / self.plain_seconds.value

    def _probe_floor(self, steps_lost: float) -> int:
        """The fewest plain steps before a probe that loses `steps_lost` plain steps keeping its loss within
        `probe_loss_ceiling` of theirs."""
        return max(self.config.probe_interval, math.ceil(steps_lost / self.config.probe_loss_ceiling))

    def _budgeted_probe_interval(self) -> int:
        """Plain steps until the next probe: as many as make the expected loss of a probe against plain steps
        `probe_budget` of the time, at most twice the last interval and `max_probe_interval` times the plain steps
        a probe loses (once, if fewer); never fewer than `_probe_floor`."""
        config = self.config
        steps_lost = self._probe_steps_lost()
        if steps_lost <= 0:
            return config.probe_interval
        budgeted = math.ceil(steps_lost / config.probe_budget)
        longest = math.ceil(config.max_probe_interval * max(1.0, steps_lost))
        return max(self._probe_floor(steps_lost), min(budgeted, 2 * self.probe_interval, longest))

    # ------------------------------------------------------------------------------------------------ estimates
    def expected_draft_tokens(self, shape: TreeShape, bucket: int | None = None) -> float:
        """`sum_j prod_{i <= j} alpha[i]` over the `shape.depth` positions of `shape`'s own rates, which lean on the
        nearest shape measured (a tree of other depth spreads its nodes otherwise, so its rates are only a prior),
        then over the positions past its depth that prompt-lookup chains reached (from the nearest measured shape's
        counts while `shape` has none). Leaving those out undervalued every tree against plain steps wherever lookup
        pays (code: a third of HumanEval's accepted tokens lie past depth 3).

        With a confidence `bucket`, the rates are scaled by what sets that bucket apart (`_bucket_rates`). Without
        one (a round chosen blind), the buckets' estimates mixed in the proportions blind rounds met (shrunk
        towards those all rounds met), once any round's confidence was recorded."""
        if shape.is_plain:
            return 0.0
        rates = self._rates(shape)
        met, blind = self.buckets_met, self.blind_buckets_met
        if bucket is None and met.total == 0:
            return _reach_sum(rates)
        weight = self.config.prior_weight
        # all rounds' rates with known confidence, all shapes pooled (leaning on `shape`'s own): what every bucket's
        # rates are compared with
        pooled = self.pooled_acceptance.rates(len(rates), rates, weight)
        if bucket is not None:
            return _reach_sum(self._bucket_rates(bucket, rates, pooled))
        mixture = [blind.counts[b] + weight * met.counts[b] / met.total for b in range(len(met.counts))]
        return sum(w * _reach_sum(self._bucket_rates(b, rates, pooled)) for b, w in enumerate(mixture) if w) / sum(
            mixture
        )

    def _rates(self, shape: TreeShape) -> list[float]:
        """`shape`'s acceptance rates over all its rounds: its depth's positions, then the lookup positions reached."""
        # the prior is the nearest other shape measured: one unlucky round of a shape tried once (the first, or an
        # exploration) must not condemn it for good while its neighbour is known to accept
        reference = self._nearest_measured(shape, other=True) or self._nearest_measured(shape)
        prior = self.config.prior_acceptance
        if reference is not None and reference != shape:
            prior = self.acceptance[reference].rates(reference.depth, prior, self.config.prior_weight)
        counts = self.acceptance.get(shape, _Acceptance())
        rates = counts.rates(shape.depth, prior, self.config.prior_weight)
        source = counts if counts.weight > 0 or reference is None else self.acceptance[reference]
        return rates + source.extension_rates(shape.depth, rates[-1], self.config.prior_weight)

    def _bucket_rates(self, bucket: int, overall: list[float], pooled: list[float]) -> list[float]:
        """A shape's rates `overall` for a root confidence in `bucket`: each position's rate times the factor by which
        that bucket's rate differs from `pooled`, all rounds' at that position, all shapes pooled (so that a bucket's
        evidence serves every shape at once, and a shape explored once is not judged by one round per bucket)."""
        counts = self.bucket_acceptance.get(bucket)
        if counts is None or counts.weight == 0:
            return overall
        in_bucket = counts.rates(len(overall), pooled, self.config.prior_weight)
        return [
            min(1.0, rate * (own / all_ if all_ > 0 else 1.0)) for rate, own, all_ in zip(overall, in_bucket, pooled)
        ]

    def _nearest_measured(self, shape: TreeShape, other: bool = False) -> TreeShape | None:
        """The measured shape closest to `shape` (another one when `other`): the same node count and the nearest
        depth first, else the most nodes at or below `shape`'s (more nodes never accept less), else any."""
        measured = [
            candidate
            for candidate, counts in self.acceptance.items()
            if counts.weight > 0 and not (other and candidate == shape)
        ]
        if not measured:
            return None
        same = [candidate for candidate in measured if candidate.total_tokens == shape.total_tokens]
        below = [candidate for candidate in measured if candidate.total_tokens <= shape.total_tokens]
        pool = same or below or measured
        return min(pool, key=lambda near: (abs(near.depth - shape.depth), -near.total_tokens, near.depth))

    def round_seconds(self, shape: TreeShape) -> float | None:
        """Estimated seconds of a round of `shape`, `None` while nothing is known yet."""
        plain = self.plain_seconds.value
        if shape.is_plain:
            return plain
        verify = self._verify_estimate(shape.total_tokens)
        if verify is None:
            return None
        levels = max(shape.depth - 1, 0)
        if levels and self.level_seconds.value is None:
            return None  # no deeper tree measured yet
        draft = (self.root_seconds.value or 0.0) + (self.level_seconds.value or 0.0) * levels
        switch = (self.switch_seconds.value or 0.0) if self.plain_streak else 0.0  # the deferred draft update first
        return switch + verify + draft + (self.update_seconds.value or 0.0) + (self.other_seconds.value or 0.0)

    def _verify_estimate(self, total_tokens: int) -> float | None:
        """Measured for this node count, else the line through the two nearest measured counts, a plain step
        counting as a one-node verification (it is one: the root alone), else `None`."""
        measured = {n: mean.value for n, mean in self.verify_seconds.items() if mean.value is not None}
        if self.plain_seconds.value is not None:
            measured.setdefault(1, self.plain_seconds.value)
        if total_tokens in measured:
            return measured[total_tokens]
        if len(measured) >= 2:
            (n0, t0), (n1, t1) = sorted(measured.items(), key=lambda item: abs(item[0] - total_tokens))[:2]
            slope = max((t1 - t0) / (n1 - n0), 0.0)
            return max(t0 + slope * (total_tokens - n0), 0.0)
        return next(iter(measured.values()), None)

    def rate(self, shape: TreeShape, bucket: int | None = None) -> float:
        """Expected tokens per second of a round of `shape` (`nan` while its cost is unknown), for a root confidence
        in `bucket` (`None`: not known)."""
        seconds = self.round_seconds(shape)
        if seconds is None or seconds <= 0:
            return math.nan
        return (1.0 + self.expected_draft_tokens(shape, bucket)) / seconds

    def plain_rate(self) -> float:
        return self.rate(PLAIN_STEP)

    def expected_rate(self) -> float:
        """Tokens per second of the rounds `choose()` picks blind, by the current estimates: the better of a plain
        step and the best tree (the plain step's while trees are losing); `nan` while nothing is timed."""
        plain = self.plain_rate()
        tree = math.nan if self.trees_losing else self._best_tree()[1]
        rates = [rate for rate in (plain, tree) if not math.isnan(rate)]
        return max(rates) if rates else math.nan

    def _fits(self, shape: TreeShape) -> bool:
        """Whether a tree `shape.depth` deep, `top_k` wide, can hold `shape.total_tokens` nodes."""
        k = self.top_k
        return 1 <= shape.depth <= self.max_depth and shape.total_tokens <= 1 + k + (shape.depth - 1) * k * k

    def _candidates(self) -> list[TreeShape]:
        shapes = (TreeShape(n, d) for n in self.node_counts for d in range(1, self.max_depth + 1))
        return [shape for shape in shapes if self._fits(shape)]

    def _best_tree(self, bucket: int | None = None) -> tuple[TreeShape, float]:
        """The tree shape with the highest estimated rate for a root confidence in `bucket` (`None`: unknown), and
        that rate (with the switch cost while a plain streak runs). Computed once per tree round, streak and bucket:
        tree estimates change only with tree rounds (a plain step moves only the one-node end of the verification
        line, from which node counts never measured are interpolated, so their estimates wait for the next tree
        round)."""
        key = (self.plain_streak > 0, bucket)
        if key not in self._best:
            rated = [(shape, self.rate(shape, bucket)) for shape in self._candidates()]
            rated = [(shape, rate) for shape, rate in rated if not math.isnan(rate)]
            best = max(rated, key=lambda item: (item[1], -item[0].total_tokens, -item[0].depth)) if rated else None
            self._best[key] = best or (self.start, math.nan)
        return self._best[key]

    # ------------------------------------------------------------------------------------------------- decision
    def choose(self, confidence: float | None = None) -> TreeShape:
        """The next round's shape: `PLAIN_STEP` or a tree. `confidence` is the head's root confidence when it is
        known before the round (`None`: the round is chosen blind, and a losing tree is still probed now and then).
        While the trees chosen lately lost (`trees_losing`), every round is a plain step but those probes."""
        if not self.verify_seconds:
            return self.start  # the head's tuned shape first, then one plain step to price the alternative
        if self.plain_seconds.value is None:
            return PLAIN_STEP
        told = confidence is not None and self.config.use_confidence
        bucket = confidence_bucket(confidence) if told else None
        best, best_rate = self._best_tree(bucket)
        if self.trees_losing or not best_rate > self.plain_rate():
            if bucket is None and self.plain_streak >= self.probe_interval:
                return best
            return PLAIN_STEP
        if self.tree_rounds and self.tree_rounds % self.config.explore_every == 0:
            # now and then a neighbour of the best shape, one level deeper and one shallower in turn
            step = 1 if (self.tree_rounds // self.config.explore_every) % 2 else -1
            neighbour = TreeShape(best.total_tokens, best.depth + step)
            if self._fits(neighbour):
                rate = self.rate(neighbour, bucket)
                measured = self.acceptance.get(neighbour, _Acceptance()).weight
                if (
                    measured < self.config.explore_min_rounds
                    or not rate < (1 - self.config.explore_margin) * best_rate
                ):
                    return neighbour
        return best


def _reach_sum(rates: list[float]) -> float:
    """Expected draft tokens from per-position conditional rates: `sum_j prod_{i <= j} rates[i]`."""
    expected, reach = 0.0, 1.0
    for rate in rates:
        reach *= rate
        expected += reach
    return expected


__all__ = [
    "CONFIDENCE_EDGES",
    "PLAIN_STEP",
    "PlannerConfig",
    "RecentSeconds",
    "RoundPlanner",
    "TreeShape",
    "confidence_bucket",
]

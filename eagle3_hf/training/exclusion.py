"""Keeping the benchmark's evaluation prompts out of training data: which records overlap them.

The benchmark (`eagle3_hf.bench.prompts`) measures on MT-bench (both turns of its 80 questions), HumanEval (164
prompts) and the held-out ShareGPT prompts (`load_sharegpt_heldout`: first turns of the records from
`SHAREGPT_HELDOUT_START` on, less those seen before). A head trained on one of those prompts, or on its target's
answer to it, would report an acceptance length the benchmark cannot trust. See docs/training-data.md.

**The rule.** Texts are compared as *normalised words*: Unicode NFKC, case-folded, split into runs of letters and
digits. Punctuation, case and whitespace do not count, nor do underscores (a form's `____` blanks are no words). A
user turn of a training record overlaps an evaluation prompt (one turn of it) when

1. its words equal the prompt's words, or
2. it contains a run of `n` (13) consecutive words of the prompt, as GPT-3's contamination analysis did
   (Brown et al. 2020, appendix C), or, for a prompt of `min_words` (8) to `n - 1` words, the whole prompt.

Prompts shorter than `min_words` words ("Hello!") only match by rule 1: inside longer turns they are everyday
phrases, not leaked prompts. System and assistant turns are not checked. Rule 2 also fires on template text that a
prompt shares with training turns (prompt-tool boilerplate such as "Please ignore all previous instructions. I want
you to respond only in language English"): `OverlapReport.by_prompt` shows which prompts the hits come from.
"""

import functools
import logging
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .records import iter_records, normalize_messages


logger = logging.getLogger(__name__)

# The benchmark's evaluation sets, as `eagle3_hf.bench.prompts.DATASETS` names them.
EVALUATION_SETS = ("mt_bench", "humaneval", "sharegpt")
# What training does with records that overlap them (`DataArguments.evaluation_overlap`, `screen_training_records`).
OVERLAP_POLICIES = ("drop", "warn", "error", "off")
NGRAM = 13
MIN_WORDS = 8
_WORD = re.compile(r"[^\W_]+")  # letters and digits


def normalize_words(text: str) -> list[str]:
    """`text` as the words the overlap rules compare: NFKC, case-folded, runs of letters and digits.

    >>> normalize_words("Compose an engaging travel-blog post! def has_close_elements(x):")
    ['compose', 'an', 'engaging', 'travel', 'blog', 'post', 'def', 'has', 'close', 'elements', 'x']
    """
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def _ngrams(words: Sequence[str], n: int) -> Iterable[tuple[str, ...]]:
    """The runs of `n` consecutive words of `words` (none when it has fewer)."""
    return zip(*(words[i:] for i in range(n)))


class EvaluationIndex:
    """The evaluation prompts' normalised texts and long n-grams, in hash tables, to test training text against.

    Args:
        prompts (`Iterable[EvalPrompt]`): evaluation prompts (`eagle3_hf.bench.prompts.EvalPrompt`); each of their
            turns is indexed, under the prompt's `dataset` and `prompt_id`.
        n (`int`, *optional*, defaults to 13): the n-gram length of rule 2 (see the module docstring).
        min_words (`int`, *optional*, defaults to 8): prompts with `min_words` to `n - 1` words match as a whole
            inside longer turns; shorter ones only by equality.
    """

    def __init__(self, prompts: Iterable, n: int = NGRAM, min_words: int = MIN_WORDS):
        if not 1 <= min_words <= n:
            raise ValueError(f"min_words={min_words} must be between 1 and n={n}.")
        self.n, self.min_words = n, min_words
        self.datasets: list[str] = []  # in first-seen order
        self.prompts: dict[tuple[str, str], str] = {}  # (dataset, prompt_id) -> its first turn, for reports
        self._texts: dict[str, list[tuple[str, str]]] = {}  # normalised text -> [(dataset, prompt_id)]
        self._runs: dict[tuple[str, ...], list[tuple[str, str]]] = {}  # n-grams and whole short prompts
        for prompt in prompts:
            if prompt.dataset not in self.datasets:
                self.datasets.append(prompt.dataset)
            self.prompts.setdefault((prompt.dataset, prompt.prompt_id), prompt.turns[0] if prompt.turns else "")
            for turn in prompt.turns:
                self._add(normalize_words(turn), (prompt.dataset, prompt.prompt_id))
        # Word-run lengths to look up in a training turn: n, and each short prompt's own length.
        self._lengths = sorted({len(run) for run in self._runs})
        # The first `min_words` words of every run: a turn without one of them (most turns) needs no other look-up.
        self._heads = {run[:min_words] for run in self._runs}

    def _add(self, words: list[str], owner: tuple[str, str]) -> None:
        if not words:
            return
        self._texts.setdefault(" ".join(words), []).append(owner)
        if len(words) >= self.n:
            runs = _ngrams(words, self.n)
        else:
            runs = [tuple(words)] if len(words) >= self.min_words else []
        for run in runs:
            owners = self._runs.setdefault(run, [])
            if owner not in owners:
                owners.append(owner)

    @classmethod
    def from_benchmarks(
        cls, datasets: Sequence[str] = EVALUATION_SETS, n: int = NGRAM, min_words: int = MIN_WORDS
    ) -> "EvaluationIndex":
        """The prompts the benchmark evaluates on (`eagle3_hf.bench.prompts.load_prompts`, all of each set):
        MT-bench's two turns, HumanEval's prompts, the held-out ShareGPT first turns. Reading the held-out ShareGPT
        slice takes about 1.5 s. A missing evaluation package raises `FileNotFoundError` naming its install
        command (`eagle3_hf.assets`)."""
        from ..bench.prompts import load_prompts

        return cls(load_prompts(list(datasets)), n=n, min_words=min_words)

    def __len__(self) -> int:
        return len(self._texts)

    def matches(self, text: str) -> dict[str, list[str]]:
        """The evaluation prompts `text` overlaps: `{dataset: [prompt_id, ...]}`, empty when none (see the rules in
        the module docstring)."""
        words = normalize_words(text)
        owners = list(self._texts.get(" ".join(words), []))
        if not self._heads.isdisjoint(_ngrams(words, self.min_words)):  # one pass at C speed rules most turns out
            for length in self._lengths:
                for run in _ngrams(words, length):
                    owners += self._runs.get(run, [])
        found: dict[str, list[str]] = {}
        for dataset, prompt_id in owners:
            if prompt_id not in found.setdefault(dataset, []):
                found[dataset].append(prompt_id)
        return found


@dataclass
class OverlapReport:
    """What `check_evaluation_overlap` found.

    `checked`: records read; `invalid`: malformed ones (skipped); `overlaps`: `{dataset: [record index, ...]}`
    for every dataset of the index (indices count from the source's start, as `iter_records` gives them);
    `examples`: for each offending record index, `{dataset: [prompt_id, ...]}` of the prompts it overlaps.
    """

    checked: int = 0
    invalid: int = 0
    overlaps: dict[str, list[int]] = field(default_factory=dict)
    examples: dict[int, dict[str, list[str]]] = field(default_factory=dict)

    @property
    def offending(self) -> list[int]:
        """Every record index that overlaps some evaluation set, ascending."""
        return sorted(self.examples)

    def by_prompt(self) -> list[tuple[str, str, int]]:
        """`(dataset, prompt_id, records)` for each evaluation prompt some record overlaps, most records first."""
        counts = Counter(
            (dataset, prompt_id)
            for found in self.examples.values()
            for dataset, prompt_ids in found.items()
            for prompt_id in prompt_ids
        )
        return [(dataset, prompt_id, count) for (dataset, prompt_id), count in counts.most_common()]


def check_evaluation_overlap(
    source, index: EvaluationIndex | None = None, offset: int = 0, limit: int | None = None
) -> OverlapReport:
    """Test the user turns of `source[offset : offset + limit]` against the evaluation prompts.

    Args:
        source: anything `eagle3_hf.training.records.iter_records` reads (a JSON/JSONL file, `"sharegpt"`, a
            `datasets.Dataset`, a list of records), in ShareGPT or chat form.
        index (`EvaluationIndex`, *optional*): the prompts to test against; defaults to
            `EvaluationIndex.from_benchmarks()`.
        offset, limit: the slice of the source to check.

    About 2.6 s for ShareGPT's first 17,000 records (59k user turns, 3.6M words) on a shared 2-core CPU.
    """
    index = index if index is not None else EvaluationIndex.from_benchmarks()
    report = OverlapReport(overlaps={dataset: [] for dataset in index.datasets})
    for record_index, record in iter_records(source, offset, limit):
        report.checked += 1
        try:
            messages = normalize_messages(record)
        except ValueError as error:
            report.invalid += 1
            logger.debug(f"Skipping record {record_index}: {error}")
            continue
        found: dict[str, list[str]] = {}
        for message in (m for m in messages if m["role"] == "user"):
            for dataset, prompt_ids in index.matches(message["content"]).items():
                known = found.setdefault(dataset, [])
                known += [prompt_id for prompt_id in prompt_ids if prompt_id not in known]
        for dataset in found:
            report.overlaps[dataset].append(record_index)
        if found:
            report.examples[record_index] = found
    return report


def find_evaluation_overlap(
    source, index: EvaluationIndex | None = None, offset: int = 0, limit: int | None = None
) -> dict[str, list[int]]:
    """`{dataset: [record index, ...]}`: the records of `source` whose user turns overlap each evaluation set
    (`check_evaluation_overlap(...).overlaps`; every set of the index is a key, with `[]` when clean).

    >>> from eagle3_hf.bench.prompts import EvalPrompt
    >>> index = EvaluationIndex([EvalPrompt("mt_bench", "81", "writing", ["Compose a travel blog post about Hawaii."])])
    >>> find_evaluation_overlap([{"messages": [{"role": "user", "content": "compose a TRAVEL blog post about Hawaii"}]},
    ...                          {"messages": [{"role": "user", "content": "Hello"}]}], index)
    {'mt_bench': [0]}
    """
    return check_evaluation_overlap(source, index, offset, limit).overlaps


# ------------------------------------------------------------------------------------------------ for training
@functools.cache
def _benchmark_index() -> EvaluationIndex:
    """`EvaluationIndex.from_benchmarks()`, built once per process (reading the held-out ShareGPT slice takes
    about 1.5 s, and `train` and `vocab` screen the same data)."""
    return EvaluationIndex.from_benchmarks()


def screen_training_records(
    source, policy: str = "drop", offset: int = 0, limit: int | None = None, index: EvaluationIndex | None = None
) -> list[int]:
    """The records of `source[offset : offset + limit]` to leave out of training because they overlap the
    benchmark's evaluation prompts, by `policy`:

    - `"drop"`: the overlapping records' indices (for `build_training_dataset(exclude=...)`), with a warning naming
      how many there are and the prompts hit most;
    - `"warn"`: the same warning, and `[]` (train on everything);
    - `"error"`: `ValueError` naming the first overlapping records, when there are any;
    - `"off"`: no check, `[]`.

    Without the evaluation packages installed nothing can be checked: `"drop"` and `"warn"` say so in a warning,
    `"error"` raises the `FileNotFoundError` naming the install command.

    Args:
        source, offset, limit: the training data, as `build_training_dataset` reads it.
        policy (`str`, *optional*, defaults to `"drop"`): one of `OVERLAP_POLICIES`.
        index (`EvaluationIndex`, *optional*): the prompts to keep out; defaults to the benchmark's.
    """
    if policy not in OVERLAP_POLICIES:
        raise ValueError(f"evaluation_overlap={policy!r}; expected one of {OVERLAP_POLICIES}.")
    if policy == "off":
        return []
    if index is None:
        try:
            index = _benchmark_index()
        except FileNotFoundError as error:
            if policy == "error":
                raise
            logger.warning(f"Training data not checked against the evaluation prompts: {error}")
            return []
    report = check_evaluation_overlap(source, index, offset, limit)
    offending = report.offending
    if not offending:
        return []
    hits = ", ".join(f"{dataset} {prompt_id} ({count})" for dataset, prompt_id, count in report.by_prompt()[:5])
    found = (
        f"{len(offending)} of the {report.checked} training records of {source!r:.100} overlap the benchmark's "
        f"evaluation prompts (records {offending[:10]}{' ...' if len(offending) > 10 else ''}; prompts hit most, "
        f"with their record counts: {hits}; `eagle3-hf check-data` lists them)"
    )
    if policy == "error":
        raise ValueError(f"{found}. Leave them out with evaluation_overlap='drop'.")
    if policy == "warn":
        logger.warning(f"{found}; training on them anyway (evaluation_overlap='warn').")
        return []
    logger.warning(f"{found}; they are left out (evaluation_overlap='drop').")
    return offending

"""Error analysis for the star-count task: where and how a model's answers go wrong.

``analyse(examples, answers)`` scores each answer against its example and sorts the wrong ones
into classes that point at different fixes:

* ``format``: the answer cannot be read, or leaves a colour out (the verifier counts a missing
  colour as wrong, and nothing about the model's counting can be learnt from it);
* ``off_by_one``: every colour within one of the truth, at least one exactly one off;
* ``off_by_more``: some colour two or more off.

It also gives the exact accuracy per colour and per canvas resolution, and the hardest examples
(wrong ones, the most stars first). ``Analysis.summary_lines()`` are ``name: number`` lines the
runner's summary parser reads; ``Analysis.text()`` says in a few words what the errors suggest.
Standard library plus this package's verifier only, so it runs wherever the evaluation runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .verify import parse_answer

ERROR_CLASSES = ("format", "off_by_one", "off_by_more")  # also the tie-break order of `dominant`

ADVICE = {
    "format": "fix the prompt or the answer format before touching the model: a format failure "
    "scores zero however well the model counts",
    "off_by_one": "the model nearly counts; add hard cases (dense scenes) to training, or train "
    "longer, rather than changing the model's shape",
    "off_by_more": "the model has not learnt to count yet; more data, capacity or epochs (or a "
    "learning rate that converges) before fine-tuning anything else",
}


@dataclass(frozen=True)
class Case:
    """One held-out example and what the model answered for it."""

    index: int  # position in the evaluated split
    seed: int
    resolution: int  # canvas side in pixels
    truth: dict[str, int]
    predicted: dict[str, int] | None  # None: the answer could not be read
    error: str | None  # one of ERROR_CLASSES, None when exactly right

    @property
    def stars(self) -> int:
        return sum(self.truth.values())

    @property
    def miss(self) -> int:
        """How far off in total (colours left out count as off by their truth)."""
        guess = self.predicted or {}
        return sum(abs(guess.get(colour, 0) - n) for colour, n in self.truth.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "seed": self.seed,
            "resolution": self.resolution,
            "stars": self.stars,
            "truth": self.truth,
            "predicted": self.predicted,
            "error": self.error,
        }


def classify(truth: Mapping[str, int], predicted: Mapping[str, int] | None) -> str | None:
    """The error class of one answer (None when every colour is exactly right)."""
    if predicted is None or any(colour not in predicted for colour in truth):
        return "format"
    off = [abs(predicted[colour] - n) for colour, n in truth.items()]
    if max(off, default=0) == 0:
        return None
    return "off_by_one" if max(off) == 1 else "off_by_more"


def _fraction(hits: int, n: int) -> float:
    return round(hits / n, 4) if n else 0.0


@dataclass(frozen=True)
class Analysis:
    cases: list[Case]
    colours: list[str]
    per_colour: dict[str, float] = field(default_factory=dict)  # colour -> exact accuracy
    by_resolution: dict[int, float] = field(default_factory=dict)  # side -> exact accuracy
    errors: dict[str, int] = field(default_factory=dict)  # class -> count, every class present

    @property
    def n(self) -> int:
        return len(self.cases)

    @property
    def wrong(self) -> list[Case]:
        return [c for c in self.cases if c.error is not None]

    @property
    def dominant(self) -> str | None:
        """The most frequent error class (None when nothing is wrong)."""
        if not self.wrong:
            return None
        return max(ERROR_CLASSES, key=lambda k: (self.errors[k], -ERROR_CLASSES.index(k)))

    def hardest(self, k: int = 8) -> list[Case]:
        """Up to `k` wrong examples, the most stars first (then the furthest off, then in order)."""
        return sorted(self.wrong, key=lambda c: (-c.stars, -c.miss, c.index))[:k]

    def summary_lines(self) -> list[str]:
        """`name: number` lines for the runner (numbers only: its parser reads nothing else)."""
        lines = [f"acc/{colour}: {acc}" for colour, acc in self.per_colour.items()]
        lines += [f"acc/res_{res}: {acc}" for res, acc in sorted(self.by_resolution.items())]
        lines += [f"errors/{k}: {self.errors[k]}" for k in ERROR_CLASSES]
        return lines

    def text(self) -> str:
        """A short markdown paragraph: the dominant error class and what it suggests."""
        dominant = self.dominant
        if dominant is None:
            return f"All {self.n} held-out examples counted exactly: no errors to learn from."
        wrong = self.wrong
        of_kind = [c for c in wrong if c.error == dominant]
        mean_all = sum(c.stars for c in self.cases) / self.n
        mean_kind = sum(c.stars for c in of_kind) / len(of_kind)
        worst_colour = min(self.per_colour, key=lambda c: (self.per_colour[c], c))
        worst_res = min(self.by_resolution, key=lambda r: (self.by_resolution[r], r))
        return (
            f"**{len(wrong)} of {self.n}** held-out examples wrong; the dominant error is "
            f"**{dominant.replace('_', ' ')}** ({len(of_kind)} of them, on canvases of "
            f"{mean_kind:.1f} stars against {mean_all:.1f} on average). Weakest colour: {worst_colour} "
            f"({self.per_colour[worst_colour]:.0%}); weakest resolution: {worst_res} px "
            f"({self.by_resolution[worst_res]:.0%}). Suggests: {ADVICE[dominant]}."
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "exact": self.n - len(self.wrong),
            "per_colour": self.per_colour,
            "by_resolution": {str(r): acc for r, acc in sorted(self.by_resolution.items())},
            "errors": self.errors,
            "dominant": self.dominant,
            "text": self.text(),
            "hardest": [c.to_dict() for c in self.hardest()],
        }


def _case(index: int, example: Any, answer: str) -> Case:
    truth = {str(k).lower(): int(v) for k, v in example.counts.items()}
    predicted = parse_answer(answer)
    return Case(index, example.seed, example.width, truth, predicted, classify(truth, predicted))


def analyse(examples: Sequence[Any], answers: Sequence[str]) -> Analysis:
    """Analyse `answers` (answer texts) against `examples` (anything with `.counts`, `.seed` and
    `.width`, e.g. generate.Example), in the same order."""
    cases = [_case(i, ex, ans) for i, (ex, ans) in enumerate(zip(examples, answers, strict=True))]
    colours = list(cases[0].truth) if cases else []
    per_colour = {
        colour: _fraction(sum((c.predicted or {}).get(colour) == c.truth[colour] for c in cases), len(cases))
        for colour in colours
    }
    by_resolution: dict[int, float] = {}
    for res in sorted({c.resolution for c in cases}):
        at = [c for c in cases if c.resolution == res]
        by_resolution[res] = _fraction(sum(c.error is None for c in at), len(at))
    errors = {k: sum(c.error == k for c in cases) for k in ERROR_CLASSES}
    return Analysis(cases, colours, per_colour, by_resolution, errors)

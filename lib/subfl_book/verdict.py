"""The book's one verdict rule: from a paper's claim and our per-seed values, a status.

Every status the book prints comes from :func:`judge`; no page types one. The rule, as the book states it:

* ``exact`` — an analytic quantity (a parameter count, a byte count, a closed form) that equals the paper's number
  within the paper's rounding (half a unit of its last printed digit, unless the check names a tolerance). An
  analytic quantity that does not is ``differs``.
* Learned quantities are compared through their seeds. Each side of a comparison is summarised by its mean ± sd
  over seeds (a diverged seed counts at the chance level where one is given; otherwise it makes the comparison
  ``inconclusive``).
  * ``not-run`` — no value of ours.
  * ``inconclusive`` — fewer than :data:`MIN_SEEDS` seeds on a side, or the mean ± sd bands overlap (for a bound:
    the band straddles the limit), or the run is at the ``ci`` smoke-test scale.
  * ``near-chance`` — every compared value is within :data:`NEAR_CHANCE` of the chance level (it closed less than
    10 % of the gap from chance to a perfect score), so no ordering among them means anything.
  * ``same`` — the paper's ordering (or bound, or trend) holds beyond the bands; ``differs`` — the opposite holds
    beyond the bands.

Deterministic quantities (parameter counts, ledger bytes) compared by order or bound are judged without the seed
and scale gates: the ordering holds (``same``) or not (``differs``).

A trend (a sweep the paper says moves one way) is judged pair by pair along the sweep: ``differs`` if any adjacent
pair is reversed beyond the bands, ``same`` if every pair holds beyond them, else ``inconclusive``.

A claim that one thing is the best of several ("PriSM's server model is the most accurate") is judged against every
rival, not only the one with the best mean: ``differs`` if any rival is ahead beyond the bands, ``same`` only if it
is ahead of every rival beyond them, else ``inconclusive``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Iterable, Sequence

STATUSES = ("exact", "same", "differs", "inconclusive", "near-chance", "not-run")
"""Every status the book uses, best first."""

MIN_SEEDS = 3
"""Fewer seeds than this on a compared side: ``inconclusive``."""

NEAR_CHANCE = 0.1
"""A value is near chance when it closed less than this share of the gap from chance to a perfect score."""

MEASURED_SCALES = ("cpu", "paper")
"""Scales whose runs can decide a learned claim; below them (``ci``) every learned verdict is inconclusive."""


@dataclass(frozen=True)
class Band:
    """Our values of one quantity over seeds, summarised as mean ± sd (sd 0 for one seed)."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: float | Iterable[float], chance: float | None = None) -> "Band":
        raw = (values,) if isinstance(values, (int, float)) else tuple(values)
        cleaned = tuple(float(chance) if (v is None or v != v) and chance is not None else
                        (math.nan if v is None else float(v)) for v in raw)
        return cls(cleaned)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def finite(self) -> bool:
        return self.n > 0 and all(math.isfinite(v) for v in self.values)

    @property
    def mean(self) -> float:
        return math.fsum(self.values) / self.n if self.n else math.nan

    @property
    def sd(self) -> float:
        if self.n < 2:
            return 0.0
        m = self.mean
        return math.sqrt(math.fsum((v - m) ** 2 for v in self.values) / (self.n - 1))

    @property
    def low(self) -> float:
        return self.mean - self.sd

    @property
    def high(self) -> float:
        return self.mean + self.sd

    def label(self, analytic: bool = False) -> str:
        """``0.612 ± 0.011 (n = 3)``; a deterministic quantity (``analytic``) as its value alone."""
        if not self.n:
            return "—"
        if not self.finite:
            return f"diverged (n = {self.n})"
        if analytic:
            return fmt(self.mean)
        if self.n == 1:
            return f"{fmt(self.mean)} (n = 1)"
        return f"{fmt(self.mean)} ± {fmt(self.sd, 2)} (n = {self.n})"


ROUNDOFF_FLOOR = 1e-12
"""Deviations below this are float64 roundoff: their digits depend on the CPU and the thread count, so a page
shows them as "< 1e-12" and reads the same on any machine."""


def fmt_deviation(value: float) -> str:
    """A deviation or error for a scorecard cell: two significant digits, or ``< 1e-12`` below
    :data:`ROUNDOFF_FLOOR` (0 stays 0)."""
    if math.isfinite(value) and 0 < abs(value) < ROUNDOFF_FLOOR:
        return f"< {ROUNDOFF_FLOOR:.0e}"
    return f"{value:.2g}"


def fmt_residue(value: float, tolerance: float) -> str:
    """A residue of a numerical check computed live on the page (``value``, checked against ``tolerance``), as a
    reader can compare it across machines: ``< 1e-12`` below :data:`ROUNDOFF_FLOOR` (zero included), ``≤ tolerance``
    within the tolerance, else its value to two significant digits (a failed check shows what it missed by).

    Why not the digits: a residue's digits are rounding noise that depends on the CPU's kernels (a float32 check
    gave 4.4e-07 on one processor and 1.7e-06 on another), so a page that printed them would read differently on
    every machine; whether the check holds, and to which precision, does not. With ``tolerance=0`` (an integer
    identity: ranks, counts) the value is exact and shown as it is."""
    if tolerance < 0:
        raise ValueError(f"tolerance={tolerance!r} is not valid; accepted: a number >= 0")
    if not math.isfinite(value) or tolerance == 0:
        return fmt_deviation(value)
    if abs(value) < min(ROUNDOFF_FLOOR, tolerance):
        return f"< {ROUNDOFF_FLOOR:.0e}"
    if abs(value) <= tolerance:
        return f"≤ {tolerance:.2g}"
    return f"{value:.2g}"


def fmt(value: float, digits: int = 3) -> str:
    """A number for a scorecard cell: thousands separated from 10,000 on, else ``digits`` significant digits."""
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 10_000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


@dataclass(frozen=True)
class Verdict:
    """A status and the reason the rule gave it (shown beside the status on the scorecard)."""

    status: str
    reason: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} is not valid; accepted: {', '.join(STATUSES)}")


def rounding_tolerance(printed: float | int | str) -> float:
    """Half a unit of the last printed digit: 3.27 → 0.005, 10815 → 0.5, 0.8 → 0.05."""
    text = getattr(printed, "printed", None)                    # a register number keeps its printed text
    if isinstance(printed, str) or text is not None:
        exponent = Decimal(text or printed).as_tuple().exponent  # "2.50", "4.0" keep their printed digits
    elif float(printed).is_integer():
        exponent = 0                                            # 10815, not 1.0815E+4
    else:
        exponent = Decimal(repr(float(printed))).as_tuple().exponent
    return 0.5 * 10.0 ** int(exponent)


def judge_exact(paper: float, ours: float, *, tolerance: float | None = None, residue: bool = False) -> Verdict:
    """An analytic quantity against the paper's printed value, within half a unit of its last printed digit, or
    within ``tolerance``. With ``residue`` (a float residue computed live, e.g. the two sides of an identity) the gap
    is shown by :func:`fmt_residue` — its bound, not its CPU-dependent digits; otherwise as it is."""
    tol = rounding_tolerance(paper) if tolerance is None else tolerance
    if tol < 0:
        raise ValueError(f"tolerance={tolerance!r} is not valid; accepted: a number >= 0")
    if not math.isfinite(ours):
        return Verdict("differs", "ours is not finite")
    gap = abs(ours - paper)
    why = "rounding" if tolerance is None else "tolerance"
    shown = fmt_residue(gap, tol) if residue else fmt_deviation(gap)
    shown = f"|Δ| {shown}" if shown[0] in "<≤" else f"|Δ| = {shown}"
    if gap <= tol:
        return Verdict("exact", f"{shown} ({why})" if "≤" in shown else f"{shown} ≤ {tol:.2g} ({why})")
    return Verdict("differs", f"{shown} > {tol:.2g} ({why})")


def _scale_gate(scale: str) -> Verdict | None:
    if scale not in MEASURED_SCALES:
        return Verdict("inconclusive", f"{scale} scale: a smoke test, too small to decide a learned claim")
    return None


def perfect_score(chance: float, bands: Sequence[Band]) -> float:
    """The perfect score of an accuracy, 1 or 100: percent when the chance level or any value exceeds 1 (an
    accuracy as a fraction never does)."""
    return 100.0 if chance >= 1.0 or any(v > 1.0 for b in bands for v in b.values if math.isfinite(v)) else 1.0


def _near_chance(bands: Sequence[Band], chance: float | None, higher_is_better: bool) -> bool:
    if chance is None or not higher_is_better:
        return False
    margin = NEAR_CHANCE * (perfect_score(chance, bands) - chance)
    return all(b.finite and b.mean < chance + margin for b in bands)


def _seed_gate(bands: Sequence[Band]) -> Verdict | None:
    if any(b.n == 0 for b in bands):
        return Verdict("not-run", "no run of ours")
    if any(not b.finite for b in bands):
        return Verdict("inconclusive", "a run diverged and the quantity has no chance level")
    fewest = min(b.n for b in bands)
    if fewest < MIN_SEEDS:
        return Verdict("inconclusive", f"{fewest} seed{'s' if fewest != 1 else ''} < {MIN_SEEDS}")
    return None


def _gates(bands: Sequence[Band], scale: str, analytic: bool) -> Verdict | None:
    if analytic:  # a deterministic quantity (a count, a ledger total): no seeds, no scale
        if any(b.n == 0 for b in bands):
            return Verdict("not-run", "no value of ours")
        if any(not b.finite for b in bands):
            return Verdict("differs", "ours is not finite")
        return None
    return _scale_gate(scale) or _seed_gate(bands)


def _beyond(analytic: bool) -> str:
    """How a reason qualifies an ordering: beyond the seed bands, or as it is for deterministic values."""
    return "(deterministic values)" if analytic else "beyond the seed spread"


def bands_apart(mean_a: float, sd_a: float, mean_b: float, sd_b: float) -> bool:
    """The verdict rule's test of a difference between two quantities summarised as mean ± sd over seeds: their
    bands [mean − sd, mean + sd] do not overlap."""
    return mean_a - sd_a > mean_b + sd_b or mean_b - sd_b > mean_a + sd_a


def seed_ordering(a: tuple[float, float, int], b: tuple[float, float, int], *, higher_is_better: bool = True) -> str:
    """How ``a`` stands against ``b``, each ``(mean, sd, seeds)``, by the test :func:`judge_order` applies:
    ``"diverged"`` when a mean is NaN, ``"inconclusive (n < 3)"`` when either has fewer than :data:`MIN_SEEDS`
    seeds, ``"ahead"`` / ``"behind"`` when the bands are apart (``higher_is_better`` says which side is ahead),
    else ``"within seed spread"``. For tables that compare two of our own results; claims go through the judges."""
    (mean_a, sd_a, n_a), (mean_b, sd_b, n_b) = a, b
    if mean_a != mean_a or mean_b != mean_b:
        return "diverged"
    if min(n_a, n_b) < MIN_SEEDS:
        return f"inconclusive (n < {MIN_SEEDS})"
    if not bands_apart(mean_a, sd_a, mean_b, sd_b):
        return "within seed spread"
    return "ahead" if (mean_a > mean_b) == higher_is_better else "behind"


def judge_order(paper_first: float, paper_second: float, ours_first: Band, ours_second: Band, *,
                chance: float | None = None, higher_is_better: bool = True, scale: str = "cpu",
                analytic: bool = False) -> Verdict:
    """The paper reports ``paper_first`` and ``paper_second`` for two things (two methods, two settings); does our
    ordering of the two agree? Equal paper values make the claim "no difference": ``same`` needs our bands to
    overlap, and that is all a seed spread can show, so it is ``inconclusive`` unless they do not (``differs``).
    ``analytic``: the two are deterministic quantities (counts, bytes), judged without the seed and scale gates."""
    gate = _gates([ours_first, ours_second], scale, analytic)
    if gate:
        return gate
    if _near_chance([ours_first, ours_second], chance, higher_is_better):
        return Verdict("near-chance", f"both within {NEAR_CHANCE:.0%} of the gap above chance {chance:g}")
    overlap = not bands_apart(ours_first.mean, ours_first.sd, ours_second.mean, ours_second.sd)
    if paper_first == paper_second and analytic:
        return (Verdict("same", "equal, as in the paper") if ours_first.mean == ours_second.mean else
                Verdict("differs", "the paper's two values are equal; ours are not"))
    if paper_first == paper_second:
        return (Verdict("inconclusive", "paper reports no difference; our bands overlap") if overlap else
                Verdict("differs", "paper reports no difference; our bands are apart"))
    if overlap:
        return Verdict("inconclusive", "mean ± sd bands overlap")
    paper_sign = math.copysign(1.0, paper_first - paper_second)
    ours_sign = math.copysign(1.0, ours_first.mean - ours_second.mean)
    where = _beyond(analytic)
    if paper_sign == ours_sign:
        return Verdict("same", f"the paper's ordering holds {where}")
    return Verdict("differs", f"the opposite ordering holds {where}")


def judge_bound(limit: float, ours: Band, *, at_most: bool, chance: float | None = None,
                higher_is_better: bool = True, scale: str = "cpu", analytic: bool = False) -> Verdict:
    """The paper says a quantity stays at most (``at_most``) or at least ``limit``; does ours, beyond its band?
    ``chance`` applies when the quantity itself is an accuracy; ``analytic`` as in :func:`judge_order`."""
    gate = _gates([ours], scale, analytic)
    if gate:
        return gate
    if _near_chance([ours], chance, higher_is_better):
        return Verdict("near-chance", f"within {NEAR_CHANCE:.0%} of the gap above chance {chance:g}")
    holds = ours.high <= limit if at_most else ours.low >= limit
    fails = ours.low > limit if at_most else ours.high < limit
    sign = "≤" if at_most else "≥"
    if holds:
        return Verdict("same", f"the whole band is {sign} {limit:g}")
    if fails:
        return Verdict("differs", f"the whole band is on the wrong side of {limit:g}")
    return Verdict("inconclusive", f"the band straddles {limit:g}")


def judge_trend(paper_values: Sequence[float], ours: Sequence[Band], *, chance: float | None = None,
                higher_is_better: bool = True, scale: str = "cpu", analytic: bool = False) -> Verdict:
    """A sweep: the paper's values along it against ours, adjacent pair by adjacent pair (:func:`judge_order`)."""
    if len(paper_values) != len(ours) or len(ours) < 2:
        raise ValueError(f"a trend needs at least two points and as many of ours ({len(ours)}) as the paper's "
                         f"({len(paper_values)})")
    gate = _gates(ours, scale, analytic)
    if gate:
        return gate
    if _near_chance(ours, chance, higher_is_better):
        return Verdict("near-chance", f"every point within {NEAR_CHANCE:.0%} of the gap above chance {chance:g}")
    pairs = [judge_order(p1, p2, o1, o2, scale=scale, analytic=analytic)
             for p1, p2, o1, o2 in zip(paper_values, paper_values[1:], ours, ours[1:])]
    statuses = [v.status for v in pairs]
    where = _beyond(analytic)
    if "differs" in statuses:
        k = statuses.index("differs")
        return Verdict("differs", f"step {k + 1}→{k + 2} goes the other way {where}")
    if all(s == "same" for s in statuses):
        return Verdict("same", f"every step goes the paper's way {where}")
    return Verdict("inconclusive", f"{statuses.count('inconclusive')} of {len(pairs)} steps within the seed spread")


def judge_best(ours: Band, rivals: Sequence[Band], *, chance: float | None = None, higher_is_better: bool = True,
               scale: str = "cpu", analytic: bool = False, names: Sequence[str] | None = None) -> Verdict:
    """The paper says ``ours`` (one method) is the best of it and ``rivals``: judged against each rival
    (:func:`judge_order`), so a rival with a wide seed spread cannot hide behind one with a better mean. ``names``
    (one per rival) name the rivals in the reason."""
    if not rivals:
        raise ValueError("a best-of claim needs at least one rival")
    if names is not None and len(names) != len(rivals):
        raise ValueError(f"names has {len(names)} entries; accepted: one per rival ({len(rivals)})")
    names = list(names) if names is not None else [f"rival {k + 1}" for k in range(len(rivals))]
    bands = [ours, *rivals]
    gate = _gates(bands, scale, analytic)
    if gate:
        return gate
    if _near_chance(bands, chance, higher_is_better):
        return Verdict("near-chance", f"every value within {NEAR_CHANCE:.0%} of the gap above chance {chance:g}")
    sign = 1.0 if higher_is_better else -1.0
    statuses = [judge_order(sign, -sign, ours, rival, scale=scale, analytic=analytic).status for rival in rivals]
    where = _beyond(analytic)
    if "differs" in statuses:
        ahead = ", ".join(n for n, st in zip(names, statuses) if st == "differs")
        return Verdict("differs", f"{ahead} ahead {where}")
    if all(st == "same" for st in statuses):
        return Verdict("same", f"ahead of all {len(rivals)} rivals {where}")
    level = ", ".join(n for n, st in zip(names, statuses) if st != "same")
    return Verdict("inconclusive", f"{statuses.count('inconclusive')} of {len(rivals)} rivals within the seed spread "
                                   f"({level})")

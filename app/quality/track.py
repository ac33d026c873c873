"""Judge the ratings over many nights: per-night rank IC at each horizon, and what it adds up to.

Per horizon h (trading days): each night's rank IC, their mean and its t (on overlapping
returns: ``app.quality.statistics.overlap_t``), the share of positive nights and the hit
rate, the long–short spread, the scored record per rating, and a verdict withheld below
``min_nights(h)`` nights. A night is the newest finished nightly batch of an as-of date;
nights whose returns start from the same session count once; a night whose returns are not
there yet is pending, listed and never counted; a night of fewer than ``TRACK_MIN_TICKERS``
tickers with a return is listed, its IC not judged: it enters no test and no band.
docs/quality.md ("`quality track`") says what each figure means and why the t was chosen.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date

import numpy as np
import pydantic
from scipy import stats
from sqlalchemy import Engine

from agents.data import DataProvider, get_provider
from agents.decision import RATINGS
from app.config import Settings
from app.db.batchsettings import BatchSettings
from app.db.models import FINISHED_STATUSES, Batch, night_of_each_date
from app.errors import DataError, InputError, NoNightYet
from app.quality.forward import (
    PriceCache,
    directional_hits,
    parse_horizon,
    scored,
    ticker_returns,
)
from app.quality.grades import BatchGrades, load_grades
from app.quality.statistics import (
    BEARISH,
    BULLISH,
    mean_defined,
    overlap_error,
    overlap_t,
    spearman,
)

MIN_NIGHTS = 20  # fewer nights with an IC than this: no verdict
MIN_INDEPENDENT = 5  # fewer non-overlapping nights (⌊nights/h⌋) than this: no verdict
SIGNIFICANCE = 0.05
DEFAULT_HORIZONS = "1d,5d,20d"  # the scored record's horizons
MIN_SCORED = 30  # scored ratings before a rating's hit rate is shown: its error is then ≤ 9%
# Fewer tickers with a return on a night than this: its IC enters no test and no band, as the
# t on nights of 3 runs over its 5% (docs/quality.md, "Nights of three tickers").
# ``quality forward`` keeps ``spearman``'s 3: its one-night test is by permutation.
TRACK_MIN_TICKERS = 4
NOT_JUDGED = (f"fewer than {TRACK_MIN_TICKERS} tickers with a return: an IC of 3 takes four "
              "values, and a t-test on them runs over its 5%")


def min_nights(days: int) -> int:
    """Return the nights a horizon needs before a verdict: 20, and 5 horizons' worth.

    Below 5 non-overlapping nights the t has under 4 degrees of freedom: a verdict would
    need an IC far beyond any real signal's, so none is given.
    """
    return max(MIN_NIGHTS, MIN_INDEPENDENT * days)


@dataclass(frozen=True)
class IcTest:
    """The test of "mean IC = 0" over one horizon's nights."""

    nights: int  # nights with a defined IC
    needed: int
    t_stat: float | None
    p_value: float | None

    @property
    def withheld(self) -> bool:
        """Return whether there are too few nights for the test to mean anything."""
        return self.nights < self.needed

    @property
    def significant(self) -> bool:
        """Return whether the mean IC differs from 0 at the 5% level."""
        return (not self.withheld and self.p_value is not None
                and self.p_value < SIGNIFICANCE)


def ic_verdict(ics: Sequence[float], days: int) -> IcTest:
    """Return the test of the nights' mean IC at a horizon of ``days`` (module notes)."""
    t_stat, p_value = overlap_t(ics, days) if ics else (None, None)
    return IcTest(len(ics), min_nights(days), t_stat, p_value)


@dataclass(frozen=True)
class NightReturns:
    """One night's graded tickers that have a defined return at one horizon."""

    batch_id: int
    as_of: str
    ratings: list[str]
    scores: list[float]
    returns: list[float]  # forward or excess, as judged
    left_out: dict[str, str] = field(default_factory=dict)  # ticker -> why it has no return
    session: str = ""  # the session its returns start from (the last on or before the as-of)


def one_per_session(nights: Sequence[NightReturns]) -> tuple[list[NightReturns], dict[str, str]]:
    """Return the nights (as-of order) keeping the newest of each session, and why not the rest.

    Nights whose returns start from one session (a Friday's, Saturday's and Sunday's as-of on
    a daily schedule, a holiday's and the day before's) have the same returns: the t of the
    mean IC takes nights to be at least a session apart, and would count that session twice
    or three times. A night without a session (a simulated one) is its own.
    """
    newest = {n.session or id(n): n for n in nights}
    kept = [n for n in nights if newest[n.session or id(n)] is n]
    return kept, {n.as_of: f"its returns start from {n.session}, as the night of "
                  f"{newest[n.session].as_of}'s do: counted once, as that night"
                  for n in nights if newest[n.session or id(n)] is not n}


@dataclass(frozen=True)
class NightIC:
    """One night at one horizon: its tickers, IC, long–short spread and directional calls."""

    batch_id: int
    as_of: str
    n: int
    ic: float | None
    long_short: float | None  # mean return of Buy/Overweight − that of Underweight/Sell
    calls: int  # directional (non-Hold) ratings
    hits: int  # of those, the ones whose return had their sign
    not_judged: str = ""  # why the night's IC is None and enters no test: NOT_JUDGED, or ""


@dataclass(frozen=True)
class RatingRecord:
    """One rating's scored record at one horizon: every ticker-night that got it, pooled."""

    rating: str
    scored: int  # ratings with a defined return
    needed: int  # scored ratings before the figures are shown
    hit_rate: float | None  # None for Hold (no direction), and below ``needed``
    mean_return: float | None  # None below ``needed``


@dataclass
class HorizonRecord:
    """The track record at one horizon."""

    horizon_days: int
    independent: int  # non-overlapping nights among those judged: ⌊judged / h⌋
    min_nights: int
    judged: int  # nights with a defined IC (of TRACK_MIN_TICKERS tickers or more)
    mean_ic: float | None
    sd_ic: float | None
    # None below ``min_nights``: beside a withheld verdict they would read as one (the peek
    # docs/quality.md warns of); the mean IC, its sd and the shares describe, and stay.
    t_stat: float | None
    p_value: float | None
    positive_share: float | None  # of judged nights, those with IC > 0
    hit_rate: float | None  # directional calls pooled over nights
    long_short: float | None
    long_short_t: float | None  # None below ``min_nights`` too
    by_rating: list[RatingRecord]
    decay: float | None  # mean IC ÷ the shortest horizon's mean IC
    verdict: str
    withheld: bool  # fewer than ``min_nights`` judged: no verdict, no t, no p
    nights: list[NightIC]
    pending: dict[str, str] = field(default_factory=dict)  # as-of -> why no returns yet
    left_out: dict[str, dict[str, str]] = field(default_factory=dict)  # as-of -> ticker -> why


# `quality track --format json`'s schema: raised when a field of TrackReport changes.
SCHEMA = "quality-track/2"  # 2: a night's ic is null below TRACK_MIN_TICKERS (not_judged)


@pydantic.dataclasses.dataclass
class TrackReport:
    """Every horizon's track record over the same nights."""

    nights: int
    first: str | None
    last: str | None
    benchmark: str | None
    horizons: list[HorizonRecord]
    demo: bool = False  # the nights ran on the seeded synthetic DEMO data


def night_ic(night: NightReturns) -> NightIC:
    """Return one night's IC, long–short spread and directional hits."""
    bulls = [x for r, x in zip(night.ratings, night.returns, strict=True) if r in BULLISH]
    bears = [x for r, x in zip(night.ratings, night.returns, strict=True) if r in BEARISH]
    spread = float(np.mean(bulls) - np.mean(bears)) if bulls and bears else None
    hits, calls = directional_hits(night.ratings, night.returns)
    tickers = len(night.scores)
    ic = judged_ic(tickers, lambda: spearman(night.scores, night.returns))
    return NightIC(night.batch_id, night.as_of, tickers, ic, spread, calls, hits,
                   "" if tickers >= TRACK_MIN_TICKERS else NOT_JUDGED)


def judged_ic(tickers: int, ic: Callable[[], float | None]) -> float | None:
    """Return a night's IC as the verdict counts it: ``ic()`` (None or NaN where undefined:
    all scores or returns equal), and None, never asked, for a night of fewer than
    TRACK_MIN_TICKERS tickers with a return. The one rule of which nights are judged: the
    product's nights (``night_ic``) and the simulated ones (app/quality/simulation.py)."""
    if tickers < TRACK_MIN_TICKERS:
        return None
    value = ic()
    return None if value is None or not math.isfinite(value) else float(value)


def horizon_record(nights: Sequence[NightReturns], days: int,
                   pending: dict[str, str] | None = None) -> HorizonRecord:
    """Return the track record of ``nights`` (in as-of order) at a horizon of ``days``."""
    per_night = [night_ic(n) for n in nights]
    ics = [n.ic for n in per_night if n.ic is not None]
    test = ic_verdict(ics, days)
    spreads = [n.long_short for n in per_night if n.long_short is not None]
    calls = sum(n.calls for n in per_night)
    mean_ic = mean_defined(ics)
    judged = not test.withheld
    return HorizonRecord(
        horizon_days=days, independent=len(ics) // days, min_nights=test.needed,
        judged=len(ics), mean_ic=mean_ic,
        sd_ic=float(np.std(ics, ddof=1)) if len(ics) > 1 else None,
        t_stat=test.t_stat if judged else None, p_value=test.p_value if judged else None,
        positive_share=sum(ic > 0 for ic in ics) / len(ics) if ics else None,
        hit_rate=sum(n.hits for n in per_night) / calls if calls else None,
        long_short=mean_defined(spreads),
        long_short_t=overlap_t(spreads, days)[0] if spreads and judged else None,
        by_rating=[rating_record(rating, nights) for rating in RATINGS],
        decay=None, withheld=not judged,
        verdict=verdict(test, mean_ic, len(per_night),
                        sum(bool(n.not_judged) for n in per_night)),
        nights=per_night, pending=dict(pending or {}),
        left_out={n.as_of: n.left_out for n in nights if n.left_out},
    )


@dataclass(frozen=True)
class RunningMean:
    """The mean IC over the nights up to one night, with its 95% band."""

    as_of: str
    ic: float
    mean: float
    low: float | None  # mean ∓ t(0.975, K − 1) × its overlap_error; None below min_nights
    high: float | None


def running_mean(record: HorizonRecord, level: float = 0.95) -> list[RunningMean]:
    """Return, night by night, the mean IC so far and its band (the web page's plot).

    The band starts where the verdict does (``record.min_nights``): a band clear of zero is
    the verdict read early, and an earlier one holds less than 95% (docs/quality.md).
    """
    points, ics = [], []
    days = record.horizon_days
    for night in record.nights:
        if night.ic is None:
            continue
        ics.append(night.ic)
        mean = float(np.mean(ics))
        error = overlap_error(ics, days) if len(ics) >= record.min_nights else None
        half = (None if error is None
                else float(stats.t.ppf(0.5 + level / 2, len(ics) // days - 1)) * error)
        points.append(RunningMean(night.as_of, night.ic, mean,
                                  None if half is None else mean - half,
                                  None if half is None else mean + half))
    return points


def verdict(test: IcTest, mean_ic: float | None, nights: int, short: int = 0) -> str:
    """Say in words what the nights show (module notes); ``nights`` counts those scored,
    ``short`` those of them with fewer than TRACK_MIN_TICKERS tickers (not judged).
    """
    not_judged = (f"{short} of the {nights} scored nights had fewer than "
                  f"{TRACK_MIN_TICKERS} tickers with a return and are not judged (an IC of "
                  "3 takes four values; a t-test on them runs over its 5%)")
    if nights and not test.nights:
        if short == nights:
            return f"no night judged: {not_judged}"
        equal = (f"IC undefined on all {nights - short} {'other ' if short else ''}scored "
                 "nights: every night's scores (or returns) were all equal, so nothing was "
                 "ranked")
        return f"{equal}; {not_judged}" if short else equal
    said = _said(test, mean_ic)
    return f"{said}; {not_judged}" if short else said


def _said(test: IcTest, mean_ic: float | None) -> str:
    """Say what the judged nights show."""
    if test.withheld:
        return f"too few nights to judge: {test.nights} of the {test.needed} needed"
    t_stat, p_value = test.t_stat, test.p_value
    if t_stat is None or p_value is None:
        return f"every night the same IC ({mean_ic:+.2f}): no spread to test"
    level = f"at the {SIGNIFICANCE:.0%} level"
    if p_value >= SIGNIFICANCE:
        return f"no evidence {level} that the ratings predict returns (p {p_value:.2f})"
    shown = "p < 0.0001" if p_value < 1e-4 else f"p {p_value:.4f}"
    if t_stat > 0:
        return f"the ratings predicted returns: mean IC above 0 {level} ({shown})"
    return f"the ratings predicted returns backwards: mean IC below 0 {level} ({shown})"


def rating_record(rating: str, nights: Sequence[NightReturns]) -> RatingRecord:
    """Return one rating's scored record over the nights (module notes)."""
    values = [x for n in nights for r, x in zip(n.ratings, n.returns, strict=True)
              if r == rating]
    if len(values) < MIN_SCORED:
        return RatingRecord(rating, len(values), MIN_SCORED, None, None)
    hit = None
    if rating in BULLISH | BEARISH:
        hits, calls = directional_hits([rating] * len(values), values)
        hit = hits / calls
    return RatingRecord(rating, len(values), MIN_SCORED, hit, float(np.mean(values)))


def parse_horizons(text: str) -> list[int]:
    """Return the distinct horizons of ``5d,20d``, shortest first; InputError otherwise."""
    days = [parse_horizon(part) for part in text.split(",") if part.strip()]
    if not days:
        raise InputError(f"--horizon takes trading days like 5d,20d (got {text!r})")
    return sorted(set(days))


def providers(settings: Settings) -> Callable[[BatchGrades], DataProvider]:
    """Return each batch's data provider: the one it recorded, else the setting's (cached)."""
    built = functools.cache(lambda name: get_provider(name, settings.paths.data_dir))
    return lambda grades: built(grades.settings.data_provider or settings.agents.data_provider)


def track_nights(engine: Engine, *, nights: int | None = None,
                 since: date | None = None) -> list[int]:
    """Return the nights' batch ids in as-of order: the newest finished night of each date
    (``app.db.models.nights_newest_first``).

    ``since`` keeps the as-of dates on or after it; ``nights`` the last that many.
    InputError when there is none.
    """
    dated = [] if since is None else [Batch.as_of >= since]
    found = night_of_each_date(engine, Batch.status.in_(FINISHED_STATUSES), *dated)
    # The newest night's data only: a DEMO night's synthetic returns and market ones are two
    # records, not one (a demo run before the market nights, or between them).
    demo = [BatchSettings.read(n.settings).demo_data for n in found]
    ids = [n.id for n, d in zip(reversed(found), reversed(demo), strict=True) if d == demo[0]]
    if nights is not None:
        ids = ids[-nights:]
    if not ids:
        where = f" since {since}" if since else ""
        raise NoNightYet(f"no finished nightly batch{where}")
    return ids


def track_report(engine: Engine, batch_ids: Sequence[int], horizons: Sequence[int],
                 provider_for: Callable[[BatchGrades], DataProvider], *,
                 benchmark: str | None = None) -> TrackReport:
    """Return the track record of the given nights at each horizon (shortest first).

    InputError when the benchmark has no prices on any of the nights: every night would be
    pending for a reason no wait can fix.
    """
    loaded = [load_grades(engine, i) for i in batch_ids]
    longest = max(horizons)
    caches: dict[int, PriceCache] = {}

    def prices(grades: BatchGrades) -> PriceCache:
        provider = provider_for(grades)
        return caches.setdefault(id(provider), PriceCache(provider, longest))

    if benchmark and loaded:
        _check_benchmark(benchmark, loaded, prices)
    records = []
    for days in sorted(set(horizons)):
        usable, pending = [], {}
        for grades in loaded:
            night, why = _night_returns(grades, prices(grades), days, benchmark)
            if night is None:
                pending[grades.as_of.isoformat()] = why
            else:
                usable.append(night)
        usable, repeated = one_per_session(usable)
        records.append(horizon_record(usable, days, dict(sorted({**pending,
                                                                 **repeated}.items()))))
    base = records[0].mean_ic if records else None
    for record in records:
        if base and record.mean_ic is not None:
            record.decay = record.mean_ic / base
    return TrackReport(nights=len(loaded),
                       first=loaded[0].as_of.isoformat() if loaded else None,
                       last=loaded[-1].as_of.isoformat() if loaded else None,
                       benchmark=benchmark, horizons=records,
                       demo=any(g.settings.demo_data for g in loaded))


def _check_benchmark(benchmark: str, loaded: Sequence[BatchGrades],
                     prices: Callable[[BatchGrades], PriceCache]) -> None:
    """Raise InputError when the benchmark's prices cannot be read on any night."""
    error: DataError | None = None
    for grades in loaded:
        try:
            prices(grades).closes(benchmark, grades.as_of)
            return
        except DataError as failed:
            error = failed
    why = str(error).removeprefix(f"{benchmark}: ")
    raise InputError(f"benchmark {benchmark}: no prices on any of the {len(loaded)} nights "
                     f"({why})")


def _night_returns(grades: BatchGrades, prices: PriceCache, days: int,
                   benchmark: str | None) -> tuple[NightReturns | None, str]:
    """Return the night's tickers with a defined return, or None and why there are none."""
    bench = None
    if benchmark:
        try:
            bench = prices.forward_return(benchmark, grades.as_of, days)[2]
        except DataError as error:
            return None, f"benchmark {benchmark}: {str(error).removeprefix(benchmark + ': ')}"
        if bench is None:
            return None, f"benchmark {benchmark}: return undefined"
    rows, missing = ticker_returns(prices, grades, days, bench)
    kept, target = scored(rows)
    if not kept:
        reasons = sorted(set(missing.values())) or ["no ticker with a defined return"]
        return None, "; ".join(reasons[:2])
    kept_ids = {id(r) for r in kept}
    for row in rows:
        if id(row) not in kept_ids:
            missing[row.ticker] = (f"return undefined (close on {row.start} is not a "
                                   "positive finite price, or the close it ends on is not "
                                   "finite)")
    return NightReturns(grades.batch_id, grades.as_of.isoformat(), [r.rating for r in kept],
                        [r.score for r in kept], target, dict(sorted(missing.items())),
                        max(r.start for r in kept)), ""

"""Which arms a scheduler bench runs: the fixed-N sweep, and each adaptive arm's tail-off twin.

The sweep's rule: in its chain a ticker has one request at the server, of about the mean
chain request's prompt plus its output, so the server's KV cache holds ``n_kv = KV tokens ÷
that`` tickers' requests at once, and it runs at most ``max_num_seqs`` of them. The best
fixed-N is expected near ``n* = min(tickers, endpoints × min(max_num_seqs, n_kv))``
(docs/lab/scheduler-bench-method.md checks it against the H200 runs); the sweep runs
``n* × ½, ⅔, 1, 3/2, 2`` (rounded, below the ticker count, which is ``fixed-all``, always
run), and halves below its smallest until there are four.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from app.errors import InputError
from app.runs.replay import Workload
from app.traffic.admission import AdmissionPolicy
from app.traffic.budget import TokenBudget, prompt_bytes
from app.traffic.strategy import NUMBERS, POLICY_KNOBS, Knobs, Strategy

SWEEP = "sweep"  # in a list of arms: the fixed-N sweep
DEFAULT_ARMS = f"fixed-3,{SWEEP},fixed-all,adaptive"
FACTORS = (1 / 2, 2 / 3, 1.0, 3 / 2, 2.0)
MIN_POINTS = 4
# About four bytes a token in English text: the rule needs a size, not an exact count.
TOKENS_PER_BYTE = 0.25
FLOOD = "flood"
RULE = ("n* = min(tickers, endpoints x min(max_num_seqs, KV tokens / mean chain request "
        "tokens (prompt + max output))); sizes n* x 1/2, 2/3, 1, 3/2, 2 below the ticker "
        "count, halved below the smallest until four; fixed-all beside them")


@dataclass
class Sweep:
    """The fixed-N sizes a bench runs and what they were chosen from."""

    sizes: list[int]
    n_star: int
    tickers: int
    endpoints: int
    kv_tokens: int | None
    max_num_seqs: int | None
    chain_request_tokens: float  # mean prompt + output of a request in a ticker's chain
    n_kv: int | None  # chain requests the KV cache holds at once (None: capacity unknown)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "rule": RULE}


def chain_request_tokens(workload: Workload) -> float:
    """Return the mean size (prompt + max output, in tokens) of a request that has dependencies.

    Requests without any (the analysts) are side by side only at a ticker's start; with none
    at all the mean of every request is used.
    """
    items = [i for v in workload.values() for i in v]
    chained = [i for i in items if i.deps] or items
    if not chained:
        return 0.0
    return sum(prompt_bytes(i.body) * TOKENS_PER_BYTE + int(i.body.get("max_tokens") or 0)
               for i in chained) / len(chained)


def sweep(workload: Workload, kv_tokens: int | None, max_num_seqs: int | None,
          endpoints: int = 1) -> Sweep:
    """Choose the fixed-N sizes around the expected best (the module's rule)."""
    tickers = len(workload)
    size = chain_request_tokens(workload)
    n_kv = int(kv_tokens // size) if kv_tokens and size > 0 else None
    per_endpoint = min(x for x in (max_num_seqs, n_kv) if x) if (max_num_seqs or n_kv) else None
    # Neither known: the middle of the range, so the sweep still brackets something.
    n_star = min(tickers, endpoints * per_endpoint) if per_endpoint else max(1, tickers // 2)
    n_star = max(1, n_star)
    sizes = sorted({n for f in FACTORS if 1 <= (n := round(n_star * f)) < tickers})
    while len(sizes) < MIN_POINTS and sizes and sizes[0] > 1:
        sizes.insert(0, max(1, sizes[0] // 2))
    if not sizes and tickers > 1:
        sizes = [max(1, tickers // 2)]
    return Sweep(sizes, n_star, tickers, endpoints, kv_tokens, max_num_seqs, round(size, 1),
                 n_kv)


def split_arms(text: str) -> list[str]:
    """Split a comma-separated list of arms, keeping an arm's knobs together.

    ``adaptive:prefetch=off,tail=off,fixed-8:tail=on`` is two arms: a ``key=value`` part
    after an arm with knobs is one more of its knobs.
    """
    arms: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "=" in part and ":" not in part and arms and ":" in arms[-1]:
            arms[-1] += "," + part
        else:
            arms.append(part)
    return arms


def tail_off(arm: str) -> str | None:
    """Return an adaptive arm's twin with the tail rule off (None: not adaptive, or off)."""
    if arm != "adaptive" and not arm.startswith("adaptive:"):
        return None
    if not Strategy.parse(arm).tail:
        return None
    return arm + (",tail=off" if ":" in arm else ":tail=off")


def check_arms(text: str) -> list[str]:
    """Return the arms written, each name read (InputError for a typo or an empty list):
    a bench refuses a misspelt arm before it asks any server anything."""
    arms = split_arms(text)
    for arm in arms:
        if arm.partition(":")[0] in (SWEEP, FLOOD) and arm not in (SWEEP, FLOOD):
            # Strategy's "unknown strategy" would not name either as an arm at all.
            raise InputError(f"{arm.partition(':')[0]} takes no knobs (got {arm!r}); give the "
                             "fixed-N arms with theirs, e.g. fixed-15:tail=on")
        if arm not in (SWEEP, FLOOD):
            Strategy.parse(arm)
    if not arms:
        raise InputError("no arms to run: --strategies is empty")
    return arms


def plan_arms(text: str, workload: Workload, kv_tokens: int | None,
              max_num_seqs: int | None, endpoints: int = 1) -> tuple[list[str], Sweep | None]:
    """Return the arms to run, in order, and the sweep when ``sweep`` was among them.

    ``sweep`` becomes its ``fixed-N`` arms (those not listed already); every adaptive arm
    with the tail rule on is followed by its twin with it off, unless that is listed, so
    what the tail rule earns is measured in the same run. A typo is refused here, before
    any arm runs.
    """
    arms = check_arms(text)
    chosen: Sweep | None = None
    planned: list[str] = []
    for arm in arms:
        if arm == SWEEP:
            chosen = sweep(workload, kv_tokens, max_num_seqs, endpoints)
            planned += [f"fixed-{n}" for n in chosen.sizes
                        if f"fixed-{n}" not in arms and f"fixed-{n}" not in planned]
            continue
        if not any(_same(arm, other) for other in planned):
            planned.append(arm)
    for arm in list(planned):
        twin = tail_off(arm)
        if twin is not None and not any(_same(twin, other) for other in planned):
            planned.insert(planned.index(arm) + 1, twin)
    return planned, chosen


def _same(a: str, b: str) -> bool:
    """Return True when two arm names are one strategy (``canonical_arm``)."""
    return canonical_arm(a) == canonical_arm(b)


def knob_defaults() -> dict[str, dict[str, Any]]:
    """Return the knob values an arm's name leaves out, by kind (``adaptive``, ``fixed``),
    as this code runs them; a bench writes them with its figures. ``maximum`` is none:
    the caller's cap sets it."""
    adaptive = {"tail": "on", "prefetch": "on",
                **{k: getattr(AdmissionPolicy, k) for k in POLICY_KNOBS if k != "maximum"},
                **{k: getattr(TokenBudget, k.removeprefix("budget_")) for k in NUMBERS
                   if k not in POLICY_KNOBS}}
    return {"adaptive": adaptive, "fixed": {"tail": "off", "prefetch": "off"}}


# What is known of the defaults of a file that records none: a fixed count's tail and
# prefetch have been off where not written since each knob came (c0da37b, 6b07d23);
# adaptive's have changed (prefetch), and which applied is not known.
OLDER_DEFAULTS: dict[str, dict[str, Any]] = {"fixed": {"tail": "off", "prefetch": "off"}}


def canonical_arm(name: str, defaults: dict[str, dict[str, Any]] | None = None) -> str:
    """Return one name per arm: its knobs in ``Knobs``' order, those at today's default left
    out (``fixed-15:tail=off`` is ``fixed-15``).

    ``defaults`` are the knob defaults of the code that ran the arm (``knob_defaults``, as
    its file records them; None: this code's): a knob left out then but set otherwise today
    is written in. Where they do not give its kind (``OLDER_DEFAULTS``' adaptive) the knobs
    are kept as written, only ordered. A name no strategy has today is kept as it is.
    """
    if name in (SWEEP, FLOOD):
        return name
    try:
        strategy = Strategy.parse(name)
    except InputError:
        return name
    base, _, knobs = name.partition(":")
    written = Knobs.model_validate(dict(k.partition("=")[::2] for k in knobs.split(",") if k)
                                   ).model_dump(exclude_none=True)
    kind = "adaptive" if strategy.adaptive else "fixed"
    today = knob_defaults()[kind]
    then = today if defaults is None else defaults.get(kind)
    kept = written if then is None else {
        k: v for k, v in {**then, **written}.items() if k in Knobs.model_fields
        and (k not in today or v != today[k])}
    parts = [f"{k}={_knob(kept[k])}" for k in Knobs.model_fields if k in kept]
    return base + (":" + ",".join(parts) if parts else "")


def _knob(value: Any) -> str:
    """Write a knob's value as a name does: 0.95, 8, on (a whole float without its .0)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)

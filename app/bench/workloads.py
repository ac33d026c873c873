"""Build the scheduler bench's workloads: the seeds' per-node shape, scaled, or a recorded batch."""

from __future__ import annotations

import random
from dataclasses import dataclass

from app.config import Settings
from app.runs.replay import WorkItem, Workload

ANALYSTS = ("market", "sentiment", "news", "fundamentals")
DOWNSTREAM = (
    "bull_r1", "bear_r1", "bull_r2", "bear_r2", "research_manager", "trader",
    "aggressive_r1", "conservative_r1", "neutral_r1", "aggressive_r2", "conservative_r2",
    "neutral_r2", "portfolio_manager",
)
# The seeds' shape at scale 1: analysts read ~4k tokens of data each; downstream prompts
# carry the four reports plus a growing debate, ramping from 6k to 20k. That averages
# ≈11k in per call (188k per ticker) with 1.5k out each, and decode dominates as in the seeds.
ANALYST_PROMPT = 4_000
DOWNSTREAM_FIRST, DOWNSTREAM_LAST = 6_000, 20_000
OUTPUT = 1_500

# Common one-token English words, so a prompt of N words is close to N tokens.
WORDS = (  # noqa: SIM905 (a word list reads better as prose)
    "the of and to in is was for on are as with his they at be this from have or by one "
    "had not but what all were when we there can an your which their said if do will each "
    "about how up out them then she many some so these would other into has more her two "
    "like him see time could no make than first been its who now people my made over did "
    "down only way find use may water long little very after words called just where most "
    "know get through back much before go good new write our used me man too any day same "
    "right look think also around another came come work three word must because does part"
).split()


@dataclass(frozen=True)
class Shape:
    """One node's size at scale 1."""

    node: str
    prompt: int
    output: int


def seed_shape() -> list[Shape]:
    """Return the 17 nodes' prompt and output sizes at scale 1, in graph order."""
    step = (DOWNSTREAM_LAST - DOWNSTREAM_FIRST) / (len(DOWNSTREAM) - 1)
    return [Shape(n, ANALYST_PROMPT, OUTPUT) for n in ANALYSTS] + [
        Shape(n, round(DOWNSTREAM_FIRST + i * step), OUTPUT) for i, n in enumerate(DOWNSTREAM)
    ]


def seed_graph() -> list[tuple[Shape, list[str]]]:
    """Return the 17 nodes with the nodes each waits for: analysts side by side, then the
    downstream chain, each after every analyst and the node before it."""
    graph: list[tuple[Shape, list[str]]] = []
    previous: list[str] = []
    for shape in seed_shape():
        if shape.node in ANALYSTS:
            graph.append((shape, []))
        else:
            graph.append((shape, list(ANALYSTS) + previous[-1:]))
            previous.append(shape.node)
    return graph


def fit_scale(max_model_len: int, margin: float = 0.9) -> float:
    """Return the largest scale at which the longest prompt plus its output fits."""
    longest = max(s.prompt + s.output for s in seed_shape())
    return min(1.0, margin * max_model_len / longest)


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, words)))


def synthetic_workload(settings: Settings, tickers: int, scale: float,
                       output_scale: float | None = None) -> Workload:
    """Build ``tickers`` tickers of 17 requests shaped like the seeds', scaled down.

    Downstream prompts open with the ticker's shared context (its analyst reports) in the
    same words, as the real pipeline's do, so a prefix cache can share it; analysts run in
    parallel and each downstream node waits for the one before it. Outputs are fixed with
    ``ignore_eos`` so every strategy decodes exactly the same number of tokens.
    """
    out_scale = scale if output_scale is None else output_scale
    workload: Workload = {}
    for t in range(tickers):
        ticker = f"SYN{t:03d}"
        rng = random.Random(f"{ticker}-shape")
        shared = f"Instrument {ticker}. " + _text(rng, round(DOWNSTREAM_FIRST * scale * 0.8))
        items: list[WorkItem] = []
        for shape, deps in seed_graph():
            prompt_words = round(shape.prompt * scale)
            if shape.node in ANALYSTS:
                user = f"Instrument {ticker}. {shape.node} data: " + _text(rng, prompt_words)
            else:
                extra = max(1, prompt_words - len(shared.split()))
                user = shared + f"\n\nRole {shape.node}: " + _text(rng, extra)
            body = {
                "model": settings.llm.model,
                "messages": [{"role": "system", "content": "You are a financial analyst."},
                             {"role": "user", "content": user}],
                "max_tokens": max(1, round(shape.output * out_scale)),
                "temperature": settings.sampling.temperature,
                "top_p": settings.sampling.top_p,
                "seed": rng.randrange(2**31),
                "extra_body": {"ignore_eos": True, "top_k": settings.sampling.top_k},
            }
            items.append(WorkItem(ticker, 0, shape.node, body, deps))
        workload[ticker] = items
    return workload

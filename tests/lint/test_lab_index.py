"""Check that docs/lab/README.md (the lab notebook's index) links every note in docs/lab/, and
names none that is not there: a dated note the index leaves out cannot be found from the
docs that cite the notebook."""

from __future__ import annotations

import re
from pathlib import Path

LAB = Path(__file__).resolve().parents[2] / "docs" / "lab"
LINK = re.compile(r"\]\(([^)#]+\.md)\)")


def test_the_lab_index_links_every_note_and_only_notes_that_exist() -> None:
    linked = set(LINK.findall((LAB / "README.md").read_text()))
    notes = {p.name for p in LAB.glob("*.md")} - {"README.md"}
    assert not notes - linked, f"docs/lab/README.md leaves out: {sorted(notes - linked)}"
    assert not linked - notes, f"docs/lab/README.md links no such note: {sorted(linked - notes)}"

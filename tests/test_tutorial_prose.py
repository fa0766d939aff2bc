"""Tutorial and gallery prose that quotes a figure agrees with the outputs stored under it (nbval then checks
that the outputs are what a fresh run prints), and it points at tutorials that exist.

- a cycle count in the text ("18232 cycles") is printed by a cell of the same notebook;
- a bound stated in bold ("**bound: vector compute**") is the bound a cell's stats name;
- a tutorial it names (`02_passes.ipynb`) exists, and is not announced as "coming".
"""
import json
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
TUTORIALS = sorted((REPO / "tutorials").glob("[0-9][0-9]_*.ipynb"))
GALLERY = sorted((REPO / "notebooks").glob("*.ipynb"))
NOTEBOOKS = TUTORIALS + GALLERY


def cells(path):
    nb = json.loads(path.read_text())
    for c in nb["cells"]:
        yield c["cell_type"], "".join(c["source"]), c.get("outputs", [])


def outputs_text(path) -> str:
    parts = []
    for kind, _, outs in cells(path):
        for o in outs:
            if "text" in o:
                parts.append("".join(o["text"]))
            for mime, v in o.get("data", {}).items():
                if mime in ("text/plain", "text/html"):
                    parts.append("".join(v) if isinstance(v, list) else v)
    return re.sub(r"\s+", " ", "\n".join(parts))


def prose(path) -> str:
    return "\n".join(src for kind, src, _ in cells(path) if kind == "markdown")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_cycle_counts_in_the_text_are_printed_by_the_notebook(path):
    out = outputs_text(path)
    printed = {int(n.replace(",", "")) for n in re.findall(r"\b\d[\d,]*\b", out)}
    # a count, not a rate ("264 cycles per DMA", "2 cycles a repeat": model constants)
    quoted = [int(n.replace(",", "")) for n in
              re.findall(r"\b(\d[\d,]{2,})\s+cycles\b(?!\s+(?:per|a)\b)", prose(path))]
    missing = [n for n in quoted if n not in printed]
    assert not missing, f"{path.name} quotes {missing} cycles, which none of its outputs prints"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_bound_stated_in_bold_is_the_one_the_stats_name(path):
    out = outputs_text(path)
    named = set(re.findall(r"\bbound:? (HBM bandwidth|vector compute|cube compute|dependencies|\w+ pipe)\b", out))
    for claim in re.findall(r"\*\*bound: ([^*]+)\*\*", prose(path)):
        assert claim in named, f"{path.name} says bound: {claim}; its outputs name {sorted(named)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_tutorials_it_names_exist(path):
    text = prose(path)
    names = {p.name for p in NOTEBOOKS}
    for ref in re.findall(r"\b(\d\d_\w+\.ipynb)\b", text):
        assert ref in names, f"{path.name} points at {ref}, which does not exist"
        assert not re.search(re.escape(ref) + r"`?\s*\(coming\)", text), f"{path.name} calls {ref} 'coming'"


def test_the_gallery_is_there_and_each_notebook_has_a_title():
    assert len(GALLERY) >= 8, [p.name for p in GALLERY]
    for path in GALLERY:
        kind, first, _ = next(cells(path))
        assert kind == "markdown" and first.startswith("# Gallery · "), path.name

"""The built-in default data: enough tenants, labels and examples, deterministic, with real cues."""

from __future__ import annotations

from collections import Counter, defaultdict

from cockpit.data.chat import render_answer
from cockpit.data.tenants import TENANTS, generate


def test_tenants_and_label_sets() -> None:
    assert len(TENANTS) >= 5
    for tenant in TENANTS:
        assert 3 <= len(tenant.labels) <= 6, tenant.name
    assert len({t.name for t in TENANTS}) == len(TENANTS)


def test_generation_is_deterministic_and_sized() -> None:
    a = generate(7, 200, 30)
    assert a == generate(7, 200, 30)
    assert a != generate(8, 200, 30)
    counts = Counter((e["tenant"], e["split"]) for e in a)
    for tenant in TENANTS:
        assert counts[(tenant.name, "train")] == 200 and counts[(tenant.name, "eval")] == 30
    assert len({e["id"] for e in a}) == len(a), "ids are unique"


def test_every_label_occurs_and_answers_end_with_the_label() -> None:
    by_tenant: dict[str, set[str]] = defaultdict(set)
    for e in generate(0, 200, 0):
        by_tenant[e["tenant"]].add(e["gold"])
        assert e["gold"] in e["labels"]
        assert "[[" in e["user"] and "]]" in e["user"]
        assert render_answer(e["reasoning"], e["gold"]).endswith("\n</think>\n\n" + e["gold"])
    for tenant in TENANTS:
        assert by_tenant[tenant.name] == {lab.name for lab in tenant.labels}


def test_the_marked_entity_carries_its_label_form() -> None:
    """The task is learnable: the marked entity's form belongs to its gold label."""
    forms = {(t.name, lab.name): lab.forms for t in TENANTS for lab in t.labels}
    for e in generate(0, 50, 0):
        marked = e["user"].split("[[", 1)[1].split("]]", 1)[0]
        patterns = forms[(e["tenant"], e["gold"])]
        assert any(
            marked.startswith(f.split("{}")[0]) and marked.endswith(f.split("{}")[1]) for f in patterns
        )

"""A generated multi-tenant entity-classification data set with reasoning traces.

Each tenant has its own kind of document and its own label set. Every example marks one entity in a
document with `[[ ]]`; the answer is a short reasoning trace and then the label. The cues are real:
each label has its own context phrases and its own word endings, so a model can learn the task, and
an untrained model cannot guess it. Deterministic for a given seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SYLLABLES = (
    "ka",
    "lo",
    "mi",
    "ren",
    "tas",
    "vo",
    "qui",
    "bel",
    "dor",
    "fen",
    "gal",
    "hur",
    "ith",
    "jo",
    "kel",
    "mar",
    "nis",
    "or",
    "pel",
    "ros",
    "sul",
    "tor",
    "ul",
    "vex",
    "wyn",
    "zan",
    "bra",
    "cor",
    "dra",
    "el",
)
DISTRACTOR_RATE = 0.3
NEUTRAL_CUES = ("regarding", "mentions", "noted", "about", "see also")


@dataclass(frozen=True)
class LabelSpec:
    """One label of a tenant: how its entities look, the phrases that introduce them, what they are."""

    name: str
    description: str
    cues: tuple[str, ...]
    forms: tuple[str, ...]  # "{}" is replaced by a generated stem


@dataclass(frozen=True)
class TenantSpec:
    """One tenant: its document style and label set."""

    name: str
    doc_kind: str
    header: str  # "{n}" is a document number, "{d}" a date
    fillers: tuple[str, ...]
    labels: tuple[LabelSpec, ...]


TENANTS: tuple[TenantSpec, ...] = (
    TenantSpec(
        "northwind",
        "shipping notices",
        "SHIPPING NOTICE {n} / {d}",
        ("Customs papers are attached.", "Temperature log was normal.", "Seal numbers match the manifest."),
        (
            LabelSpec(
                "CARRIER",
                "transport carrier",
                ("handled by", "trucked by", "carrier is"),
                ("{} Freight", "{} Haulage", "{} Lines"),
            ),
            LabelSpec(
                "PORT",
                "port of call",
                ("arrived at", "discharged at", "port of"),
                ("{}haven", "{}port", "{}mouth"),
            ),
            LabelSpec(
                "CONSIGNEE",
                "receiving company",
                ("deliver to", "consigned to", "receiver is"),
                ("{} Ltd", "{} GmbH", "{} Corp"),
            ),
            LabelSpec("VESSEL", "ship", ("aboard", "loaded onto", "vessel is"), ("MV {}", "SS {}")),
        ),
    ),
    TenantSpec(
        "helix",
        "clinical notes",
        "CLINIC NOTE {n} ({d})",
        ("Vitals stable.", "Patient tolerated the visit well.", "Follow up in two weeks."),
        (
            LabelSpec(
                "DRUG", "medication", ("prescribed", "started on", "continue"), ("{}mab", "{}pril", "{}zole")
            ),
            LabelSpec(
                "CONDITION",
                "diagnosis",
                ("diagnosed with", "history of", "presents with"),
                ("{}itis", "{}osis", "{}emia"),
            ),
            LabelSpec(
                "PROCEDURE",
                "procedure",
                ("underwent", "scheduled for", "recovering from"),
                ("{}ectomy", "{}oscopy", "{}plasty"),
            ),
            LabelSpec(
                "CLINICIAN", "clinician", ("seen by", "referred to", "attending is"), ("Dr. {}", "Nurse {}")
            ),
            LabelSpec(
                "ALLERGEN",
                "allergen",
                ("allergic to", "reaction to", "must avoid"),
                ("{} pollen", "{} dander", "{}nut"),
            ),
        ),
    ),
    TenantSpec(
        "ledger",
        "bank messages",
        "ACCOUNT MESSAGE {n} - {d}",
        ("No action is needed.", "Contact us if this was not you.", "Balance updated overnight."),
        (
            LabelSpec(
                "MERCHANT",
                "merchant",
                ("purchase at", "card used at", "charged by"),
                ("{} Market", "{} Cafe", "{} Store"),
            ),
            LabelSpec(
                "ACCOUNT",
                "account",
                ("debited from", "account named", "credited to"),
                ("{} Savings", "{} Checking"),
            ),
            LabelSpec("BENEFICIARY", "payee", ("transfer to", "paid to", "payee is"), ("Mr. {}", "Ms. {}")),
        ),
    ),
    TenantSpec(
        "lexis",
        "contracts",
        "AGREEMENT {n}, dated {d}",
        (
            "All notices must be in writing.",
            "Headings are for convenience only.",
            "This clause survives termination.",
        ),
        (
            LabelSpec(
                "PARTY",
                "contracting party",
                ("between", "entered by", "obligations of"),
                ("{} LLC", "{} plc", "{} Holdings"),
            ),
            LabelSpec(
                "COURT",
                "court",
                ("filed in", "venue is", "jurisdiction of"),
                ("{} District Court", "High Court of {}"),
            ),
            LabelSpec(
                "STATUTE",
                "law",
                ("pursuant to", "as defined in", "compliant with"),
                ("{} Act", "{} Code", "{} Directive"),
            ),
            LabelSpec(
                "TERM",
                "defined term",
                ("hereinafter", "referred to as", "means the"),
                ("the {} Period", "the {} Fee"),
            ),
        ),
    ),
    TenantSpec(
        "orbit",
        "support tickets",
        "TICKET {n} opened {d}",
        ("Customer was polite.", "Escalation not needed.", "Auto-reply was sent."),
        (
            LabelSpec(
                "PRODUCT", "product", ("bought a", "model", "unit of"), ("{} Blender", "{} Kettle", "{} Lamp")
            ),
            LabelSpec("STORE", "store", ("picked up at", "bought in", "branch"), ("{} Mall", "{} Outlet")),
            LabelSpec(
                "ISSUE",
                "problem",
                ("complains of", "reports", "problem is"),
                ("{} leak", "{} crack", "{} noise"),
            ),
            LabelSpec(
                "CUSTOMER",
                "customer",
                ("customer", "caller is", "account holder"),
                ("{} Smith", "{} Jones", "{} Brown"),
            ),
            LabelSpec(
                "COURIER", "courier", ("shipped via", "courier is", "delivered by"), ("{}Express", "{}Post")
            ),
            LabelSpec(
                "PAYMENT",
                "payment method",
                ("paid with", "refund to", "charged on"),
                ("{} Card", "{} Wallet", "{} Voucher"),
            ),
        ),
    ),
)


def _stem(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def _entity(rng: random.Random, label: LabelSpec) -> tuple[str, str]:
    form = rng.choice(label.forms)
    stem = _stem(rng)
    return form.format(stem), form.replace("{}", "").strip()


def _date(rng: random.Random) -> str:
    return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def make_example(rng: random.Random, tenant: TenantSpec, index: int, split: str) -> dict:
    """One document with one marked entity, its reasoning trace and its gold label."""
    label = rng.choice(tenant.labels)
    entity, marker = _entity(rng, label)
    use_cue = rng.random() < 0.7
    cue = rng.choice(label.cues) if use_cue else rng.choice(NEUTRAL_CUES)
    other = rng.choice([lab for lab in tenant.labels if lab is not label])
    other_entity, _ = _entity(rng, other)
    target = f"The note {cue} [[{entity}]]."
    distractor = f"It also lists {other_entity}."
    body = [target, rng.choice(tenant.fillers)]
    if rng.random() < DISTRACTOR_RATE:
        body.append(distractor)
    rng.shuffle(body)
    document = tenant.header.format(n=rng.randint(1000, 9999), d=_date(rng)) + "\n" + " ".join(body)
    labels = [lab.name for lab in tenant.labels]
    user = f"{document}\n\nWhich label fits the entity marked [[ ]]? Labels: {', '.join(labels)}."
    if use_cue:
        reasoning = f"This is a {label.description}: in {tenant.doc_kind}, '{cue}' introduces one."
    else:
        reasoning = f"This is a {label.description}: the entity ends in '{marker}'."
    return {
        "tenant": tenant.name,
        "id": f"{tenant.name}-{split}-{index:05d}",
        "split": split,
        "system": f"You label entities in {tenant.doc_kind} for tenant {tenant.name}.",
        "user": user,
        "labels": labels,
        "gold": label.name,
        "reasoning": reasoning,
    }


def generate(seed: int, train_per_tenant: int, eval_per_tenant: int) -> list[dict]:
    """All examples of all tenants, train split then eval split, deterministic for `seed`."""
    examples: list[dict] = []
    for t_index, tenant in enumerate(TENANTS):
        for split, count in (("train", train_per_tenant), ("eval", eval_per_tenant)):
            rng = random.Random(f"{seed}-{t_index}-{split}")
            examples.extend(make_example(rng, tenant, i, split) for i in range(count))
    return examples

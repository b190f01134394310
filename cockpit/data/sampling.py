"""A sample of the held-out split, for an evaluation that may not score all of it (`eval.examples`,
`eval.time_budget_s`; `cockpit eval --examples N --time-budget 20m`).

The held-out examples are put in one order, a pure function of their (tenant, id) keys and a seed:
each tenant's examples shuffled by a generator seeded with the seed and the tenant's name, and the tenants
interleaved by Adams' divisor method: the next example is the tenant's with the most examples per example
already taken (N_t / taken_t; one not yet taken comes first). So every prefix of the order is a stratified
random sample: each tenant that has examples has one as soon as the prefix holds one a tenant, and no
tenant has more than its share rounded up (Adams' method never exceeds the upper quota). A sample of n is
the order's first n; a time budget cuts that sample after a batch, which is again a prefix. Every system is
scored on the same examples (`Shared`): the first in full or until its share of the budget runs out, every
later one on the examples the first finished, so the deltas stay paired.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Generic, TypeVar

Key = tuple[str, str]  # (tenant, id)
T = TypeVar("T")
EXAMPLES = "examples"  # why fewer than all were scored: a sample was asked for
BUDGET = "time budget"  # or the time budget ran out


def _rng(seed: int, name: str) -> random.Random:
    return random.Random(f"cockpit-sample:{seed}:{name}")  # a str seed hashes the same in every process


def stratified_order(keys: Sequence[Key], seed: int) -> list[int]:
    """Indices into `keys` in the order to score them: every prefix a stratified random sample."""
    by_tenant: dict[str, list[int]] = defaultdict(list)
    for i, (tenant, _) in enumerate(keys):
        by_tenant[tenant].append(i)
    queues = {}
    for tenant, indices in by_tenant.items():
        indices.sort(key=lambda i: (str(keys[i][1]), i))  # the input's order does not matter
        _rng(seed, tenant).shuffle(indices)
        queues[tenant] = indices
    tenants = sorted(queues)
    tie = {t: rank for rank, t in enumerate(_rng(seed, "").sample(tenants, len(tenants)))}
    # Smallest first: a tenant not yet taken, then the most examples per example taken, then the tie rank.
    heap: list[tuple[int, Fraction, int, str]] = [(0, Fraction(0), tie[t], t) for t in tenants]
    heapq.heapify(heap)
    taken: Counter[str] = Counter()
    order: list[int] = []
    while heap:
        _, _, rank, tenant = heapq.heappop(heap)
        order.append(queues[tenant][taken[tenant]])
        taken[tenant] += 1
        size = len(queues[tenant])
        if taken[tenant] < size:
            heapq.heappush(heap, (1, -Fraction(size, taken[tenant]), rank, tenant))
    return order


def tenant_counts(keys: Sequence[Key], scored: Sequence[Key]) -> dict[str, list[int]]:
    """Each tenant's [scored, held out] examples."""
    held, done = Counter(t for t, _ in keys), Counter(t for t, _ in scored)
    return {t: [done[t], n] for t, n in sorted(held.items())}


@dataclass(frozen=True)
class Sample:
    """The examples to score, in order (indices into the held-out split), and how they were chosen."""

    order: tuple[int, ...]
    population: int
    requested: int | None  # the sample asked for; None: all
    seed: int

    @property
    def by(self) -> list[str]:
        """Why fewer than all are scored: `[EXAMPLES]` for a sample smaller than the split, else none."""
        return [EXAMPLES] if len(self.order) < self.population else []


def draw(keys: Sequence[Key], n: int | None, seed: int) -> Sample:
    """The first `n` of the stratified order (all for None or n past the split); never fewer than one a
    tenant, so `n` under the number of tenants is raised to it."""
    order = stratified_order(keys, seed)
    tenants = len({t for t, _ in keys})
    size = len(order) if n is None else min(len(order), max(n, tenants))
    return Sample(tuple(order[:size]), len(keys), n, seed)


class Deadline:
    """Whether another batch fits in `seconds`, asked before each batch: the first always does; a later one
    when the time so far plus a batch at the mean pace so far stays within the budget. `cut` says whether
    it said no."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self.clock = seconds, clock
        self.start: float | None = None
        self.batches = 0
        self.cut = False

    def __call__(self) -> bool:
        now = self.clock()
        if self.start is None:
            self.start = now
            return True
        self.batches += 1
        spent = now - self.start
        if spent + spent / self.batches > self.seconds:
            self.cut = True
        return not self.cut


class Shared(Generic[T]):
    """The examples each system scores. With no time budget: the whole sample, for every system. With
    one: the first system scored gets 1/`systems` of it and scores the sample in order until it runs out;
    every later system scores exactly the examples the first finished (not cut again: the deltas need the
    same examples), so the budget holds where the systems score at about the same pace."""

    def __init__(
        self,
        examples: list[T],
        key: Callable[[T], Key],
        budget_s: float | None,
        systems: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.examples, self.key, self.budget_s = examples, key, budget_s
        self.systems, self.clock = max(1, systems), clock
        self.finished: set[Key] | None = None
        self.deadline: Deadline | None = None

    def next(self) -> tuple[list[T], Deadline | None]:
        """The examples for the next system, and the deadline that may cut them (the first system's)."""
        if self.finished is None:
            if self.budget_s:
                self.deadline = Deadline(self.budget_s / self.systems, self.clock)
            return self.examples, self.deadline
        return [e for e in self.examples if self.key(e) in self.finished], None

    def scored(self, keys: Sequence[Key]) -> None:
        """The keys a system scored: the first's set every later one's."""
        if self.finished is None:
            self.finished = set(keys)

    @property
    def cut(self) -> bool:
        """Whether the time budget cut the sample short."""
        return self.deadline is not None and self.deadline.cut


def sample_meta(
    keys: Sequence[Key], scored: Sequence[Key], sample: Sample, budget_s: float | None, cut: bool
) -> dict[str, Any]:
    """What a predictions file says of its examples: how many of how many, each tenant's, and why."""
    return {
        "scored": len(scored),
        "population": len(keys),
        "requested": sample.requested,
        "time_budget_s": budget_s,
        "by": sample.by + ([BUDGET] if cut else []),
        "seed": sample.seed,
        "tenants": tenant_counts(keys, scored),
    }

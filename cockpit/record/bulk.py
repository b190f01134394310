"""Reading a whole record at once, fast: the path a viewer takes to open a long run.

Same answers as `EventTail` (whole lines only, torn last line left for later, a damaged line before
the end a `RecordError` naming file and line, or counted when not `strict`),
but the many step and telemetry lines come back as numeric columns (`Block`s, see `columns.py`)
instead of one dict each. Everything else (phases, the audit, checkpoints, notes) comes back as
ordinary events. Files are read in chunks, so memory stays bounded whatever their size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cockpit.record import schema
from cockpit.record.columns import parse_uniform
from cockpit.record.format import jsonl_files
from cockpit.record.reader import Event, bad_line_error, first_bad_line
from cockpit.record.reader import parse_lines as json_events

FAST_KINDS = ("step", "telemetry")
CHUNK_BYTES = 2 * 2**20
MIN_FAST_LINES = 64  # below this, json is as quick and simpler


@dataclass
class Block:
    """Rows of one kind from one writer (and one rank), as columns; `t` is sorted."""

    kind: str
    rank: int | None
    columns: dict[str, np.ndarray]

    @property
    def t(self) -> np.ndarray:
        return self.columns["t"]

    def __len__(self) -> int:
        return len(self.columns["t"])


@dataclass
class FileChunk:
    """What one chunk of one file held, and the offset just past its last whole line."""

    blocks: list[Block]
    events: list[Event]
    offset: int
    bad_lines: int
    next_line: int = 1  # the file's line number at `offset`


# What the fold reads from step events of ranks other than 0 (their memory); rank 0's are all kept.
_OTHER_RANK_STEP = ("t", "step")


def _slim(block: Block) -> Block:
    """Drop the columns no fold reads, so long records cost less memory."""
    if block.kind != "step" or not block.rank:
        return block
    keep = {k: v for k, v in block.columns.items() if k in _OTHER_RANK_STEP or k.endswith("_mib")}
    return Block(block.kind, block.rank, keep)


def _blocks_from_columns(kind: str, columns: dict[str, np.ndarray]) -> list[Block]:
    t = columns["t"]
    if len(t) > 1 and np.any(np.diff(t) < 0):  # a clock step back: keep the block sorted
        order = np.argsort(t, kind="stable")
        columns = {k: v[order] for k, v in columns.items()}
    rank = columns.get("rank")
    if rank is None:
        return [Block(kind, None, columns)]
    blocks = []
    for r in np.unique(rank):
        if np.isnan(r):
            continue
        mask = rank == r
        cols = columns if mask.all() else {k: v[mask] for k, v in columns.items()}
        blocks.append(_slim(Block(kind, int(r), cols)))
    return blocks


def _columns_typed(kind: str, columns: dict[str, np.ndarray]) -> bool:
    """Whether numeric columns hold what `record.schema` types their fields as: whole numbers where it
    wants them, a finite time, every required field, and no number where text, a flag or an object
    belongs. (Nulls are NaN here; a non-finite word never takes this path.)"""
    fields = {**schema.HEADER, **schema.EVENTS.get(kind, {})}
    for name, spec in fields.items():
        if isinstance(spec, schema.Required) and name != "kind" and name not in columns:
            return False
    for name, values in columns.items():
        spec = fields.get(name.split("[", 1)[0])
        if spec is None:
            continue
        required = isinstance(spec, schema.Required)
        kind_of = spec.type if isinstance(spec, schema.Required) else spec
        if kind_of in (schema.NUMBER, schema.NUMBERS):
            continue
        if kind_of not in (schema.INT, schema.TIME):
            return False
        present = ~np.isnan(values)
        if (required or kind_of is schema.TIME) and not present.all():
            return False
        if np.any(values[present] != np.floor(values[present])) and kind_of is schema.INT:
            return False
    return True


def _parse_fast(kind: str, lines: list[bytes]) -> tuple[list[Block], list[Event], int]:
    """Columns where the layout allows, json for the rest (halving the lines to isolate odd ones)."""
    if len(lines) < MIN_FAST_LINES:
        events, bad = json_events(lines)
        return [], events, bad
    columns = parse_uniform(lines)
    if columns is not None and not _columns_typed(kind, columns):
        events, bad = json_events(lines)  # a field of the wrong type: find its line, the slow way
        return [], events, bad
    if columns is not None:
        return _blocks_from_columns(kind, columns), [], 0
    half = len(lines) // 2
    b1, e1, bad1 = _parse_fast(kind, lines[:half])
    b2, e2, bad2 = _parse_fast(kind, lines[half:])
    return b1 + b2, e1 + e2, bad1 + bad2


def parse_lines(lines: list[bytes]) -> tuple[list[Block], list[Event], int]:
    """Whole lines of one file: blocks for the fast kinds, events for the rest, and the bad line count."""
    blocks: list[Block] = []
    rest = lines
    events: list[Event] = []
    bad = 0
    for kind in FAST_KINDS:
        marker = f'"kind":"{kind}"'.encode()
        fast = [line for line in rest if marker in line]
        if not fast:
            continue
        rest = [line for line in rest if marker not in line]
        b, e, n = _parse_fast(kind, fast)
        blocks += b
        events += e
        bad += n
    e, n = json_events(rest)
    events += e
    events.sort(key=lambda ev: ev["t"])
    return blocks, events, bad + n


def read_file(
    path: Path, start: int = 0, chunk_bytes: int | None = None, *, strict: bool = True
) -> Iterator[FileChunk]:
    """Chunks of whole lines from `start` to the last newline of the file.

    `strict`: a line that is not an event raises `RecordError` with its line number (counted from
    `start`, so exact when reading from 0) instead of being counted."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; chunks are yielded in between
    except FileNotFoundError:
        return
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    with f:
        f.seek(start)
        partial = b""
        line_no = 1
        while True:
            chunk = f.read(chunk_bytes)
            if not chunk:
                break
            data = partial + chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                partial = data
                continue
            partial = data[cut + 1 :]
            lines = data[:cut].split(b"\n")
            blocks, events, bad = parse_lines(lines)
            if bad and strict:
                index = first_bad_line(lines) or 0
                raise bad_line_error(path, line_no + index, lines[index])
            line_no += len(lines)
            offset = f.tell() - len(partial)
            yield FileChunk(blocks, events, offset, bad, line_no)


def read_record(
    events_dir: Path,
    offsets: dict[Path, int] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[Block], list[Event], dict[Path, int], int]:
    """Every event file under `events_dir` (from `offsets` where given).

    Returns the blocks, the other events, the new offsets and the count of bad lines."""
    offsets = dict(offsets or {})
    paths = jsonl_files(events_dir)
    total = sum(max(0, p.stat().st_size - offsets.get(p, 0)) for p in paths)
    done = 0
    blocks: list[Block] = []
    events: list[Event] = []
    bad = 0
    for path in paths:
        start = offsets.get(path, 0)
        for chunk in read_file(path, start):
            blocks += chunk.blocks
            events += chunk.events
            bad += chunk.bad_lines
            done += chunk.offset - offsets.get(path, start)
            offsets[path] = chunk.offset
            if progress is not None:
                progress(done, total)
        offsets.setdefault(path, start)
    events.sort(key=lambda e: e["t"])
    return merge_blocks(blocks), events, offsets, bad


def merge_blocks(blocks: list[Block]) -> list[Block]:
    """Join consecutive blocks of the same kind and rank with the same columns into one."""
    groups: dict[tuple[str, int | None, tuple[str, ...]], list[Block]] = {}
    for b in blocks:
        groups.setdefault((b.kind, b.rank, tuple(b.columns)), []).append(b)
    merged = []
    for (kind, rank, keys), parts in groups.items():
        if len(parts) == 1:
            merged.append(parts[0])
            continue
        columns = {k: np.concatenate([p.columns[k] for p in parts]) for k in keys}
        blocks = _blocks_from_columns(kind, columns)
        if "rank" not in columns:  # slimmed rows of another rank: their rank is the group's, not None
            blocks = [Block(kind, rank, b.columns) for b in blocks]
        merged.extend(blocks)
    merged.sort(key=lambda b: float(b.t[0]) if len(b) else 0.0)
    return merged


def sample_file(path: Path, samples: int, edge_bytes: int) -> list[Event]:
    """A quick look at a big file: its first and last `edge_bytes` whole, `samples` lines spread between."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return []
    with f:
        size = f.seek(0, 2)
        if size <= 2 * edge_bytes + samples * 256:
            f.seek(0)
            data = f.read()
            return json_events(data[: data.rfind(b"\n") + 1].split(b"\n"))[0]
        lines: list[bytes] = []
        f.seek(0)
        head = f.read(edge_bytes)
        lines += head[: head.rfind(b"\n")].split(b"\n")
        for k in range(samples):
            pos = edge_bytes + (size - 2 * edge_bytes) * k // samples
            f.seek(pos)
            piece = f.read(4096)
            start = piece.find(b"\n") + 1
            end = piece.find(b"\n", start)
            if start > 0 and end > start:
                lines.append(piece[start:end])
        f.seek(size - edge_bytes)
        tail = f.read(edge_bytes)
        lines += tail[tail.find(b"\n") + 1 : tail.rfind(b"\n")].split(b"\n")
        return json_events(lines)[0]


def sample_record(events_dir: Path, samples: int, edge_bytes: int) -> list[Event]:
    """`sample_file` over every event file, merged by time."""
    paths = jsonl_files(events_dir)
    events = [e for p in paths for e in sample_file(p, samples, edge_bytes)]
    events.sort(key=lambda e: e["t"])
    return events

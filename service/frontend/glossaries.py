"""Glossaries as resources: stored in SQLite under the data directory, owned by the API key that
created them.

A glossary is a named list of source term -> target term for one language pair, as DeepL's
``/v2/glossaries`` defines it (entries given as TSV or CSV, one pair per line). Each caller sees
only its own glossaries; another key's id is "not found", never "forbidden", so ids reveal
nothing. On an open service (no keys) every caller shares one owner. The file survives restarts
and is shared by the API processes of one service (SQLite's own locking, WAL journal).

The store is synchronous and small; the routes call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import csv
import io
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from service.contract.errors import InvalidInput, LimitReached, NotFound
from service.frontend.sqlite import Database

# DeepL's limit on a glossary's entries (10 MB); a term longer than this is not a term.
MAX_ENTRIES_BYTES = 10 * 1024 * 1024
_MAX_TERM_CHARS = 1024
# C0 and C1 control characters (tab and line breaks among them): no term holds one.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS glossaries (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    name TEXT NOT NULL,
    source_lang TEXT NOT NULL,
    target_lang TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS entries (
    glossary TEXT NOT NULL REFERENCES glossaries(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    source TEXT NOT NULL,
    target TEXT NOT NULL,
    PRIMARY KEY (glossary, position)
);
CREATE INDEX IF NOT EXISTS glossaries_by_owner ON glossaries(owner);
"""


@dataclass(frozen=True, slots=True)
class Glossary:
    id: str
    name: str
    source_lang: str
    target_lang: str
    created: float
    entry_count: int


def parse_entries(text: str, entries_format: str) -> list[tuple[str, str]]:
    """DeepL's entry formats: ``tsv`` (source TAB target per line) or ``csv`` (source, target,
    and optionally the two language codes). Empty lines are skipped; a source term given twice,
    an empty term or a line without two fields is invalid input naming the line."""
    if len(text.encode()) > MAX_ENTRIES_BYTES:
        raise InvalidInput("entries: more than 10 MB")
    if entries_format == "tsv":
        rows = [line.split("\t") for line in text.splitlines()]
    elif entries_format == "csv":
        rows = list(csv.reader(io.StringIO(text)))
    else:
        raise InvalidInput("entries_format: 'tsv' or 'csv'")
    entries: list[tuple[str, str]] = []
    seen: set[str] = set()
    for number, row in enumerate(rows, start=1):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) < 2 or (entries_format == "tsv" and len(row) != 2):
            raise InvalidInput(f"entries: line {number} is not a source and a target term")
        source, target = row[0].strip(), row[1].strip()
        if not source or not target:
            raise InvalidInput(f"entries: line {number} has an empty term")
        if _CONTROL.search(source) or _CONTROL.search(target):
            # A tab or a line break inside a term (a quoted CSV field may hold one) would come
            # back as another entry from the TSV the entries are served as.
            raise InvalidInput(f"entries: line {number} has a control character in a term")
        if len(source) > _MAX_TERM_CHARS or len(target) > _MAX_TERM_CHARS:
            raise InvalidInput(f"entries: line {number} has a term over {_MAX_TERM_CHARS} chars")
        if source in seen:
            raise InvalidInput(f"entries: line {number} repeats the source term {source!r}")
        seen.add(source)
        entries.append((source, target))
    if not entries:
        raise InvalidInput("entries: no entries")
    return entries


def to_tsv(entries: list[tuple[str, str]]) -> str:
    return "".join(f"{source}\t{target}\n" for source, target in entries)


@dataclass(frozen=True, slots=True)
class GlossaryLimits:
    """What one key may store: glossaries (DeepL allows 1,000 per account) and the bytes of
    their entries together (one glossary alone may hold DeepL's 10 MB)."""

    max_glossaries: int = 1000
    max_bytes: int = 20 * 1024 * 1024


def entries_bytes(entries: list[tuple[str, str]]) -> int:
    return sum(len(source.encode()) + len(target.encode()) for source, target in entries)


class GlossaryStore:
    """The glossaries of one service, in one SQLite file."""

    def __init__(self, path: Path, limits: GlossaryLimits | None = None) -> None:
        self._db = Database(path, _SCHEMA)
        self._limits = limits or GlossaryLimits()

    def create(
        self,
        owner: str,
        name: str,
        source_lang: str,
        target_lang: str,
        entries: list[tuple[str, str]],
    ) -> Glossary:
        if not name.strip():
            raise InvalidInput("name: must not be empty")
        glossary = Glossary(
            str(uuid.uuid4()), name, source_lang, target_lang, time.time(), len(entries)
        )
        size = entries_bytes(entries)
        with self._db.transaction() as db:
            count, stored = db.execute(
                "SELECT COUNT(DISTINCT g.id), "
                "COALESCE(SUM(LENGTH(CAST(e.source AS BLOB)) + LENGTH(CAST(e.target AS BLOB))), 0) "
                "FROM glossaries g LEFT JOIN entries e ON e.glossary = g.id WHERE g.owner = ?",
                (owner,),
            ).fetchone()
            if count >= self._limits.max_glossaries:
                raise LimitReached(
                    f"Quota exceeded: at most {self._limits.max_glossaries} glossaries per key"
                )
            if stored + size > self._limits.max_bytes:
                raise LimitReached(
                    f"Quota exceeded: this key's glossaries would hold {stored + size} bytes of "
                    f"entries, at most {self._limits.max_bytes}"
                )
            db.execute(
                "INSERT INTO glossaries VALUES (?, ?, ?, ?, ?, ?)",
                (glossary.id, owner, name, source_lang, target_lang, glossary.created),
            )
            db.executemany(
                "INSERT INTO entries VALUES (?, ?, ?, ?)",
                [(glossary.id, i, source, target) for i, (source, target) in enumerate(entries)],
            )
        return glossary

    def owned(self, owner: str) -> list[Glossary]:
        with self._db.transaction() as db:
            rows = db.execute(
                "SELECT g.id, g.name, g.source_lang, g.target_lang, g.created, "
                "(SELECT COUNT(*) FROM entries e WHERE e.glossary = g.id) "
                "FROM glossaries g WHERE g.owner = ? ORDER BY g.created",
                (owner,),
            ).fetchall()
        return [Glossary(*row) for row in rows]

    def get(self, owner: str, glossary_id: str) -> Glossary:
        with self._db.transaction() as db:
            row = db.execute(
                "SELECT g.id, g.name, g.source_lang, g.target_lang, g.created, "
                "(SELECT COUNT(*) FROM entries e WHERE e.glossary = g.id) "
                "FROM glossaries g WHERE g.owner = ? AND g.id = ?",
                (owner, glossary_id),
            ).fetchone()
        if row is None:
            raise NotFound("Glossary not found")
        return Glossary(*row)

    def lookup(self, owner: str, glossary_id: str) -> tuple[Glossary, list[tuple[str, str]]]:
        """The glossary and its entries, in one transaction."""
        glossary = self.get(owner, glossary_id)
        with self._db.transaction() as db:
            rows = db.execute(
                "SELECT source, target FROM entries WHERE glossary = ? ORDER BY position",
                (glossary_id,),
            ).fetchall()
        return glossary, [(source, target) for source, target in rows]

    def delete(self, owner: str, glossary_id: str) -> None:
        with self._db.transaction() as db:
            deleted = db.execute(
                "DELETE FROM glossaries WHERE owner = ? AND id = ?", (owner, glossary_id)
            ).rowcount
        if not deleted:
            raise NotFound("Glossary not found")

    def close(self) -> None:
        self._db.close()

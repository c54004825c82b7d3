"""Glossaries as resources: stored in SQLite under the data directory, owned by the API key that
created them.

A glossary is a name and one or more dictionaries, each a list of source term -> target term for
one language pair, as DeepL's ``/v3/glossaries`` defines it (entries given as TSV or CSV, one pair
per line); a ``/v2/glossaries`` glossary is one with a single dictionary. Each caller sees
only its own glossaries; another key's id is "not found", never "forbidden", so ids reveal
nothing. On an open service (no keys) every caller shares one owner: every client sees and uses
every glossary, but only the client (address) that created one may change or delete it, and
each client's glossaries count against the limits on their own. The file survives restarts
and is shared by the API processes of one service (SQLite's own locking, WAL journal).

The store is synchronous and small; the routes call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import csv
import io
import re
import sqlite3
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from service.contract.errors import Forbidden, InvalidInput, LimitReached, NotFound
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
    created REAL NOT NULL,
    creator TEXT
);
CREATE TABLE IF NOT EXISTS dictionaries (
    glossary TEXT NOT NULL REFERENCES glossaries(id) ON DELETE CASCADE,
    source_lang TEXT NOT NULL,
    target_lang TEXT NOT NULL,
    PRIMARY KEY (glossary, source_lang, target_lang)
);
CREATE TABLE IF NOT EXISTS terms (
    glossary TEXT NOT NULL,
    source_lang TEXT NOT NULL,
    target_lang TEXT NOT NULL,
    position INTEGER NOT NULL,
    source TEXT NOT NULL,
    target TEXT NOT NULL,
    PRIMARY KEY (glossary, source_lang, target_lang, position),
    FOREIGN KEY (glossary, source_lang, target_lang)
        REFERENCES dictionaries(glossary, source_lang, target_lang) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS glossaries_by_owner ON glossaries(owner);
"""
# The first layout (one language pair per glossary, its terms in ``entries``), moved into the
# tables above when a file of it is opened.
_MIGRATE_V1 = (
    """
ALTER TABLE glossaries RENAME TO glossaries_v1;
ALTER TABLE entries RENAME TO entries_v1;
DROP INDEX IF EXISTS glossaries_by_owner;
"""
    + _SCHEMA
    + """
INSERT INTO glossaries (id, owner, name, created) SELECT id, owner, name, created
    FROM glossaries_v1;
INSERT INTO dictionaries SELECT id, source_lang, target_lang FROM glossaries_v1;
INSERT INTO terms SELECT e.glossary, g.source_lang, g.target_lang, e.position, e.source, e.target
    FROM entries_v1 e JOIN glossaries_v1 g ON g.id = e.glossary;
DROP TABLE entries_v1;
DROP TABLE glossaries_v1;
"""
)


# The second layout, without the client that created each glossary.
_ADD_CREATOR = "ALTER TABLE glossaries ADD COLUMN creator TEXT;"


def _migrate(connection: sqlite3.Connection) -> None:
    columns = {row[1] for row in connection.execute("PRAGMA table_info(glossaries)")}
    if not columns or "creator" in columns:
        return  # a new file (the schema makes it), or one of this layout
    upgrade = _MIGRATE_V1 if "source_lang" in columns else _ADD_CREATOR
    # A key's glossaries of an earlier layout were created by that key; an open service's stay
    # without a creator (any caller may change them, as before).
    connection.executescript(
        "BEGIN;" + upgrade + "UPDATE glossaries SET creator = owner WHERE owner != 'open';COMMIT;"
    )


Entries = list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Dictionary:
    """One language pair of a glossary."""

    source_lang: str
    target_lang: str
    entry_count: int


@dataclass(frozen=True, slots=True)
class Glossary:
    id: str
    name: str
    created: float
    dictionaries: tuple[Dictionary, ...]

    def dictionary(self, source_lang: str, target_lang: str) -> Dictionary | None:
        return next(
            (
                d
                for d in self.dictionaries
                if (d.source_lang, d.target_lang) == (source_lang, target_lang)
            ),
            None,
        )


def parse_entries(text: str, entries_format: str) -> list[tuple[str, str]]:
    """DeepL's entry formats: ``tsv`` (source TAB target per line) or ``csv`` (source, target,
    and optionally the two language codes). Empty lines are skipped; a source term given twice,
    an empty term or a line without two fields is invalid input naming the line."""
    if len(text.encode()) > MAX_ENTRIES_BYTES:
        raise InvalidInput("entries: more than 10 MB")
    if entries_format == "tsv":
        rows = [line.split("\t") for line in text.splitlines()]
    elif entries_format == "csv":
        rows = _csv_rows(text)
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


def _csv_rows(text: str) -> list[list[str]]:
    reader = csv.reader(io.StringIO(text))
    try:
        return list(reader)
    except csv.Error as error:
        # A field over the csv module's own limit (128 KiB: a quote never closed takes the
        # rest of the text into one field), a line break inside an unquoted field, and so on.
        raise InvalidInput(f"entries: line {reader.line_num} is not CSV: {error}") from None


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
        self._db = Database(path, _SCHEMA, migrate=_migrate)
        self._limits = limits or GlossaryLimits()

    def create(
        self,
        owner: str,
        name: str,
        dictionaries: list[tuple[str, str, Entries]],
        caller: str | None = None,
    ) -> Glossary:
        """A new glossary of ``dictionaries`` (source, target, entries), one per pair, created
        by ``caller`` (the client; ``owner`` when not given)."""
        creator = caller or owner
        _check_name(name)
        pairs = [(source, target) for source, target, _ in dictionaries]
        if not pairs:
            raise InvalidInput("dictionaries: at least one")
        if len(set(pairs)) != len(pairs):
            raise InvalidInput("dictionaries: a language pair given twice")
        glossary_id = str(uuid.uuid4())
        with self._db.transaction() as db:
            self._check_room(
                db, creator, new=1, added=sum(entries_bytes(e) for *_, e in dictionaries)
            )
            db.execute(
                "INSERT INTO glossaries (id, owner, name, created, creator) VALUES (?, ?, ?, ?, ?)",
                (glossary_id, owner, name, time.time(), creator),
            )
            for source, target, entries in dictionaries:
                _write_dictionary(db, glossary_id, source, target, entries)
            return _read(db, owner, glossary_id)

    def owned(self, owner: str) -> list[Glossary]:
        with self._db.transaction() as db:
            ids = db.execute(
                "SELECT id FROM glossaries WHERE owner = ? ORDER BY created", (owner,)
            ).fetchall()
            return [_read(db, owner, glossary_id) for (glossary_id,) in ids]

    def get(self, owner: str, glossary_id: str) -> Glossary:
        with self._db.transaction() as db:
            return _read(db, owner, glossary_id)

    def entries(
        self, owner: str, glossary_id: str, source_lang: str, target_lang: str
    ) -> tuple[Glossary, Entries]:
        """The glossary, and its entries for the pair (none: the glossary has no such pair)."""
        with self._db.transaction() as db:
            glossary = _read(db, owner, glossary_id)
            rows = db.execute(
                "SELECT source, target FROM terms WHERE glossary = ? AND source_lang = ? AND "
                "target_lang = ? ORDER BY position",
                (glossary_id, source_lang, target_lang),
            ).fetchall()
        return glossary, [(source, target) for source, target in rows]

    def update(
        self,
        owner: str,
        glossary_id: str,
        name: str | None = None,
        dictionaries: Sequence[tuple[str, str, Entries]] = (),
        caller: str | None = None,
    ) -> Glossary:
        """Rename, and merge ``dictionaries`` in: a pair's entries replace those of the same
        source term and add the others; a new pair is added (DeepL's PATCH)."""
        if name is not None:
            _check_name(name)
        with self._db.transaction() as db:
            _read(db, owner, glossary_id)
            creator = _check_creator(db, glossary_id, caller or owner)
            if name is not None:
                db.execute("UPDATE glossaries SET name = ? WHERE id = ?", (name, glossary_id))
            for source, target, entries in dictionaries:
                merged = dict(_terms(db, glossary_id, source, target))
                before = entries_bytes(list(merged.items()))
                merged.update(entries)
                self._check_room(db, creator, 0, entries_bytes(list(merged.items())) - before)
                _write_dictionary(db, glossary_id, source, target, list(merged.items()))
            return _read(db, owner, glossary_id)

    def replace(
        self,
        owner: str,
        glossary_id: str,
        source: str,
        target: str,
        entries: Entries,
        caller: str | None = None,
    ) -> Dictionary:
        """Set the pair's dictionary to ``entries`` (added where the glossary had none)."""
        with self._db.transaction() as db:
            _read(db, owner, glossary_id)
            creator = _check_creator(db, glossary_id, caller or owner)
            before = entries_bytes(_terms(db, glossary_id, source, target))
            self._check_room(db, creator, 0, entries_bytes(entries) - before)
            _write_dictionary(db, glossary_id, source, target, entries)
        return Dictionary(source, target, len(entries))

    def delete_dictionary(
        self, owner: str, glossary_id: str, source: str, target: str, caller: str | None = None
    ) -> None:
        with self._db.transaction() as db:
            glossary = _read(db, owner, glossary_id)
            _check_creator(db, glossary_id, caller or owner)
            if glossary.dictionary(source, target) is None:
                raise NotFound("Dictionary not found")
            if len(glossary.dictionaries) == 1:
                raise InvalidInput("a glossary keeps at least one dictionary: delete the glossary")
            db.execute(
                "DELETE FROM dictionaries WHERE glossary = ? AND source_lang = ? AND "
                "target_lang = ?",
                (glossary_id, source, target),
            )

    def delete(self, owner: str, glossary_id: str, caller: str | None = None) -> None:
        with self._db.transaction() as db:
            _read(db, owner, glossary_id)
            _check_creator(db, glossary_id, caller or owner)
            deleted = db.execute(
                "DELETE FROM glossaries WHERE owner = ? AND id = ?", (owner, glossary_id)
            ).rowcount
        if not deleted:
            raise NotFound("Glossary not found")

    def close(self) -> None:
        self._db.close()

    def _check_room(self, db: sqlite3.Connection, creator: str, new: int, added: int) -> None:
        """Refuse ``new`` more glossaries or ``added`` more bytes of entries past the limits
        of their creator (a key; on a service without keys, a client, so that one client
        cannot use up what all share)."""
        count, stored = db.execute(
            "SELECT (SELECT COUNT(*) FROM glossaries WHERE creator = ?), "
            "COALESCE(SUM(LENGTH(CAST(t.source AS BLOB)) + LENGTH(CAST(t.target AS BLOB))), 0) "
            "FROM terms t JOIN glossaries g ON g.id = t.glossary WHERE g.creator = ?",
            (creator, creator),
        ).fetchone()
        if new and count + new > self._limits.max_glossaries:
            raise LimitReached(
                f"Quota exceeded: at most {self._limits.max_glossaries} glossaries per key"
            )
        if added > 0 and stored + added > self._limits.max_bytes:
            raise LimitReached(
                f"Quota exceeded: this key's glossaries would hold {stored + added} bytes of "
                f"entries, at most {self._limits.max_bytes}"
            )


def _check_creator(db: sqlite3.Connection, glossary_id: str, caller: str) -> str:
    """The glossary's creator, when ``caller`` may change it: on a service without keys every
    client sees every glossary, but only the one that made it may change or delete it (a
    stranger could otherwise delete a team's glossaries). One of an earlier layout has no
    creator and stays open to all."""
    (creator,) = db.execute(
        "SELECT creator FROM glossaries WHERE id = ?", (glossary_id,)
    ).fetchone()
    if creator is not None and creator != caller:
        raise Forbidden(
            "this glossary was created by another client: on a service without API keys, only "
            "the client that created a glossary may change or delete it"
        )
    return str(creator or caller)


def _check_name(name: str) -> None:
    if not name.strip():
        raise InvalidInput("name: must not be empty")


def _read(db: sqlite3.Connection, owner: str, glossary_id: str) -> Glossary:
    row = db.execute(
        "SELECT name, created FROM glossaries WHERE owner = ? AND id = ?", (owner, glossary_id)
    ).fetchone()
    if row is None:
        raise NotFound("Glossary not found")
    pairs = db.execute(
        "SELECT d.source_lang, d.target_lang, "
        "(SELECT COUNT(*) FROM terms t WHERE t.glossary = d.glossary AND "
        "t.source_lang = d.source_lang AND t.target_lang = d.target_lang) "
        "FROM dictionaries d WHERE d.glossary = ? ORDER BY d.rowid",
        (glossary_id,),
    ).fetchall()
    return Glossary(glossary_id, row[0], row[1], tuple(Dictionary(*pair) for pair in pairs))


def _terms(db: sqlite3.Connection, glossary_id: str, source: str, target: str) -> Entries:
    rows = db.execute(
        "SELECT source, target FROM terms WHERE glossary = ? AND source_lang = ? AND "
        "target_lang = ? ORDER BY position",
        (glossary_id, source, target),
    ).fetchall()
    return [(s, t) for s, t in rows]


def _write_dictionary(
    db: sqlite3.Connection, glossary_id: str, source: str, target: str, entries: Entries
) -> None:
    """The pair's dictionary, its entries replaced by ``entries``."""
    db.execute("INSERT OR IGNORE INTO dictionaries VALUES (?, ?, ?)", (glossary_id, source, target))
    db.execute(
        "DELETE FROM terms WHERE glossary = ? AND source_lang = ? AND target_lang = ?",
        (glossary_id, source, target),
    )
    db.executemany(
        "INSERT INTO terms VALUES (?, ?, ?, ?, ?, ?)",
        [(glossary_id, source, target, i, s, t) for i, (s, t) in enumerate(entries)],
    )

"""Glossary entries as DeepL takes them (TSV, CSV): what is stored reads back the same; the
store's multilingual glossaries, their dictionaries and the upgrade of an older file."""

from __future__ import annotations

import csv
import io
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from service.contract.errors import Forbidden, InvalidInput, LimitReached, NotFound
from service.frontend import glossaries
from service.frontend.glossaries import (
    Dictionary,
    GlossaryLimits,
    GlossaryStore,
    parse_entries,
    to_tsv,
)

TERMS = st.text(min_size=1, max_size=12)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(TERMS, TERMS), min_size=1, max_size=6))
def test_entries_accepted_from_csv_read_back_the_same_from_their_tsv(
    pairs: list[tuple[str, str]],
) -> None:
    """Issue 34, finding 7: a quoted CSV field holding a tab or a line break was stored, and
    its TSV (what the entries route serves) read back as other entries."""
    out = io.StringIO()
    csv.writer(out).writerows(pairs)
    try:
        entries = parse_entries(out.getvalue(), "csv")
    except InvalidInput:
        return  # refused, with the line: never stored
    assert parse_entries(to_tsv(entries), "tsv") == entries


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@example(text='"' + "a" * 200_000 + '",b', entries_format="csv")
@example(text='a,b\n"' + "a" * 200_000, entries_format="csv")
@given(
    text=st.text(st.sampled_from('ab ,"\t\n\r\x00\u00e9'), max_size=60) | st.text(max_size=30),
    entries_format=st.sampled_from(["csv", "tsv"]),
)
def test_any_entries_are_read_or_refused_as_the_client_s_error(
    text: str, entries_format: str
) -> None:
    """A field over the csv module's limit (a quote never closed) raised ``csv.Error``: a 500."""
    try:
        entries = parse_entries(text, entries_format)
    except InvalidInput:
        return
    assert entries
    assert all(source and target for source, target in entries)


def test_a_term_with_a_line_break_is_refused_naming_its_line() -> None:
    with pytest.raises(InvalidInput, match="line 2 has a control character"):
        parse_entries('a,b\n"two\nlines",c\n', "csv")


def test_a_file_of_the_first_layout_is_read_as_one_dictionary_glossaries(tmp_path: Path) -> None:
    """Glossaries stored before multilingual ones existed (one pair each, terms in ``entries``)
    are there after the upgrade, as glossaries of one dictionary."""
    path = tmp_path / "glossaries.sqlite3"
    with sqlite3.connect(path) as db:
        db.executescript(
            "CREATE TABLE glossaries (id TEXT PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT "
            "NULL, source_lang TEXT NOT NULL, target_lang TEXT NOT NULL, created REAL NOT NULL);"
            "CREATE TABLE entries (glossary TEXT NOT NULL REFERENCES glossaries(id) ON DELETE "
            "CASCADE, position INTEGER NOT NULL, source TEXT NOT NULL, target TEXT NOT NULL, "
            "PRIMARY KEY (glossary, position));"
            "CREATE INDEX glossaries_by_owner ON glossaries(owner);"
            "INSERT INTO glossaries VALUES ('g1', 'me', 'ops', 'en', 'de', 1.0);"
            "INSERT INTO entries VALUES ('g1', 0, 'node', 'Knoten'), ('g1', 1, 'cluster', "
            "'Verbund');"
        )
    store = GlossaryStore(path)
    (kept,) = store.owned("me")
    assert (kept.id, kept.name, kept.dictionaries) == ("g1", "ops", (Dictionary("en", "de", 2),))
    assert store.entries("me", "g1", "en", "de")[1] == [("node", "Knoten"), ("cluster", "Verbund")]
    store.close()
    assert GlossaryStore(path).get("me", "g1") == kept  # opened again: nothing to migrate


def test_dictionaries_are_merged_replaced_and_deleted_within_the_limits(tmp_path: Path) -> None:
    store = GlossaryStore(tmp_path / "g.sqlite3", GlossaryLimits(max_glossaries=2, max_bytes=64))
    made = store.create("me", "ops", [("en", "de", [("node", "Knoten")]), ("de", "en", [])])
    assert [(d.source_lang, d.target_lang, d.entry_count) for d in made.dictionaries] == [
        ("en", "de", 1),
        ("de", "en", 0),
    ]
    # PATCH: same source term replaced, new ones added, a new pair added; the name changes.
    edited = store.update(
        "me", made.id, "ops2", [("en", "de", [("node", "Knotenpunkt"), ("pod", "Pod")])]
    )
    assert edited.name == "ops2"
    assert store.entries("me", made.id, "en", "de")[1] == [("node", "Knotenpunkt"), ("pod", "Pod")]
    # PUT: the pair's entries are exactly the new ones.
    assert store.replace("me", made.id, "de", "en", [("Knoten", "node")]).entry_count == 1
    assert store.entries("me", made.id, "de", "en")[1] == [("Knoten", "node")]
    store.delete_dictionary("me", made.id, "de", "en")
    assert [d.source_lang for d in store.get("me", made.id).dictionaries] == ["en"]
    with pytest.raises(InvalidInput, match="at least one dictionary"):
        store.delete_dictionary("me", made.id, "en", "de")
    with pytest.raises(NotFound):
        store.get("someone else", made.id)
    with pytest.raises(LimitReached, match="bytes"):
        store.replace("me", made.id, "en", "fr", [("a" * 40, "b" * 40)])
    with pytest.raises(InvalidInput, match="pair given twice"):
        store.create("me", "x", [("en", "de", []), ("en", "de", [])])
    store.delete("me", made.id)
    assert store.owned("me") == []


def test_on_an_open_service_only_a_glossary_s_creator_changes_or_deletes_it(
    tmp_path: Path,
) -> None:
    """Without keys every caller shared one owner: any client could list every glossary and
    delete or overwrite it (a team's work gone to a stranger's DELETE), and one client could
    use up the limits all shared."""
    store = GlossaryStore(tmp_path / "g.sqlite3", GlossaryLimits(max_glossaries=1))
    creator, stranger = "addr:10.0.0.1", "addr:10.0.0.2"
    made = store.create("open", "team", [("en", "de", [("node", "Knoten")])], creator)
    # Every client sees and uses it...
    assert [g.id for g in store.owned("open")] == [made.id]
    assert store.entries("open", made.id, "en", "de")[1] == [("node", "Knoten")]
    # ...but a stranger can neither change nor delete it.
    changes: list[Callable[[], object]] = [
        lambda: store.delete("open", made.id, stranger),
        lambda: store.update("open", made.id, "mine", (), stranger),
        lambda: store.replace("open", made.id, "en", "de", [("node", "X")], stranger),
        lambda: store.delete_dictionary("open", made.id, "en", "de", stranger),
    ]
    for change in changes:
        with pytest.raises(Forbidden, match="only the client that created"):
            change()
    assert store.get("open", made.id) == made
    assert store.entries("open", made.id, "en", "de")[1] == [("node", "Knoten")]
    # The limits are each client's own.
    store.create("open", "theirs", [("en", "de", [("a", "b")])], stranger)
    with pytest.raises(LimitReached):
        store.create("open", "more", [("en", "de", [("c", "d")])], creator)
    assert store.update("open", made.id, "team 2", (), creator).name == "team 2"
    store.delete("open", made.id, creator)
    assert [g.name for g in store.owned("open")] == ["theirs"]


def test_a_file_without_creators_gains_them_and_its_open_glossaries_stay_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "glossaries.sqlite3"
    with sqlite3.connect(path) as db:
        db.executescript(
            glossaries._SCHEMA.replace(",\n    creator TEXT", "")
            + "INSERT INTO glossaries VALUES ('g1', 'open', 'shared', 1.0),"
            " ('g2', 'key:abc', 'mine', 2.0);"
            "INSERT INTO dictionaries VALUES ('g1', 'en', 'de'), ('g2', 'en', 'de');"
        )
    store = GlossaryStore(path)
    with pytest.raises(Forbidden):
        store.delete("key:abc", "g2", "key:other")  # a key's glossary: its key's
    store.delete("key:abc", "g2", "key:abc")
    store.delete("open", "g1", "addr:10.0.0.9")  # made before creators were kept: open to all
    assert store.owned("open") == []

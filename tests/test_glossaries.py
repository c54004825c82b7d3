"""Glossary entries as DeepL takes them (TSV, CSV): what is stored reads back the same."""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.contract.errors import InvalidInput
from service.frontend.glossaries import parse_entries, to_tsv

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


def test_a_term_with_a_line_break_is_refused_naming_its_line() -> None:
    with pytest.raises(InvalidInput, match="line 2 has a control character"):
        parse_entries('a,b\n"two\nlines",c\n', "csv")

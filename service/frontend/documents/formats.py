"""What to translate in a file, and how to put the translations back.

``parse`` turns a file's bytes into ``Units`` (the texts to translate, each with the way it is
translated) and a ``rebuild`` that takes one translation per unit and returns the new file.
Formats:

- plain text and Markdown: the text in chunks of whole paragraphs, each translated as a
  document (line by line, so lines, lists and Markdown markers stay; ``Translator.document``);
- HTML: the whole file as markup (tags kept, ``Translator.translate_markup``);
- SubRip (``.srt``) and WebVTT (``.vtt``): each cue's text, numbers, timing lines, headers and
  notes kept as written;
- Word (``.docx``): each paragraph (body, tables, headers and footers) as markup whose elements
  are its formatting runs (``<r0>``, ``<r1>``...), so a sentence is translated whole and each
  run's formatting comes back on its part of the translation.

The whitespace around a unit is never sent to the model: it is put back as it was.
"""

from __future__ import annotations

import html
import io
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from service.contract.errors import InvalidInput, PayloadTooLarge, Unsupported
from service.frontend.translation.markup import INLINE

UnitKind = Literal["document", "text", "markup"]
FileFormat = Literal["txt", "md", "html", "srt", "vtt", "docx"]

# File name extensions and the format each names.
EXTENSIONS: dict[str, FileFormat] = {
    "txt": "txt",
    "text": "txt",
    "md": "md",
    "markdown": "md",
    "html": "html",
    "htm": "html",
    "srt": "srt",
    "vtt": "vtt",
    "docx": "docx",
}
MEDIA_TYPES: dict[str, str] = {
    "txt": "text/plain; charset=utf-8",
    "md": "text/markdown; charset=utf-8",
    "html": "text/html; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}

# A line break, with any blank lines after it (a paragraph break).
_LINE_BREAK = re.compile(r"(\n(?:[ \t]*\n)*)")
_BLOCK_BREAK = re.compile(r"(\r?\n(?:[ \t]*\r?\n)+)")
_RUN = re.compile(r"<r(\d+)>(.*?)</r\1>", re.S)
_TAG = re.compile(r"<[^<>]*>")
# The tags a subtitle cue may hold (WebVTT's and SubRip's): kept, not splitting a sentence.
_CUE_INLINE = INLINE | {"c", "v", "ruby", "rt", "lang", "font"}


@dataclass(frozen=True, slots=True)
class Unit:
    """One text to translate and how: ``document`` (long text, line by line), ``text`` (one
    text), ``markup`` (tags kept; ``inline`` elements do not split a sentence)."""

    text: str
    kind: UnitKind
    inline: frozenset[str] = field(default=frozenset())

    @property
    def characters(self) -> int:
        """The characters of the source text it holds (what is billed): markup's tags and
        escapes, the service's own run tags included, are not text."""
        if self.kind == "markup":
            return len(html.unescape(_TAG.sub("", self.text)))
        return len(self.text)


@dataclass(frozen=True, slots=True)
class Parsed:
    units: list[Unit]
    rebuild: Callable[[list[str]], bytes]

    @property
    def characters(self) -> int:
        return sum(unit.characters for unit in self.units)


def format_of(filename: str) -> FileFormat:
    """The format a file name's extension names; ``Unsupported`` for any other."""
    extension = filename.rsplit(".", 1)[-1].lower() if "." in filename else ""
    if extension not in EXTENSIONS:
        names = ", ".join(f".{name}" for name in EXTENSIONS)
        raise Unsupported(f"file: {filename!r} is not a supported document type ({names})")
    return EXTENSIONS[extension]


@dataclass(frozen=True, slots=True)
class PackageLimits:
    """What a zipped document (``.docx``) may unpack to, checked from its directory before
    anything is inflated: a 1 MB upload can otherwise inflate to gigabytes (a zip bomb)."""

    # All its parts together, uncompressed.
    max_unpacked_bytes: int = 100 * 1024 * 1024
    # Parts in the package (a Word document has tens; each costs an object when loaded).
    max_parts: int = 2_000
    # Uncompressed to compressed size of one part (real XML parts stay far below: ~10 to 30).
    max_ratio: int = 200


def parse(
    data: bytes, file_format: FileFormat, chunk_chars: int, package: PackageLimits | None = None
) -> Parsed:
    """``data`` as units to translate; ``chunk_chars``: the most characters of one document
    unit (a paragraph longer than that is one unit of its own, cut later by the translator)."""
    if file_format == "docx":
        return _parse_docx(data, package or PackageLimits())
    text, bom = _decode(data)
    if file_format in ("txt", "md"):
        return _parse_text(text, bom, chunk_chars)
    if file_format == "html":
        return _parse_html(text, bom)
    return _parse_subtitles(text, bom, file_format)


def _decode(data: bytes) -> tuple[str, bool]:
    bom = data.startswith(b"\xef\xbb\xbf")
    try:
        return data.decode("utf-8-sig"), bom
    except UnicodeDecodeError:
        raise InvalidInput("file: the document is not UTF-8 text") from None


def _encode(text: str, bom: bool) -> bytes:
    return ("\ufeff" if bom else "").encode() + text.encode()


def _spaced(original: str, translated: str) -> str:
    """``translated`` with the whitespace that surrounded ``original``."""
    lead = original[: len(original) - len(original.lstrip())]
    trail = original[len(original.rstrip()) :]
    return f"{lead}{translated.strip()}{trail}"


def _words(text: str) -> bool:
    return any(char.isalpha() for char in text)


def _parse_text(text: str, bom: bool, chunk_chars: int) -> Parsed:
    """Lines grouped into chunks of at most ``chunk_chars``, cut at a paragraph break where one
    is near, else at a line break (a line longer than that at a space); the breaks between
    chunks kept as written."""
    chunks = _chunks(text, chunk_chars)  # even: a chunk; odd: the break after it
    texts = [i for i in range(0, len(chunks), 2) if _words(chunks[i])]
    units = [Unit(chunks[i].strip(), "document") for i in texts]

    def rebuild(translations: list[str]) -> bytes:
        out = list(chunks)
        for index, translated in zip(texts, translations, strict=True):
            out[index] = _spaced(chunks[index], translated)
        return _encode("".join(out), bom)

    return Parsed(units, rebuild)


def _chunks(text: str, limit: int) -> list[str]:
    """``text`` as chunk, break, chunk, ...: the chunks at most ``limit`` long."""
    tokens = _LINE_BREAK.split(text)  # even: a line; odd: the break after it
    out: list[str] = []
    current = ""
    for index in range(0, len(tokens), 2):
        line = tokens[index]
        brk = tokens[index + 1] if index + 1 < len(tokens) else ""
        for piece in _cut_line(line, limit):
            if current and len(current) + len(piece) > limit:
                # Close the chunk at its last break: a paragraph break if it has one late
                # enough, any line break otherwise.
                head, sep, tail = _split_at_break(current)
                out += [head, sep]
                current = tail
            current += piece
        if current and len(current) + len(brk) > limit:
            out += [current, brk]
            current = ""
        else:
            current += brk
    head, sep, tail = current, "", ""
    if current.endswith("\n") and current.strip():
        # A chunk's trailing break is kept outside it.
        stripped = current.rstrip()
        head, sep = stripped, current[len(stripped) :]
    out += [head, sep] if sep else [head]
    return out if len(out) % 2 else [*out, ""]


def _split_at_break(chunk: str) -> tuple[str, str, str]:
    """``chunk`` cut at its last paragraph break in its second half, else its last line break
    (the break itself separate); no break: the whole chunk, nothing after."""
    breaks = list(_LINE_BREAK.finditer(chunk))
    if not breaks:
        return chunk, "", ""
    paragraphs = [m for m in breaks if m.group(0).count("\n") > 1 and m.start() > len(chunk) // 2]
    cut = (paragraphs or breaks)[-1]
    return chunk[: cut.start()], cut.group(0), chunk[cut.end() :]


def _cut_line(line: str, limit: int) -> list[str]:
    """A line longer than ``limit`` cut after a space near the limit (or at it)."""
    pieces: list[str] = []
    while len(line) > limit:
        space = line.rfind(" ", limit // 2, limit)
        end = space + 1 if space > 0 else limit
        pieces.append(line[:end])
        line = line[end:]
    return [*pieces, line]


def _parse_html(text: str, bom: bool) -> Parsed:
    units = [Unit(text, "markup", INLINE)] if _words(text) else []

    def rebuild(translations: list[str]) -> bytes:
        return _encode(translations[0] if units else text, bom)

    return Parsed(units, rebuild)


def _parse_subtitles(text: str, bom: bool, file_format: FileFormat) -> Parsed:
    """Cues are blocks separated by empty lines; a cue's text is what follows its timing line
    (``-->``). Blocks without one (the WebVTT header, NOTE, STYLE and REGION blocks) are kept."""
    blocks = _BLOCK_BREAK.split(text)
    if file_format == "vtt" and not blocks[0].lstrip("\ufeff").startswith("WEBVTT"):
        raise InvalidInput("file: a WebVTT file begins with WEBVTT")
    # (block index, the block's lines before the text, the text)
    cues: list[tuple[int, str, str]] = []
    for index in range(0, len(blocks), 2):
        lines = blocks[index].split("\n")
        timing = next((n for n, line in enumerate(lines) if "-->" in line), None)
        if timing is None or lines[0].startswith(("NOTE", "STYLE", "REGION")):
            continue
        head = "\n".join(lines[: timing + 1])
        body = "\n".join(lines[timing + 1 :])
        if _words(body):
            cues.append((index, head, body))
    units = [
        Unit(body.strip(), "markup", _CUE_INLINE) if "<" in body else Unit(body.strip(), "text")
        for _, _, body in cues
    ]

    def rebuild(translations: list[str]) -> bytes:
        out = list(blocks)
        for (index, head, body), translated in zip(cues, translations, strict=True):
            out[index] = f"{head}\n{_spaced(body, translated)}"
        return _encode("".join(out), bom)

    return Parsed(units, rebuild)


def check_package(data: bytes, limits: PackageLimits) -> None:
    """Refuse a zip whose directory says it unpacks to too much (413) or is not a zip (422).

    The sizes are those the directory declares; zipfile never inflates a part beyond its
    declared size (and fails its CRC check when it lies), so the declared sizes bound the work.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as package:
            members = package.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError):
        raise InvalidInput("file: the document is not a Word (.docx) file") from None
    if len(members) > limits.max_parts:
        raise PayloadTooLarge(
            f"file: the document has {len(members)} parts, at most {limits.max_parts}"
        )
    unpacked = sum(member.file_size for member in members)
    if unpacked > limits.max_unpacked_bytes:
        raise PayloadTooLarge(
            f"file: the document unpacks to {unpacked} bytes, at most {limits.max_unpacked_bytes}"
        )
    for member in members:
        # Tiny parts compress badly or well by chance; only a large one can be a bomb.
        if member.file_size > 1024 * 1024 and member.file_size > limits.max_ratio * max(
            1, member.compress_size
        ):
            raise PayloadTooLarge(
                f"file: the document's part {member.filename[:100]!r} unpacks "
                f"{member.file_size // max(1, member.compress_size)} times its size, "
                f"at most {limits.max_ratio}"
            )


def _parse_docx(data: bytes, limits: PackageLimits) -> Parsed:
    # Imported here: python-docx (and lxml) are needed only when a Word document comes in.
    import docx

    check_package(data, limits)
    try:
        document = docx.Document(io.BytesIO(data))
        paragraphs = [p for p in _paragraphs(document) if _words(p.text)]
        units = [_paragraph_unit(paragraph) for paragraph in paragraphs]
    except MemoryError:
        raise  # the file is too large to read within the reader's memory, not broken
    except Exception:
        # Whatever a broken package makes python-docx, zipfile or lxml raise: a missing part
        # (KeyError), a part that is not XML (lxml's own types), a content-types part without
        # its namespace (AttributeError), and more; the file is the client's, never a 500.
        raise InvalidInput("file: the document is not a Word (.docx) file") from None

    def rebuild(translations: list[str]) -> bytes:
        for paragraph, translated in zip(paragraphs, translations, strict=True):
            runs = paragraph.runs
            texts = _run_texts(translated, len(runs))
            for run, text in zip(runs, texts, strict=True):
                run.text = xml_safe(text)
        out = io.BytesIO()
        document.save(out)
        return out.getvalue()

    return Parsed(units, rebuild)


# What XML 1.0 cannot carry (C0 controls but tab, newline and carriage return; surrogates;
# U+FFFE, U+FFFF): a model can generate any of them, and one would fail the whole file.
_NOT_XML = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    """``text`` without the characters an XML document cannot hold."""
    return _NOT_XML.sub("", text)


def _paragraph_unit(paragraph: Any) -> Unit:
    """A paragraph to translate, its runs marked ``<rN>`` so that each run gets its text back."""
    runs = paragraph.runs
    markup = "".join(f"<r{n}>{html.escape(run.text, False)}</r{n}>" for n, run in enumerate(runs))
    return Unit(markup, "markup", frozenset(f"r{n}" for n in range(len(runs))))


def _run_texts(translated: str, count: int) -> list[str]:
    """Each run's text in a translated paragraph; text the model put outside every run goes to
    the run before it (or the first)."""
    texts = [""] * count
    position, last = 0, 0
    for match in _RUN.finditer(translated):
        outside = html.unescape(translated[position : match.start()])
        number = int(match.group(1))
        if number >= count:
            position = match.end()
            continue
        if outside.strip():
            texts[last] += outside
        texts[number] += html.unescape(match.group(2))
        last, position = number, match.end()
    rest = html.unescape(translated[position:])
    if rest.strip():
        texts[last] += rest
    return texts


def _paragraphs(document: Any) -> list[Any]:
    """Every paragraph of the body, its tables (nested ones too), headers and footers, once
    each (a merged cell is listed once per grid cell it spans)."""
    found: list[Any] = []
    seen: set[int] = set()

    def walk(container: Any) -> None:
        for paragraph in container.paragraphs:
            if id(paragraph._p) not in seen:
                seen.add(id(paragraph._p))
                found.append(paragraph)
        for table in container.tables:
            for row in table.rows:
                for cell in row.cells:
                    walk(cell)

    walk(document)
    for section in document.sections:
        for part in (section.header, section.footer):
            if not part.is_linked_to_previous:
                walk(part)
    return found

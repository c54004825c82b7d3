"""Uploaded documents and stored glossaries: sizes, counts per key, lifetimes, links."""

from __future__ import annotations

from pydantic import Field

from service.config.section import Section


class DocumentsSettings(Section):
    max_file_bytes: int = Field(
        10 * 1024 * 1024,
        ge=1024,
        description="Largest document upload in bytes (POST /v2/document, /translate_file); "
        "bigger gets 413.",
    )
    max_file_chars: int = Field(
        1_000_000, ge=1, description="Most characters to translate in one uploaded document."
    )
    max_unpacked_bytes: int = Field(
        100 * 1024 * 1024,
        ge=1024,
        description="Most bytes a zipped document (.docx) may unpack to, all parts together; "
        "checked from its directory before anything is inflated (bigger gets 413).",
    )
    public_origin: str | None = Field(
        None,
        pattern=r"^https?://[^/?#\s]+$",
        description="Where clients reach the service, as scheme://host[:port] (e.g. "
        "https://mt.example.com): links to translated files are built on it. Unset: on the "
        "request's Host header.",
    )
    max_documents_per_key: int = Field(
        20,
        ge=1,
        description="Document jobs a key (on a service without keys, a client address) may "
        "hold at once (until downloaded or expired).",
    )
    document_ttl_s: float = Field(
        86_400.0, gt=0, description="How long a document job and its files are kept."
    )
    document_jobs: int = Field(
        2, ge=1, description="Documents translating at once in each API process."
    )
    document_reads: int = Field(
        1,
        ge=1,
        description="Documents read (or written back) at once in each API process, each in a "
        "child process of its own; uploads finding 8 more waiting get 429.",
    )
    document_read_timeout_s: float = Field(
        120.0,
        gt=0,
        description="Longest one document's read or rebuild may take; an upload over it gets 413.",
    )
    document_read_memory_mib: int = Field(
        2048,
        ge=64,
        description="Memory one document's read may take (its child process's address space "
        "beyond its start); an upload over it gets 413.",
    )
    max_glossaries_per_key: int = Field(
        1000, ge=1, description="Glossaries a key may keep (DeepL's limit per account)."
    )
    max_glossary_bytes_per_key: int = Field(
        20 * 1024 * 1024,
        ge=1024,
        description="Bytes of glossary entries a key may keep, all its glossaries together "
        "(one glossary holds at most 10 MB, as at DeepL).",
    )

"""The service's one typed settings object.

Every knob of the service lives here, documented, read from ``HYMT_*`` environment variables
(or a ``.env`` file, or command-line flags through ``python -m service``). Nothing reads the
environment anywhere else, and no layer below the edge sees ``Settings``: ``create_app`` splits
it into the per-layer configs (``engine_config``, ``policy_config``, ``translation_config``,
``access_config``), and the engine process receives only its own.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from typing import Literal

import limits
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.access import AccessConfig
from service.documents.formats import PackageLimits
from service.documents.jobs import JobLimits
from service.documents.runner import RunnerConfig
from service.documents.service import DocumentsConfig
from service.engine.config import BatchingConfig, ContinuousConfig, EngineConfig, FastConfig
from service.engine.types import Decoding
from service.glossaries import GlossaryLimits
from service.policy.config import PolicyConfig
from service.shared import RedisConfig
from service.translation.families import ModelSpec, resolve_model
from service.translation.translator import TranslationConfig

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
Quantization = Literal["none", "nf4", "int8", "fp8"]
Device = Literal["auto", "cuda", "cpu"]
LoadFormat = Literal["auto", "dummy"]
EngineKind = Literal["auto", "static", "continuous", "fast"]


def _default_data_dir() -> Path:
    return Path.home() / ".cache" / "hunyuan-mt-service"


class Settings(BaseSettings):
    """All settings of the translation service (environment prefix ``HYMT_``)."""

    model_config = SettingsConfigDict(
        env_prefix="HYMT_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_prog_name="python -m service",
    )

    # --- HTTP server -------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Interface uvicorn binds to.")
    port: int = Field(8000, ge=1, le=65535, description="TCP port uvicorn listens on.")
    root_path: str = Field(
        "", description="Path prefix when served under a sub-path behind a proxy (e.g. /mt)."
    )
    timeout_keep_alive_s: int = Field(
        75,
        ge=1,
        description="Seconds uvicorn keeps an idle keep-alive connection. Must exceed the "
        "proxy's upstream keepalive_timeout, or idle upstream connections die under the proxy.",
    )
    max_header_bytes: int = Field(
        32 * 1024,
        ge=1024,
        description="Most bytes a request's head (request line and headers) may take; more "
        "is answered 431 and the connection closed. uvicorn has no limit of its own: a 200 MB "
        "header was read in full while /health waited 8.5 s.",
    )
    max_headers: int = Field(100, ge=10, description="Most headers a request may have (431).")
    request_head_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Longest a client may take to send a request's head; then 408 and the "
        "connection closed (a client sending a byte now and then held it open for ever).",
    )
    request_body_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Longest a client may pause between two reads of a request's body (as "
        "nginx's client_body_timeout); then 408 and the connection closed.",
    )
    listen_backlog: int = Field(
        4096,
        ge=1,
        description="Connections the kernel queues before uvicorn accepts them (capped by "
        "net.core.somaxconn). A burst larger than the queue has its excess SYNs dropped and "
        "retried by the clients after a second: an overload answered late instead of at once.",
    )
    api_processes: int = Field(
        1,
        ge=1,
        le=64,
        description="API processes answering HTTP in front of the one engine process, each "
        "on the same port (SO_REUSEPORT: the kernel spreads connections over them). One event "
        "loop answers one request after another, so several turn a flood of thousands away "
        "sooner. Each admits its share of max_queue_size and keeps its own "
        "result cache. Rate limits and quotas need one process until they are kept in Redis.",
    )
    drain_timeout_s: float = Field(
        30.0,
        ge=0,
        description="On shutdown (SIGTERM), seconds to finish queued work before exiting.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level of the service's JSON logs."
    )
    log_texts: bool = Field(
        False, description="Write request texts into logs (off: texts are user data)."
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Origins allowed by CORS; empty list keeps CORS off.",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Addresses or networks (CIDR) of the proxies whose X-Forwarded-For and "
        'X-Forwarded-Proto are believed, e.g. ["127.0.0.1"] for an Nginx on the same host. '
        "Empty: never (a client's own X-Forwarded-For would let it pick its address, and with "
        "it its rate and quota bucket).",
    )

    # --- model -------------------------------------------------------------------------------
    model_id: str | None = Field(
        None,
        description="Hugging Face id or local path of the model, e.g. tencent/Hunyuan-MT-7B. "
        "Unset: the embedded demo model (random weights, output is noise).",
    )
    model_revision: str | None = Field(
        None, description="Git revision (branch, tag or commit) of model_id on the Hub."
    )
    model_family: Literal["hunyuan-mt", "hy-mt1.5", "hy-mt2"] | None = Field(
        None,
        description="The model family (its prompt templates, chat format and options). Unset: "
        "read from model_id's name (Hunyuan-MT, HY-MT1.5, Hy-MT2; any other name is refused at "
        "start). Without model_id it picks the demo model of that family's chat format.",
    )
    add_generation_prompt: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Whether prompts end with the chat template's generation prompt. auto: as "
        "the family's README renders it (Hy-MT2 on; Hunyuan-MT and HY-MT1.5 off). Which way "
        "HY-MT1.5-1.8B was trained is not published: try both when its output looks wrong.",
    )
    model_size: Literal["1.8b", "7b", "30b-a3b"] | None = Field(
        None,
        description="The model's size within its family (the 1.8B models use another chat "
        "format, the 30B-A3B another architecture). Unset: read from model_id's name, else 7b "
        "(1.8b for a family without a 7B).",
    )
    load_format: LoadFormat = Field(
        "auto",
        description="auto = weights from model_id (or the demo model); dummy = seeded random "
        "weights of model_id's config (the shipped Hunyuan-MT-7B config when model_id is unset) "
        "with the demo tokenizer, for benchmarks without the real weights.",
    )
    dtype: Dtype = Field(
        "auto",
        description="Weights dtype; auto = bfloat16 on CUDA (float16 without bf16), "
        "float32 on CPU.",
    )
    quantization: Quantization = Field(
        "none",
        description="Weight quantization: nf4 (bitsandbytes 4-bit, double quant, compute in "
        "dtype) or int8 (LLM.int8) for the static and continuous engines, which save memory but "
        "on a large GPU add no speed; fp8 (float8 e4m3 weights with one scale per output row, "
        "torch._scaled_mm) for the fast engine, quantized at load.",
    )
    quantize_lm_head: bool = Field(
        False,
        description="With nf4/int8, quantize the output layer (lm_head) too. bitsandbytes keeps it "
        "in full precision by default for output quality; with Hunyuan-MT-7B's untied embeddings "
        "that layer is 1 GB of bf16; quantizing it takes NF4 weights from 5.21 to under 4.5 GiB.",
    )
    device: Device = Field("auto", description="auto = CUDA when present, else CPU.")
    compile_norms: Literal["auto", "on", "off"] = Field(
        "auto",
        description="torch.compile each RMSNorm of the model into one fused kernel (eight "
        "otherwise; 129 norms per token in Hunyuan-MT-7B). auto = on CUDA. Compiles during "
        "warm-up; Triton needs a C compiler on the GPU machine.",
    )
    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Folder where the demo model is built once and reused.",
    )
    warmup: bool = Field(True, description="Run one generation per prompt template before ready.")

    # --- decoding (defaults from the Hunyuan-MT model card) ---------------------------------
    greedy: bool = Field(False, description="Greedy decoding instead of sampling.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature.")
    top_k: int = Field(20, ge=0, description="Top-k sampling cut-off (0 disables it).")
    top_p: float = Field(0.6, gt=0, le=1, description="Nucleus sampling cut-off.")
    repetition_penalty: float = Field(1.05, gt=0, description="Repetition penalty.")
    max_new_tokens: int = Field(1024, ge=1, description="Upper bound of generated tokens per text.")
    output_tokens_ratio: float = Field(
        2.0,
        gt=0,
        description="Token budget per text = min(max_new_tokens, ceil(ratio * source tokens) "
        "+ output_tokens_margin). A translation is rarely longer than twice its source.",
    )
    output_tokens_margin: int = Field(
        16, ge=0, description="Constant part of the per-text token budget (see ratio)."
    )

    # --- request limits ----------------------------------------------------------------------
    max_text_chars: int = Field(
        5000,
        ge=1,
        description="Most characters in one segment; a longer text given to /translate is "
        "translated as a document (up to max_document_chars), cut into segments.",
    )
    max_document_chars: int = Field(
        50_000,
        ge=1,
        description="Most characters of a text translated as a document (POST /translate, "
        "segment by segment; each segment takes one admitted place).",
    )
    redis_url: str | None = Field(
        None,
        description="Shared state of several replicas (redis://host:6379/0): rate limits, "
        "character quotas and a second-level result cache. Unset: each process has its own.",
    )
    web_page: bool = Field(
        True, description="Serve the web page for people at / (and its files under /static/)."
    )
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
        description="Document jobs a key may hold at once (until downloaded or expired).",
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
    document_ttl_s: float = Field(
        86_400.0, gt=0, description="How long a document job and its files are kept."
    )
    document_jobs: int = Field(
        2, ge=1, description="Documents translating at once in each API process."
    )
    max_input_tokens: int = Field(
        2048, ge=1, description="Most tokens of one text (the practical limit is 8k in + out)."
    )
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        description="Most tokens of one whole prompt: the text with the glossary terms found in "
        "it, the context, style, preferences and the template; over it, 422 naming the largest "
        "part (unset: max_input_tokens + 2048).",
    )
    max_batch_items: int = Field(64, ge=1, description="Most texts in one /batch_translate.")
    max_body_bytes: int = Field(
        1_048_576, ge=1024, description="Largest request body in bytes; bigger gets 413."
    )

    # --- engine ------------------------------------------------------------------------------
    engine: EngineKind = Field(
        "auto",
        description="static = micro-batches through model.generate(); continuous = transformers' "
        "continuous batching (requests join and leave the running batch at every step); fast = "
        "the project's own engine (paged KV cache, decode steps as CUDA graphs, FlexAttention; "
        "every model of the family); auto = fast on CUDA (continuous for nf4 or int8 weights, "
        "which it does not run), static on CPU.",
    )
    cb_attention: Literal["auto", "varlen", "sdpa"] = Field(
        "auto",
        description="Continuous batching: attention kernel. varlen = torch's built-in "
        "FlashAttention-2 varlen kernel, each request attending to its own keys only (CUDA; a "
        "per-request SDPA loop elsewhere); sdpa = transformers' default, one masked attention over "
        "every request's keys; auto = varlen on CUDA GPUs that run the kernel (compute "
        "capability 8.0+, i.e. not a T4; float16/bfloat16), sdpa elsewhere.",
    )
    cb_cuda_graph: Literal["auto", "on", "off"] = Field(
        "auto", description="Continuous batching: CUDA graphs for the decode and prefill steps."
    )
    cb_kv_padding: int | None = Field(
        None,
        ge=64,
        description="Continuous batching with CUDA graphs: key/value lengths are padded to a "
        "multiple of this many tokens so captured graphs can be replayed (unset: transformers' "
        "16,384). Smaller pads less for a few short requests, at the cost of more graphs.",
    )
    cb_max_batch_tokens: int | None = Field(
        None, ge=1, description="Continuous batching: most tokens per step (unset: from memory)."
    )
    cb_max_requests_per_batch: int | None = Field(
        None, ge=1, description="Continuous batching: most requests per step (unset: automatic)."
    )
    cb_compile_level: int = Field(
        0,
        ge=0,
        le=3,
        description="Continuous batching: transformers' torch.compile of the whole step (0 = "
        "none, 1-3). transformers applies it with sdpa attention only: with varlen it compiles "
        "nothing (compile_norms is what is compiled there).",
    )
    cb_max_memory_percent: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Continuous batching: share of free GPU memory for the KV cache (unset: auto).",
    )
    cb_num_blocks: int | None = Field(
        None,
        ge=1,
        description="Continuous batching: KV-cache pages of 256 tokens, an explicit memory "
        "budget (unset: sized from free memory, on CPU from free RAM).",
    )

    fast_page_size: int = Field(
        128, ge=16, description="Fast engine: tokens per KV-cache page (a multiple of 16)."
    )
    fast_num_pages: int | None = Field(
        None,
        ge=2,
        description="Fast engine: KV-cache pages, an explicit memory budget (unset: "
        "fast_memory_fraction of the GPU memory free after loading; required on a CPU).",
    )
    fast_memory_fraction: float = Field(
        0.85,
        gt=0,
        lt=1,
        description="Fast engine: share of the GPU memory free after loading that the KV cache "
        "takes, once the widest step's sampling buffers and prefill activations are set aside "
        "(the rest holds graphs, activations and sampling buffers).",
    )
    fast_max_rows: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Fast engine: most requests decoding at once (unset: 1,024 on CUDA, halved "
        "until the KV cache holds a page per row, 64 elsewhere); more wait inside the engine.",
    )
    fast_prefill_tokens: int | None = Field(
        None,
        ge=16,
        description="Fast engine: most prompt tokens per prefill step; a longer prompt is "
        "prefilled in chunks between decode steps (unset: 8,192 on CUDA, 512 elsewhere).",
    )
    fast_cuda_graph: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Fast engine: decode steps as CUDA graphs (auto = on CUDA, but for a "
        "mixture-of-experts model outside bf16, whose grouped GEMM reads back to the host).",
    )
    fast_compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Fast engine: torch.compile of the decode layer and its FlexAttention kernel "
        "(auto = on CUDA); compiled kernels are cached under data_dir/compile-cache.",
    )
    fast_compile_scope: Literal["layer", "step"] = Field(
        "layer",
        description="Fast engine: what one compiled unit covers. layer = one decode layer, "
        "reused by all (quick to compile); step = the whole stack of layers (inductor may also "
        "fuse across layers; compiles for longer).",
    )
    fast_decode_shapes: Literal["static", "dynamic"] = Field(
        "static",
        description="Fast engine: static compiles the decode step once per batch-size bucket "
        "(kernels specialised to each batch size: the batches between 2 and 768 rows run "
        "faster; a cold start compiles a graph per bucket and takes longer); dynamic compiles "
        "the largest bucket for its size and one graph with a symbolic batch size for the "
        "others.",
    )
    fast_fused_rope: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Fast engine: auto runs each decode layer's RoPE, query/key norms and KV "
        "cache writes as one Triton kernel where it runs (bf16 or fp16 on CUDA) instead of "
        "three compiled ones; on forces it (refusing to start without Triton; a CPU runs it only "
        "in Triton's interpreter); off keeps the compiled torch code.",
    )
    fast_pdl: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Fast engine: a lone request's decode layers launch the engine's own "
        "kernels with programmatic dependent launch, each kernel's launch overlapping the end "
        "of the one before (inside the CUDA graph). Needs the step to run those kernels only: "
        "the fused RoPE, every norm folded (HYMT_FAST_FOLD_NORMS, a dense model), the Triton "
        "decode attention, CUDA graphs on a GPU of compute capability 9.0+, Triton 3.4+ (auto: "
        "where all of that holds; on: refuses to start otherwise).",
    )
    fast_fold_norms: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Fast engine: folds each RMSNorm's weight into the projection after it, "
        "so a lone request's one-row kernel applies the norm itself (bf16 or fp16 on CUDA). "
        "auto: where every norm folds (a dense model, not an FP8 checkpoint) and a lone "
        "request's layers launch with HYMT_FAST_PDL, each projection that writes a norm's row "
        "adding up its squares for the next one (no norm kernels in the step); on: also "
        "elsewhere (without PDL, or in a mixture-of-experts model, where the reading kernel "
        "sums the squares itself), which measured slower than the norm kernels on the H200. "
        "Rounds the folded weights once more.",
    )
    fast_attention: Literal["auto", "triton", "flex", "gather"] = Field(
        "auto",
        description="Fast engine: decode attention. triton = the engine's own kernel for "
        "batches of up to fast_triton_attention_rows rows, FlexAttention above; flex = "
        "FlexAttention over the paged cache at every batch size; gather = each row's pages "
        "copied out for SDPA (exact, slower); auto = triton for bf16 or fp16 on CUDA, flex for "
        "float32 on CUDA, gather elsewhere.",
    )
    fast_triton_attention_rows: int = Field(
        16,
        ge=1,
        description="Fast engine: the largest decode batch that takes the Triton decode "
        "attention (fast_attention triton or auto); larger batches take FlexAttention.",
    )

    # --- access ------------------------------------------------------------------------------
    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description="Accepted API keys (JSON list); with none here or in api_keys_file, no key "
        "is required. Clients send Authorization: Bearer <key>.",
    )
    api_keys_file: Path | None = Field(
        None, description="File of accepted API keys, one per line (# starts a comment)."
    )
    rate_limit: str | None = Field(
        None,
        description="Requests per client (API key, or address without keys) and window, in the "
        "limits library's notation, e.g. '120/minute'. Unset: no limit.",
    )
    char_quota: str | None = Field(
        None,
        description="Characters of text per client and window, e.g. '200000/hour'. Unset: none.",
    )

    # --- reliability -------------------------------------------------------------------------
    request_timeout_s: float = Field(
        100.0,
        gt=0,
        description="Deadline of a translation request; clients may lower it with the "
        "X-Request-Timeout header (seconds). Past it: 504, and queued work is dropped. Keep it "
        "under the proxy's proxy_read_timeout (120 s in deploy/nginx).",
    )
    min_request_timeout_s: float = Field(
        0.1,
        gt=0,
        description="Smallest X-Request-Timeout a client may send; below it the request is "
        "refused with 422 (a deadline that cannot be met is a client error, not a 504).",
    )
    stall_timeout_s: float = Field(
        300.0,
        gt=0,
        description="An engine that holds work and generates nothing (no token, no model step) "
        "for this long is stalled: requests in it fail with 503, it is killed and restarted.",
    )
    engine_heartbeat_timeout_s: float = Field(
        1.0,
        gt=0,
        description="An engine process not heard from for this long (it reports every 100 ms) "
        "is hung: killed and restarted.",
    )
    engine_start_timeout_s: float = Field(
        1800.0, gt=0, description="Longest the engine process may take from start to ready."
    )
    engine_max_restarts: int = Field(
        3,
        ge=0,
        description="Engine restarts allowed within 10 minutes (after it died, hung or "
        "stalled); one more and the service exits with status 1 for its orchestrator.",
    )
    prepare_workers: int | None = Field(
        None,
        ge=1,
        description="Worker processes that detect languages and tokenize, off the API "
        "process's event loop (unset: a quarter of the CPU cores, 1 to 8, shared out over the API "
        "processes, at least 1 each).",
    )

    prepare_niceness: int = Field(
        10,
        ge=0,
        le=19,
        description="Added to the preparation workers' nice value: when a burst's admitted "
        "texts reach them all at once, the kernel runs the API processes' event loops (refusals, "
        "probes) first (0 = same priority).",
    )

    # --- micro-batching ----------------------------------------------------------------------
    max_batch_size: int = Field(32, ge=1, description="Most texts the worker runs in one batch.")
    max_batch_tokens: int = Field(
        32768,
        ge=1,
        description="Most padded prompt tokens in one batch (rows x longest prompt), which "
        "bounds the memory a batch's prefill takes.",
    )
    max_wait_ms: float = Field(
        5.0, ge=0, description="Longest a queued text waits for a batch to fill."
    )
    max_queue_size: int = Field(
        1024,
        ge=1,
        description="Most texts admitted and not yet answered (waiting or generating); beyond "
        "it, and for requests that could not finish inside their deadline, 429 at once.",
    )

    # --- result cache ------------------------------------------------------------------------
    cache_size: int = Field(10_000, ge=0, description="Most cached translations (0 = no cache).")
    cache_ttl_s: float = Field(3600.0, gt=0, description="Seconds a cached translation lives.")

    @field_validator("trusted_proxies")
    @classmethod
    def _check_proxies(cls, value: list[str]) -> list[str]:
        for entry in value:
            ipaddress.ip_network(entry, strict=False)  # raises ValueError when not an address
        return value

    @field_validator("rate_limit", "char_quota")
    @classmethod
    def _check_rate(cls, value: str | None) -> str | None:
        if value is not None:
            limits.parse(value)  # raises ValueError on a malformed rate
        return value

    @model_validator(mode="after")
    def _check_batch_limits(self) -> Settings:
        if self.max_input_tokens > self.max_batch_tokens:
            raise ValueError("max_input_tokens must not exceed max_batch_tokens")
        if self.max_prompt_tokens is not None and self.max_input_tokens > self.max_prompt_tokens:
            raise ValueError("max_input_tokens must not exceed max_prompt_tokens")
        return self

    @model_validator(mode="after")
    def _check_api_processes(self) -> Settings:
        if self.api_processes == 1:
            return self
        if (self.rate_limit is not None or self.char_quota is not None) and not self.redis_url:
            # Each process would count on its own: a client would get api_processes times
            # the limit it was given.
            raise ValueError("rate_limit and char_quota need api_processes=1 or redis_url")
        if not hasattr(socket, "SO_REUSEPORT"):
            raise ValueError("api_processes > 1 needs SO_REUSEPORT (Linux, BSD, macOS)")
        if self.max_queue_size < self.api_processes:
            raise ValueError("max_queue_size must be at least api_processes")
        return self

    @model_validator(mode="after")
    def _check_model(self) -> Settings:
        try:
            self.model_spec()
        except ValueError as error:
            raise ValueError(f"model: {error}") from None
        return self

    @model_validator(mode="after")
    def _check_engine_settings(self) -> Settings:
        kind = self.engine
        if kind != "auto":
            self.engine_config().check_kind(kind)
        return self

    @property
    def preparation_workers(self) -> int:
        if self.prepare_workers is not None:
            return self.prepare_workers
        # The quarter of the cores is shared by all API processes: each has workers of its own.
        return max(1, min(8, (os.cpu_count() or 2) // 4) // self.api_processes)

    @property
    def uses_demo_model(self) -> bool:
        return self.model_id is None

    def model_spec(self) -> ModelSpec:
        """The family and size served (validated when the settings are built)."""
        return resolve_model(self.model_id, self.model_family, self.model_size)

    def decoding(self) -> Decoding:
        """The settings' decoding; the family's own defaults for what is not set (the
        Hy-MT2-30B-A3B samples differently from the other models)."""
        default = self.model_spec().decoding
        given = self.model_fields_set
        return Decoding(
            greedy=self.greedy,
            temperature=self.temperature if "temperature" in given else default.temperature,
            top_k=self.top_k if "top_k" in given else default.top_k,
            top_p=self.top_p if "top_p" in given else default.top_p,
            repetition_penalty=(
                self.repetition_penalty
                if "repetition_penalty" in given
                else default.repetition_penalty
            ),
        )

    def engine_config(self) -> EngineConfig:
        """All the engine process receives."""
        given = self.model_fields_set
        spec = self.model_spec()
        return EngineConfig(
            model_id=self.model_id,
            model_revision=self.model_revision,
            chat_format=spec.chat_format,
            shipped_config=spec.shipped_config,
            add_generation_prompt=(
                spec.add_generation_prompt
                if self.add_generation_prompt == "auto"
                else self.add_generation_prompt == "on"
            ),
            load_format=self.load_format,
            dtype=self.dtype,
            quantization=self.quantization,
            quantize_lm_head=self.quantize_lm_head,
            device=self.device,
            compile_norms=self.compile_norms,
            data_dir=self.data_dir,
            engine=self.engine,
            decoding=self.decoding(),
            max_new_tokens=self.max_new_tokens,
            batching=BatchingConfig(
                max_batch_size=self.max_batch_size,
                max_batch_tokens=self.max_batch_tokens,
                max_wait_s=self.max_wait_ms / 1000,
            ),
            continuous=ContinuousConfig(
                attention=self.cb_attention,
                cuda_graph=self.cb_cuda_graph,
                kv_padding=self.cb_kv_padding,
                max_batch_tokens=self.cb_max_batch_tokens,
                max_requests_per_batch=self.cb_max_requests_per_batch,
                compile_level=self.cb_compile_level,
                max_memory_percent=self.cb_max_memory_percent,
                num_blocks=self.cb_num_blocks,
            ),
            fast=FastConfig(
                page_size=self.fast_page_size,
                num_pages=self.fast_num_pages,
                memory_fraction=self.fast_memory_fraction,
                max_rows=self.fast_max_rows,
                prefill_tokens=self.fast_prefill_tokens,
                cuda_graph=self.fast_cuda_graph,
                compile=self.fast_compile,
                compile_scope=self.fast_compile_scope,
                decode_shapes=self.fast_decode_shapes,
                fold_norms=self.fast_fold_norms,
                fused_rope=self.fast_fused_rope,
                pdl=self.fast_pdl,
                attention=self.fast_attention,
                triton_attention_rows=self.fast_triton_attention_rows,
            ),
            static_only=tuple(sorted(given & _STATIC_ONLY)),
            continuous_only=tuple(sorted(name for name in given if name.startswith("cb_"))),
            fast_only=tuple(sorted(name for name in given if name.startswith("fast_"))),
            log_level=self.log_level,
        )

    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(
            max_in_flight=self.max_queue_size,
            processes=self.api_processes,
            request_timeout_s=self.request_timeout_s,
            min_request_timeout_s=self.min_request_timeout_s,
            stall_timeout_s=self.stall_timeout_s,
            heartbeat_timeout_s=self.engine_heartbeat_timeout_s,
            start_timeout_s=self.engine_start_timeout_s,
            max_restarts=self.engine_max_restarts,
        )

    def translation_config(self) -> TranslationConfig:
        return TranslationConfig(
            decoding=self.decoding(),
            max_text_chars=self.max_text_chars,
            max_input_tokens=self.max_input_tokens,
            max_prompt_tokens=self.max_prompt_tokens or self.max_input_tokens + 2048,
            max_batch_items=self.max_batch_items,
            max_new_tokens=self.max_new_tokens,
            output_tokens_ratio=self.output_tokens_ratio,
            output_tokens_margin=self.output_tokens_margin,
            log_texts=self.log_texts,
            cache_size=self.cache_size,
            cache_ttl_s=self.cache_ttl_s,
            warmup=self.warmup,
            prepare_niceness=self.prepare_niceness,
            family=self.model_spec().family.name,
            max_document_chars=self.max_document_chars,
            think_tags=self.model_spec().chat_format == "hy-v3",
        )

    def redis_config(self) -> RedisConfig:
        return RedisConfig(url=self.redis_url, cache_ttl_s=self.cache_ttl_s)

    def glossary_limits(self) -> GlossaryLimits:
        return GlossaryLimits(
            max_glossaries=self.max_glossaries_per_key,
            max_bytes=self.max_glossary_bytes_per_key,
        )

    def documents_config(self) -> DocumentsConfig:
        return DocumentsConfig(
            max_file_bytes=self.max_file_bytes,
            max_file_chars=self.max_file_chars,
            chunk_chars=self.max_document_chars,
            package=PackageLimits(max_unpacked_bytes=self.max_unpacked_bytes),
            public_origin=self.public_origin,
            limits=JobLimits(
                max_jobs_per_owner=self.max_documents_per_key, ttl_s=self.document_ttl_s
            ),
            runner=RunnerConfig(
                max_running=self.document_jobs, unit_timeout_s=self.request_timeout_s
            ),
        )

    def access_config(self) -> AccessConfig:
        keys = [key.get_secret_value() for key in self.api_keys]
        if self.api_keys_file is not None:
            lines = self.api_keys_file.read_text("utf-8").splitlines()
            keys += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        return AccessConfig(
            api_keys=tuple(keys), rate_limit=self.rate_limit, char_quota=self.char_quota
        )


# Settings only the static micro-batching engine reads.
_STATIC_ONLY = frozenset({"max_batch_size", "max_batch_tokens", "max_wait_ms"})

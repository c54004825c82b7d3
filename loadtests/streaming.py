"""Streaming benchmark: time to the first token and to the full text for a 2,000-word document
through ``POST /translate/stream``, beside the same document through ``POST /translate`` and a
one-sentence text streamed.

The service is started as ``loadtests.bench`` starts it (``--env`` settings, e.g.
``HYMT_LOAD_FORMAT=dummy``); each request is sent alone, one after the other, so the figures
are latencies of one person's request on an otherwise idle service.

    python -m loadtests.streaming --out results/ --env HYMT_LOAD_FORMAT=dummy \\
        --env HYMT_CACHE_SIZE=0
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import httpx

from loadtests.bench import start_service, stop_service
from loadtests.loadgen import percentile
from service.engine.corpus import corpus_texts


def document(words: int, paragraph_words: int = 100) -> str:
    """An English document of exactly ``words`` words in paragraphs of about
    ``paragraph_words``, from the shipped corpus's English sentences."""
    english = [s for s in corpus_texts() if s.isascii() and len(s.split()) >= 5]
    out: list[str] = []
    count = 0
    paragraph: list[str] = []
    index = 0
    while count < words:
        sentence = english[index % len(english)].split()[: words - count]
        index += 1
        paragraph.append(" ".join(sentence))
        count += len(sentence)
        if sum(len(s.split()) for s in paragraph) >= paragraph_words:
            out.append(" ".join(paragraph))
            paragraph = []
    if paragraph:
        out.append(" ".join(paragraph))
    return "\n\n".join(out) + "\n"


def stream_once(client: httpx.Client, url: str, text: str, target: str) -> dict[str, float]:
    started = time.perf_counter()
    first = None
    pieces = 0
    done: dict[str, object] = {}
    body = {"text": text, "target_lang": target, "source_lang": "en"}
    with client.stream("POST", f"{url}/translate/stream", json=body, timeout=600) as response:
        response.raise_for_status()
        buffer = ""
        for chunk in response.iter_text():
            buffer += chunk
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                name = block.split("\n", 1)[0].removeprefix("event: ")
                if name == "piece":
                    pieces += 1
                    if first is None:
                        first = time.perf_counter() - started
                elif name == "done":
                    done = json.loads(block.split("data: ", 1)[1])
                elif name == "error":
                    raise RuntimeError(block)
    total = time.perf_counter() - started
    usage = done.get("usage", {})
    assert isinstance(usage, dict)
    return {
        "first_token_s": round(first if first is not None else total, 4),
        "full_text_s": round(total, 4),
        "pieces": pieces,
        "output_tokens": int(usage.get("output_tokens", 0)),
    }


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(prog="python -m loadtests.streaming", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the service")
    parser.add_argument("--words", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--label", default="streaming")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(setting.split("=", 1) for setting in args.env)
    text = document(args.words)
    report: dict[str, object] = {
        "words": len(text.split()),
        "characters": len(text),
        "paragraphs": text.count("\n\n") + 1,
        "sentences": len(re.findall(r"[.!?](\s|$)", text)),
    }
    path = args.out / f"{args.label}.json"
    process, url, timings = start_service(env, args.out / f"{args.label}.log")
    report.update(timings)
    try:
        with httpx.Client(trust_env=False) as client:
            runs = [stream_once(client, url, f"({n}) {text}", "de") for n in range(args.repeats)]
            report["document_stream"] = runs
            for key in ("first_token_s", "full_text_s"):
                values = [run[key] for run in runs]
                report[f"document_{key}_p50"] = round(percentile(values, 0.5), 4)
                report[f"document_{key}_max"] = round(max(values), 4)
            whole = []
            for n in range(max(1, args.repeats // 2)):
                started = time.perf_counter()
                response = client.post(
                    f"{url}/translate",
                    json={"text": f"[{n}] {text}", "target_lang": "de", "source_lang": "en"},
                    timeout=600,
                )
                response.raise_for_status()
                whole.append(round(time.perf_counter() - started, 4))
            report["document_translate_s"] = whole
            lone = [
                stream_once(client, url, f"Good morning, this is request {n}.", "de")
                for n in range(args.repeats)
            ]
            report["sentence_stream"] = lone
            report["sentence_first_token_s_p50"] = round(
                percentile([run["first_token_s"] for run in lone], 0.5), 4
            )
            path.write_text(json.dumps(report, indent=2))
    finally:
        stop_service(process)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()

"""Does the in-graph tokenizer (onnxruntime-extensions) give the ids that ``tokenizers`` gives?

``python -m export.tokenizer_parity`` builds a deterministic corpus of varied texts (English
sentences from the Python standard library's docstrings, then the same with accents, upper
case, CJK, emoji, URLs, other scripts, odd whitespace and control characters, plus very long
texts, empty and whitespace-only strings), tokenizes every text both ways, and reports per kind
the share of identical id sequences. Where ids differ it embeds both id sequences with the
encoder and reports the cosine between the two vectors: how much a difference matters.

Example: ``python -m export.tokenizer_parity --count 10000 --json results/tokenizer_parity.json``
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from export import minilm, text_graph
from pipelines import embedding, onnx_runner, padding, tokenization

DOC_MODULES = [
    "argparse",
    "asyncio",
    "base64",
    "collections",
    "contextlib",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email.message",
    "enum",
    "fractions",
    "functools",
    "gzip",
    "hashlib",
    "heapq",
    "html",
    "http.client",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "logging",
    "os",
    "pathlib",
    "pickle",
    "queue",
    "random",
    "re",
    "shutil",
    "socket",
    "sqlite3",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "time",
    "typing",
    "unittest",
    "urllib.parse",
    "uuid",
    "xml.etree.ElementTree",
    "zipfile",
]
ACCENTS = dict(zip("aeiouncAEIOUNC", "áéîöüñçÁÉÎÖÜÑÇ", strict=True))
OTHER_SCRIPTS = (
    "Привет, как дела?",
    "Καλημέρα κόσμε",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "שלום עולם",
    "สวัสดีชาวโลก",
    "안녕하세요 세계",
    "こんにちは世界",
    "Tiếng Việt có dấu",
)
ODD_SPACES = ("\t", "\n", "\r\n", "\u00a0", "\u2009", "\u200b", "\u3000", "  ")
CONTROLS = ("\x00", "\x07", "\x1b", "\ufeff", "\u200d", "\ufffd", "\u0301")


def english_sentences() -> list[str]:
    """Sentences from standard-library docstrings: real English with code words, deduplicated."""
    seen: dict[str, None] = {}
    for name in DOC_MODULES:
        module = importlib.import_module(name)
        docs = [module.__doc__ or ""]
        for attr in sorted(vars(module)):
            docs.append(getattr(getattr(module, attr, None), "__doc__", None))
        for doc in (d for d in docs if isinstance(d, str)):
            for sentence in re.split(r"(?<=[.!?])\s+", " ".join(doc.split())):
                if 3 <= len(sentence.split()) <= 60:
                    seen.setdefault(sentence, None)
    return list(seen)


def _random_chars(rng: random.Random, low: int, high: int, n: int) -> str:
    return "".join(chr(rng.randint(low, high)) for _ in range(n))


def corpus(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """``count`` (kind, text) pairs: a third plain English, the rest variations and edge cases."""
    rng = random.Random(seed)
    base = english_sentences()
    rng.shuffle(base)

    def pick() -> str:
        return base[rng.randrange(len(base))]

    def words_with(insert: str) -> str:
        words = pick().split()
        words.insert(rng.randrange(len(words) + 1), insert)
        return " ".join(words)

    makers = {
        "accents": lambda: "".join(ACCENTS.get(c, c) if rng.random() < 0.3 else c for c in pick()),
        "upper case": lambda: pick().upper(),
        "cjk": lambda: words_with(_random_chars(rng, 0x4E00, 0x9FFF, rng.randint(1, 8))),
        "emoji": lambda: words_with(_random_chars(rng, 0x1F300, 0x1FAFF, rng.randint(1, 4))),
        "url": lambda: words_with(
            f"https://{rng.choice(['example.com', 'x.org', 'a-b.io'])}/"
            f"{rng.randint(0, 9999)}?q={rng.choice(['a', 'b%20c', 'ü'])}&n={rng.randint(1, 99)}"
        ),
        "other scripts": lambda: words_with(rng.choice(OTHER_SCRIPTS)),
        "odd whitespace": lambda: rng.choice(ODD_SPACES).join(pick().split()),
        "control characters": lambda: words_with(rng.choice(CONTROLS)),
        "numbers and symbols": lambda: words_with(
            f"{rng.uniform(-1e6, 1e6):,.3f} {rng.choice('$€£¥%#@&*~^')}{rng.randint(0, 999)}"
        ),
        "long (over 256 word pieces)": lambda: " ".join(pick() for _ in range(rng.randint(20, 80))),
    }
    plain = [("plain English", pick()) for _ in range(count // 3)]
    edge = [("empty", ""), ("whitespace only", " \t\n ")] * 5
    rest = count - len(plain) - len(edge)
    kinds = list(makers)
    varied = [(kind, makers[kind]()) for kind in (kinds[i % len(kinds)] for i in range(rest))]
    return plain + varied + edge


def measure(texts: list[tuple[str, str]], encoder: Path) -> dict:
    """Per kind: texts, identical ids, and the cosines of embeddings where ids differ."""
    tokenizer = onnx_runner.create_session(
        text_graph.tokenizer_model().SerializeToString(), custom_ops=True
    )
    session = onnx_runner.create_session(encoder, intra_op_threads=2)
    rows: dict[str, dict] = defaultdict(lambda: {"texts": 0, "identical": 0, "cosines": []})
    examples = []
    for kind, text in texts:
        feeds = {embedding.TEXT: np.array([[text]], dtype=object)}
        graph_ids, graph_mask = tokenizer.run(None, feeds)
        got = [int(i) for i in graph_ids[0][graph_mask[0] == 1]]
        want = tokenization.encode([text])[0][0]
        row = rows[kind]
        row["texts"] += 1
        if got == want:
            row["identical"] += 1
            continue
        vectors = [
            onnx_runner.run(
                session,
                {embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask},
                [embedding.EMBEDDING],
            )[0][0]
            for ids, mask in (padding.pad([want]), padding.pad([got]))
        ]
        row["cosines"].append(float(np.dot(*vectors)))
        if len(examples) < 12:
            examples.append(
                {"kind": kind, "text": text[:120], "tokenizers": want[:24], "graph": got[:24]}
            )
    report = {}
    for kind, row in rows.items():
        cos = row.pop("cosines")
        report[kind] = {
            **row,
            "identical_rate": row["identical"] / row["texts"],
            "cosine_min_where_different": min(cos) if cos else None,
            "cosine_median_where_different": float(np.median(cos)) if cos else None,
        }
    total = sum(r["texts"] for r in report.values())
    same = sum(r["identical"] for r in report.values())
    return {"total": total, "identical": same, "by_kind": report, "examples": examples}


def main(argv: list[str] | None = None) -> int:
    """Build the corpus, compare, print a table; ``--json`` writes the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--encoder", type=Path, default=minilm.DEFAULT_OUTPUT)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = measure(corpus(args.count), args.encoder)
    print(f"{'kind':30s} {'texts':>6s} {'identical':>10s}  cosine where different (min / median)")
    for kind, row in result["by_kind"].items():
        cos = (
            f"{row['cosine_min_where_different']:.5f} / {row['cosine_median_where_different']:.5f}"
            if row["cosine_min_where_different"] is not None
            else "-"
        )
        print(f"{kind:30s} {row['texts']:6d} {row['identical_rate']:10.2%}  {cos}")
    print(f"all: {result['identical']} of {result['total']} identical")
    for example in result["examples"]:
        print(json.dumps(example, ensure_ascii=False))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Texts the embedding benchmarks encode (Ray-free)."""

from __future__ import annotations

import json

from longrag.data import DPR_PASSAGES, data_path, open_text


def chunk_texts(n: int, per_chunk: int = 2) -> list[str]:
    """``n`` chunk-sized texts: the bundled DPR passages joined ``per_chunk`` at a time (the first one's
    title line kept, the others' dropped), cycled. Two passages make ~270 tokens, which fills the bundled
    MiniLM's 256-token input the way the chunker's chunks do."""
    with open_text(data_path(DPR_PASSAGES)) as f:
        passages = [json.loads(line)["contents"] for line in f if line.strip()]  # '"Title"\ntext'
    groups = [passages[i:i + per_chunk] for i in range(0, len(passages) - per_chunk + 1, per_chunk)]
    joined = [" ".join([g[0], *(p.partition("\n")[2] for p in g[1:])]) for g in groups]
    return [joined[i % len(joined)] for i in range(n)]

"""The encoder as OpenVINO IR files, run without torch: the serving replicas' question encoder.

A replica that only encodes questions (the Ingress of the single-machine profile, a ``QueryEncoder``)
needs the model's forward pass, not torch: loading sentence-transformers costs ~600 MB of resident
memory, mostly torch. :func:`export_ir` (with torch, once per model and settings) writes a folder that
:class:`IREncoder` runs with the ``openvino`` and ``tokenizers`` packages alone:

- ``model.xml`` / ``model.bin``: the whole sentence-transformers module stack (transformer, pooling,
  dense layers, the model's own normalization) exported with ``torch.export`` (batch and length dynamic)
  and converted by ``openvino.convert_model``, weights kept float32;
- ``tokenizer.json`` / ``tokenizer_settings.json``: :meth:`PassageTokenizer.save`;
- ``encoder.json``: the model, its dimension, and probe texts with the vectors torch gave them. A load
  encodes the probes again and refuses the folder unless every cosine is >= :data:`MIN_COSINE`.

The folder lives in the model cache (:func:`ir_folder`, keyed by the model's files, the settings that
change its tokens, and the openvino version). :func:`ensure_ir` exports in a subprocess when the folder is
missing, so the calling process never imports torch; ``python -m longrag.index.openvino_ir --model NAME``
does it ahead (an image build, ``make demo``'s index phase).

What the Matryoshka cut (``embedding.dim``) and ``embedding.normalize`` do is applied after the graph, as
:meth:`longrag.index.embedding.Embedder._finish` does. ``embedding.backend`` picks this runtime
(``auto``: on CPUs) through :func:`longrag.index.encoders.encoder`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from longrag.config import EmbeddingConfig
from longrag.index.runtime import l2_normalized

FORMAT = 1
"""Bumped when the folder's layout or the export changes (part of the key)."""
MIN_COSINE = 0.9999
"""A loaded folder's probe vectors against torch's, per probe."""
PROBES = ("Who wrote the novel Animal Farm?", "What is the capital of Angola?",
          "Apollo 11 was the American spaceflight that first landed humans on the Moon. " * 40)
"""Short, medium and over-long (truncated) texts."""
EXPORT_TIMEOUT_S = 900


def openvino_available() -> bool:
    from importlib.util import find_spec

    return find_spec("openvino") is not None


def ir_key(config: EmbeddingConfig) -> str:
    """What the folder depends on: the model's identity (the vector cache's), the input limit, the prompts, the openvino and
    sentence-transformers versions, :data:`FORMAT`."""
    from importlib.metadata import PackageNotFoundError, version

    from longrag.index.embedding import embedding_prompts, resolve_embedding_model
    from longrag.index.vector_cache import model_identity

    spec = resolve_embedding_model(config.model)

    def v(pkg: str) -> str:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return "-"

    parts = [FORMAT, model_identity(spec), config.max_seq_length, *embedding_prompts(config, spec),
             v("openvino"), v("sentence-transformers"), v("tokenizers")]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def ir_folder(config: EmbeddingConfig, root: str | Path | None = None) -> Path:
    """``<model cache>/openvino/<model>-<key>`` (``$LONGRAG_MODEL_CACHE``, ~/.cache/longrag/models)."""
    from longrag.index.embedding import resolve_embedding_model
    from longrag.models.bundled import model_cache_dir

    base = Path(root) if root is not None else model_cache_dir() / "openvino"
    name = resolve_embedding_model(config.model).name.replace("/", "--")
    return base / f"{name}-{ir_key(config)}"


def _complete(folder: Path) -> bool:
    return all((folder / f).is_file() for f in ("model.xml", "model.bin", "tokenizer.json", "encoder.json"))


def export_ir(config: EmbeddingConfig, folder: str | Path) -> Path:
    """Export the encoder of ``config`` (torch, sentence-transformers, openvino needed) to ``folder``,
    written beside it and renamed into place, so a reader never sees half a folder; a folder another
    process finished first is kept."""
    import openvino as ov
    import torch
    from torch.export import Dim

    from longrag.index.embedding import Embedder
    from longrag.index.tokenized import PassageTokenizer

    folder = Path(folder)
    cfg = config.model_copy(update={"device": "cpu", "dtype": "float32", "backend": "torch", "quantize": "none",
                                    "dim": None, "vector_cache": False})
    embedder = Embedder(cfg)
    stack = embedder.model

    class Stack(torch.nn.Module):
        """The sentence-transformers modules in order, ids and mask in, ``sentence_embedding`` out."""

        def __init__(self) -> None:
            super().__init__()
            self.stack = stack

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            features = {"input_ids": input_ids, "attention_mask": attention_mask}
            for module in self.stack:
                features = module(features)
            return features["sentence_embedding"]

    tokenizer = PassageTokenizer(cfg, role="query")
    example = tokenizer.pad(tokenizer.token_ids(["a sentence", "another, longer sentence"]))
    limit = max(tokenizer.max_seq_length, 16)
    shape = {0: Dim("batch", min=1, max=1 << 16), 1: Dim("tokens", min=2, max=limit)}
    args = (torch.from_numpy(example["input_ids"]), torch.from_numpy(example["attention_mask"]))
    with torch.no_grad():
        exported = torch.export.export(Stack().eval(), args, dynamic_shapes=(shape, shape), strict=False)
        converted = ov.convert_model(exported)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        ov.save_model(converted, str(tmp / "model.xml"), compress_to_fp16=False)
        tokenizer.save(tmp)
        probes = embedder.encode_queries(list(PROBES))
        meta = {"format": FORMAT, "model": embedder.spec.name, "dim": embedder.dim,
                "max_seq_length": tokenizer.max_seq_length, "probes": list(PROBES),
                "probe_vectors": probes.round(7).tolist(), "openvino": ov.__version__}
        (tmp / "encoder.json").write_text(json.dumps(meta))
        try:
            tmp.rename(folder)
        except OSError:
            if not _complete(folder):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


_EXPORT_LOCK = threading.Lock()


def ensure_ir(config: EmbeddingConfig, root: str | Path | None = None) -> Path:
    """The IR folder of ``config``, exported first in a subprocess when missing (torch stays out of
    this process; processes of one machine export it once, the others wait on a file lock). Raises
    RuntimeError with the subprocess' last output when the export fails."""
    from filelock import FileLock

    folder = ir_folder(config, root)
    if _complete(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    # one export per machine: the processes that start together (a build's embedding actors) wait for it
    with _EXPORT_LOCK, FileLock(str(folder) + ".lock", timeout=EXPORT_TIMEOUT_S):
        if _complete(folder):
            return folder
        import longrag

        env = dict(os.environ)
        here = str(Path(longrag.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-m", "longrag.index.openvino_ir", "--config-json", config.model_dump_json()]
        if root is not None:
            cmd += ["--root", str(root)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
        if done.returncode != 0 or not _complete(folder):
            tail = (done.stderr or done.stdout or "")[-2000:]
            raise RuntimeError(f"exporting {config.model} to OpenVINO IR failed (exit {done.returncode}): {tail}")
        return folder


class IREncoder:
    """:class:`longrag.index.embedding.Embedder`'s ``encode_queries`` / ``encode_passages`` over an IR folder,
    without torch. ``threads``: OpenVINO's inference threads (one request per call, so concurrent callers
    never share one)."""

    def __init__(self, config: EmbeddingConfig | None = None, *, folder: str | Path | None = None,
                 threads: int = 1) -> None:
        import openvino as ov

        from longrag.index.embedding import embedding_dim
        from longrag.index.runtime import check_runtime, resolve_dtype
        from longrag.index.tokenized import PassageTokenizer

        self.config = config or EmbeddingConfig()
        device = "cpu" if self.config.device == "auto" else self.config.device
        check_runtime(self.config.model_copy(update={"backend": "openvino-ir"}), device,
                      resolve_dtype(self.config.dtype, device))
        self.folder = Path(folder) if folder is not None else ensure_ir(self.config)
        self.meta = json.loads((self.folder / "encoder.json").read_text())
        self.queries = PassageTokenizer.load(self.folder, self.config, role="query")
        self.passages = PassageTokenizer.load(self.folder, self.config, role="passage")
        self._compiled = ov.Core().compile_model(str(self.folder / "model.xml"), "CPU", {
            "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": int(threads), "PERFORMANCE_HINT": "LATENCY"})
        self._output = self._compiled.output(0)
        cut = embedding_dim(self.config) if self.config.dim is not None else None  # checks a Matryoshka cut
        self._dim = int(cut or self.meta["dim"])
        self.check()

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def max_seq_length(self) -> int:
        return self.queries.max_seq_length

    def check(self) -> None:
        """Encode the probe texts and compare with torch's vectors saved at export (full dimension)."""
        got = self._run(self.queries.token_ids(self.meta["probes"]), full=True)
        want = l2_normalized(np.asarray(self.meta["probe_vectors"], dtype=np.float32))
        cos = (l2_normalized(got) * want).sum(axis=1)
        if got.shape != want.shape or float(cos.min()) < MIN_COSINE:
            raise RuntimeError(f"the OpenVINO IR in {self.folder} gives other vectors than torch did at export "
                               f"(cosines {np.round(cos, 6).tolist()}, need >= {MIN_COSINE}); delete the folder")

    def _run(self, ids: list[np.ndarray], *, full: bool = False) -> np.ndarray:
        from longrag.index.tokenized import bucketed

        out = np.zeros((len(ids), int(self.meta["dim"])), dtype=np.float32)
        request = self._compiled.create_infer_request()
        for rows in bucketed(ids, max(1, self.config.batch_size)):
            inputs = self.queries.pad([ids[i] for i in rows])  # padding is the same for both roles
            result = request.infer({"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]})
            out[rows] = np.asarray(result[self._output], dtype=np.float32)
        if full:
            return out
        out = np.ascontiguousarray(out[:, :self._dim])
        return l2_normalized(out) if self.config.normalize else out

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Questions -> float32 (n, dim), the model's query prompt prepended."""
        from longrag.index.embedding import _check_texts

        return self._run(self.queries.token_ids(_check_texts(texts, "queries")))

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Chunk texts -> float32 (n, dim), the model's document prompt prepended."""
        from longrag.index.embedding import _check_texts

        return self._run(self.passages.token_ids(_check_texts(texts, "texts")))

    def __repr__(self) -> str:
        return f"IREncoder(model={self.meta['model']!r}, dim={self.dim}, folder={str(self.folder)!r})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m longrag.index.openvino_ir",
                                description="Export an encoder to OpenVINO IR in the model cache (once per model and "
                                            "settings), so serving replicas encode questions without torch.")
    p.add_argument("--model", help="embedding.model (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--config-json", help="a whole EmbeddingConfig as JSON (instead of --model)")
    p.add_argument("--root", help="folder of the IR folders (default: <model cache>/openvino)")
    args = p.parse_args(argv)
    config = (EmbeddingConfig.model_validate_json(args.config_json) if args.config_json
              else EmbeddingConfig(**({"model": args.model} if args.model else {})))
    folder = ir_folder(config, args.root)
    if not _complete(folder):
        export_ir(config, folder)
    encoder = IREncoder(config, folder=folder)  # the probes checked against torch's vectors
    print(json.dumps({"folder": str(folder), "model": encoder.meta["model"], "dim": encoder.dim}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

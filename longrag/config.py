"""One typed configuration for the whole product.

Every section is a pydantic model with defaults that give the embedded default (bundled CPU
models, local paths). A config loads from YAML, takes ``section.field=value`` overrides from the
command line, and is saved next to every artifact and report (``model_dump``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from longrag.mixpr.config import MixPRConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EmbeddingConfig(_Section):
    """Dense encoder used for chunks and queries."""

    model: str = Field(
        "all-MiniLM-L6-v2",
        description="A known model name (all-MiniLM-L6-v2, bundled; embeddinggemma-300m, make setup-embedder; "
        "bge-large-en-v1.5; see longrag.index.embedding.resolve_embedding_model), a local folder, or a hub name.",
    )
    query_instruction: str | None = Field(
        None, description="Prefix for queries; None takes the model's known default (bge: its instruction; "
        "a sentence-transformers folder's own 'query' prompt, e.g. EmbeddingGemma's)."
    )
    document_instruction: str | None = Field(
        None, description="Prefix for chunks (documents); None takes the model's own 'document' prompt "
        "(EmbeddingGemma: 'title: none | text: '), none for models without one. Chunks leave room for its tokens."
    )
    dim: int | None = Field(
        None, gt=0, description="Matryoshka dimension: vectors cut to their first dim components and normalized "
        "again (embeddinggemma-300m: 768, 512, 256 or 128); None = the model's full dimension.")
    max_seq_length: int | None = Field(None, description="Model input limit in tokens; None = the model's own.")
    batch_size: int = 32
    normalize: bool = True
    device: str = Field("auto", description="auto picks cuda when a GPU is visible, else cpu.")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="The encoder's weights and activations; auto: float16 on a GPU, float32 on a CPU. On an "
        "H200, float16 embeds a bge-large-sized encoder 3.5x faster than float32 with vectors at cosine >= 0.9997 "
        "to float32's (python -m jobs.bench embed, docs/benchmarks.md); vectors are stored as float32 either way.")
    quantize: Literal["none", "int8"] = Field(
        "none", description="int8: dynamic int8 quantization of the encoder's Linear layers (torch "
        "quantize_dynamic: int8 weights, activations quantized per batch), CPU and float32 only. Vectors are "
        "stored as float32 either way; measured in docs/benchmarks.md, 'EmbeddingGemma on a CPU'.")
    backend: Literal["auto", "torch", "openvino", "openvino-ir"] = Field(
        "auto", description="What runs the encoder. torch; openvino (the transformer exported and converted in memory at "
        "each load, torch.export + openvino.convert_model: ~1 min for EmbeddingGemma on 2 cores; CPU only; dtype "
        "bfloat16 runs it in bf16; tokenizer, pooling and dense layers stay torch); openvino-ir (the whole encoder "
        "exported once to OpenVINO IR files in the model cache by a subprocess with torch, then run without torch: "
        "~550 MB less per process and ~1.2x torch's chunks/s on a CPU, vectors checked against torch's at every load, "
        "cosine >= 0.9999; longrag.index.openvino_ir). auto: openvino-ir in a build's CPU embedding actors and in "
        "serving replicas without a GPU, where dtype is float32, quantize none, the vector cache off (for passages) "
        "and openvino installed (the cpu extra); torch otherwise.")
    vector_cache: bool = Field(
        False, description="Reuse passage vectors encoded before with the same model and settings "
        "(longrag.index.vector_cache, keyed by model, settings and each text's sha256). The evaluation jobs turn "
        "it on (--no-vector-cache turns it off); index builds do not use it.")
    vector_cache_dir: str | None = Field(
        None, description="Folder of the vector cache; None = $LONGRAG_MODEL_CACHE/vectors "
        "(~/.cache/longrag/models/vectors). Delete the folder to clear it.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per embedding actor in the Ray Data pool.")
    num_cpus: float | None = Field(
        None, gt=0, description="CPUs per embedding actor; None = sized from the CPUs Ray offers "
        "(longrag.index.embedding.embedding_pool).")
    concurrency: int | None = Field(
        None, ge=1, description="Embedding actors in the Ray Data pool, a fixed pool; None = an autoscaling pool from 1 "
        "actor up to one per CPU (or GPU share) the cluster can grow to.")
    torch_threads: int | None = Field(
        None, ge=1, description="Torch threads per embedding actor; None = sized with the pool.")
    tokenize: Literal["auto", "actor", "stage"] = Field(
        "auto", description="Where a build tokenizes chunks for the encoder: in the embedding actor's own thread "
        "(actor), or in a Ray Data CPU stage before the pool that sends token ids sorted by length, so the actors only "
        "pad them and run the model (stage; longrag.index.tokenized). auto: stage when the pool has GPUs (tokenizing "
        "on the GPU actor's one host thread bounds MiniLM at ~1,300 chunks/s on an H200), actor on CPUs (the model "
        "dominates there; a stage would add processes).")


LinkSource = Literal["hyperlinks", "titles", "tfidf", "both"]
"""What grouping relates documents by: their hyperlinks, title mentions, TF-IDF neighbours, or both."""


class UnitConfig(_Section):
    """How documents become retrieval units (LongRAG, Jiang et al., 2024, Section 3.1 and Table 3)."""

    kind: Literal["grouped", "document", "passage"] = "grouped"
    text_mode: Literal["full", "lead"] = Field(
        "full", description="full pages (NQ setting) or lead sections with their links (HotpotQA setting)."
    )
    max_group_tokens: int = Field(4096, gt=0, description="Token budget of a grouped unit.")
    passage_words: int = Field(100, gt=0, description="Words per passage for kind=passage.")
    symmetric_links: bool = Field(True, description="Treat a hyperlink as relating both documents.")
    links: LinkSource = Field(
        "hyperlinks", description="What grouped units group along: the documents' own hyperlinks, or links "
        "computed for corpora without them (longrag.index.links): titles = a document's text mentions another's "
        "title; tfidf = its top tfidf_top_m TF-IDF neighbours; both = titles and tfidf.")
    tfidf_top_m: int = Field(5, ge=1, description="links=tfidf|both: neighbours per document.")
    tfidf_threshold: float = Field(
        0.2, gt=0, le=1, description="links=tfidf|both: least cosine similarity of a neighbour.")
    tfidf_features: int = Field(
        1 << 20, ge=16, description="links=tfidf|both: hashed term buckets (no vocabulary is gathered).")


class ChunkConfig(_Section):
    max_tokens: int | None = Field(
        None, description="Tokens per chunk; None = the embedding model's maximum input (minus special tokens)."
    )


class IndexConfig(_Section):
    factory: str = Field("Flat", description="FAISS index factory string; Flat = exact search.")
    metric: Literal["ip", "l2"] = "ip"
    shards: int = Field(2, ge=1)
    replicas: int = Field(1, ge=1, description="Replicas of each shard deployment (without index.autoscaling).")
    shard_num_cpus: float = 0.25
    shard_threads: int = Field(
        1, ge=1, description="FAISS threads per shard replica (a batch of queries or a large Flat scan uses them)."
    )
    search_timeout_s: float = Field(
        10.0, gt=0, description="A shard replica's call (search, units) slower than this is cancelled and tried on "
        "another replica of the shard.",
    )
    shard_max_pending: int = Field(
        32, ge=1, description="Calls one shard replica takes at once (Serve's max_ongoing_requests); more wait in "
        "the deployment's queue for a free replica and count towards index.autoscaling. The replica counts calls "
        "its clients cancelled while their search still runs or waits, and refuses one more at once "
        "(ReplicaBusyError; the sharded client asks again after a short backoff, within the shard's deadline of "
        "2 x index.search_timeout_s).",
    )
    search_params: str = Field(
        "", description="FAISS search-time parameters for approximate factories, e.g. nprobe=32 or efSearch=128."
    )
    node_resource: str | None = Field(
        None, description="Custom Ray resource the cluster gives its index nodes (cluster/aws.yaml and the KubeRay "
        "manifests: index); each shard replica asks for 1 of it, so shards land only on index nodes. None: any node.",
    )
    shard_memory_factor: float = Field(
        1.5, ge=0, description="Each shard replica asks Ray for this many times its estimated resident memory (from "
        "the sizes of its files in the manifest), so the scheduler and autoscaler place shards on nodes with the "
        "memory free. 0: no memory ask.",
    )
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="Where shard replicas search: cuda moves each shard's index to a GPU (exact Flat shards through "
        "torch, the gpu extra; IVF/PQ shards need a FAISS GPU build) and asks Ray for index.shard_num_gpus per actor.",
    )
    shard_num_gpus: float = Field(1.0, gt=0, le=1, description="GPUs per shard replica with index.device=cuda.")
    refresh_s: float = Field(
        10.0, ge=0, description="How often a Retriever serving a build alias re-reads its current.json; on a new "
        "build it loads the new shards, switches once every shard answers, then releases the old ones. 0: never.",
    )
    autoscaling: dict[str, Any] | None = Field(
        None, description="Serve's autoscaling_config for every shard deployment (min_replicas, "
        "max_replicas, target_ongoing_requests, ...); None: index.replicas replicas each.",
    )
    max_replicas_per_node: int | None = Field(
        None, ge=1, description="At most this many replicas of one shard per node (1 on a cluster: a "
        "node's loss then leaves the other replicas of every shard); None: no limit (one machine).",
    )
    retire_after_s: float = Field(
        60.0, ge=0, description="A superseded build's application is deleted this long after the "
        "switch (every Retriever replica follows the alias within index.refresh_s).",
    )
    shard_cache: bool = Field(
        True, description="Shard replicas load their files through a node-local cache keyed by each file's sha256 "
        "(longrag.index.shard_cache): a file of a remote store is fetched and hashed once per node, a local one "
        "hashed once per content, and the FAISS index is memory-mapped from it (shared by the node's replicas).",
    )
    shard_cache_dir: str | None = Field(
        None, description="The cache's folder on each node; None = $LONGRAG_SHARD_CACHE or ~/.cache/longrag/shards.",
    )
    fused_fetch_max_units: int = Field(
        32, ge=1, description="A dense retrieval searches and fetches in one call per shard while shards x k is at "
        "most this many units (each shard ships its own top k with their text); above it, ids and scores first, "
        "then only the k units that won (units of ~4K tokens: 8 shards at k = 100 would ship 800 to keep 100).",
    )


RetrievalMode = Literal["dense", "hybrid", "graph", "hybrid+graph", "iterative"]
"""What a request's retrieval does (``retrieval.mode``; per request on the HTTP API)."""


class RetrievalConfig(_Section):
    """What a request's retrieval does beyond the MaxP search (docs/evaluation.md: multi-hop evidence)."""

    document_order: Literal["stored", "evidence", "packed"] = Field(
        "packed", description="What of each retrieved unit the reader reads, and in what order. packed (default): "
        "the paragraphs of all the units given to the reader, ranked by the best MaxP chunk score over each "
        "paragraph (the unit's rank breaks ties), taken best first while they fit the budget "
        "(reader.max_context_tokens), written back in reading order under their titles (longrag.reading.packing; "
        "the trace names the paragraphs read and cut). evidence: the units whole, each unit's documents best first "
        "by their own best chunk. stored: the units whole in the order grouping put their documents, read from the "
        "top until the budget ends; the only order whose reader prompt opens the same for every question with the "
        "same top unit, so the unit KV cache (llm.unit_cache_mb) serves it. Chosen on docs/evaluation.md, 'What "
        "reaches the reader': over 300 paired questions (2 readers x 2 samples) packed and evidence tie on EM/F1 "
        "(within 1 point) and both are ahead of stored within the noise (F1 +2.7), and only packed gives the "
        "reader the gold paragraphs within 5 points of what the top units hold on every row.",
    )
    mode: RetrievalMode = Field(
        "dense", description="dense: one MaxP search. hybrid: the MaxP search and BM25 over the same chunks (MaxP "
        "per unit too), each searched on every shard, merged over the shards, then fused by reciprocal rank "
        "(longrag.index.fusion). graph / hybrid+graph: the dense (or hybrid) candidates and the units linked to "
        "the best of them, re-ranked by a Personalized PageRank over the build's unit link graph "
        "(longrag.index.graph). iterative: after the dense search, up to max_hops - 1 more, each made by one "
        "short LLM call naming the bridge entity from the best evidence so far (longrag.retrieval.hops).",
    )
    hybrid_weight: float = Field(
        0.5, ge=0, description="hybrid: BM25's weight in the reciprocal-rank fusion (the dense list's is 1).")
    hybrid_depth: int = Field(
        50, ge=1, le=1000, description="hybrid: units each signal contributes to the fusion (its global top-n).")
    rrf_c: int = Field(60, ge=0, description="hybrid: the reciprocal-rank constant c in w / (c + rank).")
    graph_seeds: int = Field(4, ge=1, le=50, description="graph: first-stage units that restart the walk.")
    graph_alpha: float = Field(0.5, gt=0, le=1, description="graph: the walk's restart probability.")
    graph_blend: float = Field(
        0.5, ge=0, le=1, description="graph: the PageRank's share of a unit's score (the rest: its first-stage "
        "score, min-max scaled over the candidates).")
    graph_depth: int = Field(50, ge=1, le=1000, description="graph: first-stage candidates re-ranked with the walk.")
    graph_radius: int = Field(2, ge=0, le=4, description="graph: links from a seed the walk may go.")
    graph_max_nodes: int = Field(2000, ge=1, description="graph: units the walk covers at most (nearest first).")
    max_hops: int = Field(2, ge=1, le=4, description="iterative: searches per question, the first included.")
    bridge_max_tokens: int = Field(16, ge=1, le=64, description="iterative: tokens the bridge reply may use.")
    evidence_units: int = Field(
        2, ge=1, le=8, description="iterative: the best chunk of this many top units is what the bridge call reads.",
    )

    @property
    def scores_chunks(self) -> bool:
        """Whether a unit is fetched with its chunks scored for the question (evidence and packed)."""
        return self.document_order != "stored"

    @property
    def packs(self) -> bool:
        """Whether the reader packs its budget with the units' best paragraphs (packed)."""
        return self.document_order == "packed"


class LLMConfig(_Section):
    backend: Literal["llamacpp", "openai", "serve"] = Field(
        "llamacpp", description="llamacpp: in process; openai: an OpenAI-compatible URL (llm.base_url); serve: a "
        "ray.serve.llm application of the same cluster reached through a Serve deployment handle (llm.serve_app), "
        "never through the HTTP proxy: the GPU configs deploy the vLLM reader with no route, so only the guarded "
        "LongRAG app answers on the public port (docs/operations.md, 'The reader behind the app').",
    )
    serve_app: str | None = Field(
        None, description="serve: the ray.serve.llm application (serve.llm_app:build_private_app) holding the model.",
    )
    serve_deployment: str | None = Field(
        None, description="serve: its LLMServer deployment; None = ray.serve.llm's name for llm.model "
        "(LLMServer:<model id with / as -- and . as _>).",
    )
    model: str = Field(
        "qwen2.5-coder-0.5b-instruct",
        description="llamacpp: a bundled model name (qwen2.5-coder-0.5b-instruct, smollm2-135m-instruct, "
        "gemma3-270m) or a .gguf path; openai: the served model name.",
    )
    chat_format: str | None = Field(
        None, description="llamacpp: chat format for a GGUF without a chat template (e.g. chatml); "
        "bundled models set their own.",
    )
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint, e.g. http://host:8000/v1")
    api_key_env: str = "OPENAI_API_KEY"
    context_window: int = Field(8192, gt=0)
    n_threads: int | None = Field(
        None, ge=1, description="llamacpp: threads for prompt evaluation and generation. None: the CPUs the process "
        "holds: behind Serve the LLMServer replica's num_cpus rounded up (llm.num_cpus), in a driver every core it may "
        "run on. (llama-cpp-python's own default is cpu_count() // 2, one thread on a 2-core machine: generation ran at "
        "9.6 tokens/s there against 17.8 with 2 threads; docs/benchmarks.md.)",
    )
    num_cpus: float = Field(
        1.0, gt=0, description="CPUs the LLMServer replica reserves (a Serve config's ray_actor_options win); "
        "llama.cpp runs that many threads, rounded up, when n_threads is None.",
    )
    flash_attn: bool = Field(True, description="llamacpp: flash attention (faster prompt processing on CPU too).")
    prompt_cache_mb: int = Field(
        256, ge=0, description="llamacpp: RAM for saved KV states, so a conversation's next turn reuses its "
        "prefix even when other requests ran in between (0: only the last prompt's prefix is reused).",
    )
    unit_cache_mb: int = Field(
        256, ge=0, description="llamacpp: RAM for the KV states of hot top units (longrag.llm.kvcache): a question "
        "whose top unit was read before evaluates only its own tokens and the units after the first, with the same "
        "answer as a cold read (0: off). A state costs ~12 KB per prefix token with the 0.5B, ~28 KB with the 1.5B.",
    )
    unit_cache_disk_mb: int = Field(
        0, ge=0, description="llamacpp: a node-local disk tier under the RAM one (states written through, read back "
        "on a RAM miss, so a restarted replica keeps its hot units); the budget is the folder's, held across "
        "the node's processes under a lock file (give every replica on a folder the same one); 0: off.",
    )
    unit_cache_dir: str | None = Field(
        None, description="llamacpp: the disk tier's folder (None: $LONGRAG_MODEL_CACHE/../kv or ~/.cache/longrag/kv).",
    )
    temperature: float = 0.0
    seed: int = 0
    timeout_s: float = 120.0
    max_retries: int = Field(
        2, ge=0, description="openai: the client's retries on connection errors, timeouts, 408/409/429 and 5xx.",
    )
    tokenizer_file: str | None = Field(
        None, description="openai, serve: a tokenizer.json for exact token counts; None = words x 1.3 estimate."
    )
    lora_path: str | None = Field(
        None, description="llamacpp: a LoRA adapter GGUF applied on top of the model (e.g. OUT/adapter.gguf from "
        "python -m jobs.finetune); openai: serve the adapter on the server instead (vLLM --enable-lora).",
    )
    lora_scale: float = Field(1.0, ge=0.0, description="llamacpp: scale of the LoRA adapter.")


class ReaderConfig(_Section):
    answer: Literal["direct", "two_turn"] = Field(
        "direct",
        description="How the short answer is made. direct: one message over the documents that asks for the answer "
        "alone (the long answer, when written, is for the trace and never feeds it); two_turn: the paper's second "
        "turn, which extracts it from the long answer (docs/evaluation.md compares both with a bare prompt).",
    )
    long_answer: bool = Field(
        True, description="direct: also write the long answer (a few sentences, streamed; the trace and the "
        "playground show it). It costs a second generation; off, a request makes one LLM call. two_turn always writes it.",
    )
    long_answer_max_tokens: int = 96
    short_answer_max_tokens: int = 24
    context_reserve_tokens: int = Field(
        384, description="Tokens kept free in the window for instructions and the generated answer."
    )
    few_shot_examples: int = Field(
        0, ge=0, le=8, description="Worked examples in the short-answer turn. The bundled reader answers as well "
        "without them and its second turn is 3x faster (docs/evaluation.md: reader benchmark).",
    )
    max_context_tokens: int | None = Field(
        1024, ge=1, description="At most this many tokens of unit text go to the reader (None: what the window "
        "leaves). 1K keeps the bundled 0.5B near 10 s per answer on 2 quiet cores (docs/evaluation.md: reader vs "
        "bare prompt); the 1.5B gains 4.2 F1 on MuSiQue at 4K for 4.4x the time (docs/evaluation.md: the 1.5B "
        "reader's context budget); a GPU-served long-context reader wants None.",
    )
    min_partial_unit_tokens: int = Field(
        128, ge=1, description="Fill leftover room with a trimmed unit only when at least this many tokens are free."
    )
    compression: Literal["truncate", "mixpr"] = Field(
        "truncate",
        description="When the retrieved units exceed the budget: keep whole top units and trim the next one "
        "(truncate), or select the sentences to keep from all of them with question-seeded MixPR, in document "
        "order (mixpr). At 1K tokens with the direct answer and the bundled 0.5B, mixpr scored higher F1 but lower EM "
        "than truncate and costs a MixPR pass per request (docs/evaluation.md: reader vs bare prompt); a request may "
        "ask for it.",
    )


class StageTimeouts(_Section):
    """Seconds the ingress waits for one stage of a request (a retry after a failure included)
    before it answers 504 naming the stage. A stream's ``read`` deadline covers the whole answer."""

    encode_s: float = Field(30.0, gt=0, description="The query encoder (QueryEncoder).")
    retrieve_s: float = Field(30.0, gt=0, description="The sharded search and the fetch of the units (Retriever).")
    read_s: float = Field(600.0, gt=0, description="The reader and its LLM (/v1/answer, /v1/chat/completions).")
    dual_s: float = Field(900.0, gt=0, description="A dual-perspective strategy (extractor, filter, generator).")
    longcontext_s: float = Field(900.0, gt=0, description="/v1/longcontext: selection and the reader.")


class ServeConfig(_Section):
    max_question_chars: int = 2000
    max_k: int = 100
    default_k: int = 4
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: list[SecretStr] = Field(
        default_factory=list, description="API keys the HTTP API accepts (Authorization: Bearer <key>); none "
        "here and no keys file: no key needed. Secrets: masked in dumps and saved configs, never logged.",
    )
    api_keys_file_env: str = Field(
        "LONGRAG_API_KEYS_FILE", description="Environment variable naming a file of API keys (one a line).",
    )
    @field_validator("api_keys")
    @classmethod
    def _no_masked_keys(cls, keys: list[SecretStr]) -> list[SecretStr]:
        """A saved config holds its keys masked (``**********``): such a mask is no key."""
        return [k for k in keys if k.get_secret_value() != "**********"]

    rate_limit_rps: float | None = Field(
        None, gt=0, description="Requests a second per client (its API key, else its address), per ingress "
        "replica; over it: 429 with Retry-After. None: no limit.",
    )
    rate_limit_burst: int = Field(20, ge=1, description="Requests a client may send at once (the bucket's size).")
    max_body_bytes: int = Field(
        64 * 1024, ge=1024, description="Largest POST body (413 above it); /v1/longcontext may add "
        "mixpr.max_document_bytes for its document.",
    )
    cors_origins: list[str] = Field(
        default_factory=list, description="Origins allowed by CORS (e.g. https://app.example.com); empty: CORS off.",
    )
    readyz_cache_s: float = Field(
        5.0, ge=0, description="GET /readyz (and /healthz) builds its report (serve.status(), every shard "
        "replica pinged) at most once this often per ingress replica; probes in between get the last one.",
    )
    colocate: bool = Field(
        False, description="The single-machine profile: every stage but the LLM runs inside each Ingress "
        "replica (query encoder, the index's shards, reader, long-context reader, dual stages: no hops "
        "between them, no shard deployments, two Ray workers for the app); off: separate, independently scaled "
        "deployments over one shard deployment per shard (clusters).",
    )
    timeouts: StageTimeouts = Field(
        default_factory=StageTimeouts, description="Per-stage deadlines (504 with the stage named); a stage "
        "that fails (a replica died, the LLM raised) is retried once within its deadline, then answered 503.",
    )
    max_reader_requests: int = Field(
        8, ge=1, description="Requests that need the reader (/v1/answer, /v1/chat/completions, "
        "/v1/longcontext) one ingress replica admits at once, reading or waiting for the reader; the next is "
        "answered 503 with Retry-After at once, before retrieval runs (/v1/retrieve is never refused by it). "
        "A cap on memory and on the queue; max_reader_wait_s is what usually decides.",
    )
    max_reader_wait_s: float | None = Field(
        5.0, gt=0, description="A reader request is admitted only while those already admitted would be "
        "answered within this many seconds at the reader's measured pace (the time between two answers "
        "while it is busy: ~5 s for a cold read of the 0.5B on 2 cores, under 2 s when the top unit's KV "
        "state is cached), so an admitted request waits about this long at most and the number admitted "
        "follows the mix. None: max_reader_requests alone.",
    )
    llm_routing: Literal["unit_affinity", "pow2"] = Field(
        "unit_affinity", description="How the LLMServer's replicas are chosen for a call. unit_affinity: a reader "
        "call goes to the replica whose unit KV cache holds its top unit (rendezvous hashing of the cached "
        "prefix), unless that replica's queue is longer than the shortest by more than llm_routing_max_imbalance "
        "(serve.routing.UnitAffinityRouter); other calls by power of two choices. pow2: Serve's default router.",
    )
    llm_routing_max_imbalance: int = Field(
        2, ge=0, description="unit_affinity: the queue-length gap past which a call leaves its preferred replica.",
    )
    request_timeout_s: float = Field(
        600.0, gt=0, description="A request's deadline: each stage starts only while time is left and gets at "
        "most what is left (504 past it). A client may ask for less with the header X-Request-Timeout (seconds).",
    )


DualStrategy = Literal["R&B", "R&L", "Ext", "Fil", "E&F"]
DUAL_STRATEGIES: tuple[str, ...] = ("R&B", "R&L", "Ext", "Fil", "E&F")
"""The strategies of the dual-perspective pipeline ("LongRAG: A Dual-Perspective Retrieval-Augmented
Generation Paradigm for Long-Context Question Answering", Zhao et al., 2024, Section 5.3): RAG-Base,
RAG-Long, Extractor, Filter, Extractor & Filter."""


class DualConfig(_Section):
    """Dual-perspective LongRAG (Zhao et al., 2024, Sections 4.1-4.4): sentence chunks, dense
    candidates reranked by a cross-encoder, then extractor / filter / generator. The paper's
    chunk-size x top-k settings are ``chunk_words`` x ``rerank_k``: 200x7 (default), 200x12, 500x3, 500x5."""

    chunk_words: int = Field(200, gt=0, description="Word budget of a chunk (sentences are never split).")
    overlap_sentences: int = Field(1, ge=0, description="Sentences a chunk repeats from the end of the previous one.")
    min_tail_words: int | None = Field(
        None, ge=1, description="A paragraph's last chunk with fewer new words is merged into the one before "
        "(None: a quarter of chunk_words).",
    )
    dense_candidates: int = Field(100, gt=0, description="Chunks the dense encoder hands to the reranker.")
    rerank_k: int = Field(7, gt=0, description="Chunks kept after reranking (the paper's top-k).")
    reranker: str | None = Field(
        None, description="A sentence-transformers cross-encoder folder (e.g. from python -m jobs.train_reranker); "
        "None ranks by the dense scores only, and the trace says 'dense only'.",
    )
    strategy: DualStrategy = Field("E&F", description="R&B, R&L, Ext, Fil or E&F (Section 5.3).")
    extractor_max_tokens: int = Field(192, gt=0, description="Tokens the extractor may write (global information).")
    cot_max_tokens: int = Field(192, gt=0, description="Tokens of the filter's chain-of-thought guidance.")
    judge_max_tokens: int = Field(24, gt=0, description="Tokens of one per-chunk filter judgement (JSON).")
    generator_max_tokens: int = Field(32, gt=0, description="Tokens of the generator's answer.")
    context_reserve_tokens: int = Field(
        64, ge=0, description="Tokens kept free in the window besides a stage's instructions and output.",
    )
    extractor_llm: LLMConfig | None = Field(
        None, description="Serve: the extractor deployment's own model (None: the app's llm, on the shared LLMServer).",
    )
    filter_llm: LLMConfig | None = Field(
        None, description="Serve: the filter deployment's own model (None: the app's llm, on the shared LLMServer).",
    )
    generator_llm: LLMConfig | None = Field(
        None, description="Serve: the generator deployment's own model (None: the app's llm, on the shared LLMServer).",
    )


class LongRAGConfig(_Section):
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    units: UnitConfig = Field(default_factory=UnitConfig)
    chunking: ChunkConfig = Field(default_factory=ChunkConfig)
    index: IndexConfig = Field(default_factory=IndexConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    reader: ReaderConfig = Field(default_factory=ReaderConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    mixpr: MixPRConfig = Field(default_factory=MixPRConfig)
    dual: DualConfig = Field(default_factory=DualConfig)

    @classmethod
    def from_yaml(cls, path: str | Path) -> LongRAGConfig:
        data = yaml.safe_load(Path(path).read_text()) or {}
        return cls.model_validate(data)

    def with_overrides(self, overrides: list[str] | None) -> LongRAGConfig:
        """Apply ``section.field=value`` strings (values parsed as YAML scalars).

        The values are YAML's (``yaml.safe_load``) and the checking pydantic's (the result is
        validated as a whole); what is left here is the dotted-path walk that names an unknown section
        or field. OmegaConf's ``from_dotlist`` would do the same walk at the price of a dependency
        (and its ``${...}`` interpolation in values, which a path or a prompt may contain)."""
        data = self.model_dump()
        for item in overrides or []:
            key, sep, raw = item.partition("=")
            if not sep or "." not in key:
                raise ValueError(f"override {item!r} is not of the form section.field=value")
            node: dict[str, Any] = data
            *parents, leaf = key.split(".")
            for part in parents:
                if part not in node or not isinstance(node[part], dict):
                    raise ValueError(f"override {item!r}: unknown section {part!r}")
                node = node[part]
            if leaf not in node:
                raise ValueError(f"override {item!r}: unknown field {leaf!r}")
            node[leaf] = yaml.safe_load(raw)
        return type(self).model_validate(data)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> LongRAGConfig:
    cfg = LongRAGConfig.from_yaml(path) if path else LongRAGConfig()
    return cfg.with_overrides(overrides)

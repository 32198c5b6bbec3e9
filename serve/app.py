"""The LongRAG Serve application: the ingress deployment and the app builder.

    python -m serve.run serve/configs/cpu.yaml             # the embedded default (make serve)
    serve run serve/configs/cpu.yaml                       # the same with Ray's CLI
    serve run serve.app:app_builder index=artifacts/sample  # without a config file

Endpoints: ``POST /v1/retrieve``, ``POST /v1/answer`` (``"stream": true``: server-sent events),
``POST /v1/longcontext``, the OpenAI-compatible ``POST /v1/chat/completions`` and ``GET /v1/models``,
``GET /livez``, ``GET /readyz`` (the routers of :mod:`serve.routes`), the web playground at ``GET /``
(:mod:`serve.playground`); OpenAPI at ``/docs`` (with the limits of the running config). Each ingress
replica builds its FastAPI app (:func:`serve.api.create_api`) over a :class:`serve.gateway.Gateway`
holding the handles of the deployments below. API keys, rate limit, body size and CORS:
:mod:`serve.guard`, :mod:`serve.middleware`; metrics: :mod:`serve.metrics`. Every error response has
one JSON shape, ``{"error": {"code", "message", "detail"}}`` (:mod:`serve.errors`).
"""

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field
from ray import serve
from ray.serve.handle import DeploymentHandle

from longrag.config import LongRAGConfig, load_config
from serve.api import create_api
from serve.deployments import LLMServer, QueryEncoder, Reader, Retriever
from serve.dual import bind_dual
from serve.gateway import Gateway, InProcess
from serve.longcontext import LongContextReader, longcontext_embedding
from serve.metrics import AppMetrics


@serve.deployment(ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=128)
@serve.ingress()
class Ingress:
    """The HTTP ingress: its routes call the deployments through a :class:`serve.gateway.Gateway`.

    With ``serve.colocate`` (the single-machine profile) only the LLM is another deployment: the
    query encoder, the retriever (the index's shards loaded in process,
    :class:`actors.inprocess_index.InProcessIndex`), the reader, the long-context reader and the
    dual-perspective stages are the same classes as their deployments, built here in this replica's
    process and called through :class:`serve.gateway.InProcess`; ``stages`` is then empty and
    ``index``, ``encoder_cls``, ``index_cls`` say what to build. Otherwise ``stages`` holds the
    handles of the separate deployments (``encoder``, ``retriever``, ``reader``, ``longcontext``, ``dual``)."""

    def __init__(self, config: LongRAGConfig, llm: DeploymentHandle, stages: dict[str, DeploymentHandle], *,
                 index: str | None = None, encoder_cls: Any = None, index_cls: Any = None) -> None:
        try:
            app_name = serve.get_replica_context().app_name
        except Exception:  # outside a Serve replica (not used so)
            app_name = None
        if not stages:
            stages = colocated_stages(config, llm, index, encoder_cls, index_cls)
        self.gateway = Gateway(config=config, llm=llm, **stages, metrics=AppMetrics(), app_name=app_name)

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Serve calls this in the replica after ``__init__``: the app is built here, over this
        replica's gateway, never pickled."""
        return create_api(self.gateway)

    async def check_health(self) -> None:
        """Serve's periodic check: an in-process retriever's own (its alias watch)."""
        retriever = self.gateway.retriever
        if isinstance(retriever, InProcess):
            await retriever.target.check_health()


class AppArgs(BaseModel):
    """Arguments of ``app_builder`` (the ``args:`` block of a serve config YAML)."""

    index: str = Field(..., description="Build directory or s3:// URI written by jobs.index, or a build alias "
                       "(longrag.index.alias: the app follows its current.json to new builds)")
    config: str | None = Field(None, description="LongRAGConfig YAML; default: the build's own config")
    overrides: list[str] = Field(default_factory=list, description="section.field=value overrides")


def app_builder(args: AppArgs | dict[str, Any]) -> serve.Application:
    args = AppArgs.model_validate(args) if isinstance(args, dict) else args
    if args.config:
        cfg = load_config(args.config, args.overrides)
    else:
        from longrag.index.alias import resolve_build
        from longrag.index.artifacts import ArtifactStore

        # The build's own config: the query encoder must be the model the chunks were embedded with.
        cfg = LongRAGConfig.model_validate(ArtifactStore.open(resolve_build(args.index)[0]).read_manifest().config)
        cfg = cfg.with_overrides(args.overrides)
    return build_app(cfg, args.index)


def llm_router_options(cfg: LongRAGConfig) -> dict[str, Any]:
    """The LLMServer's request router (``serve.llm_routing``): unit-cache affinity, or Serve's default."""
    if cfg.serve.llm_routing == "pow2":
        return {}
    from ray.serve.config import RequestRouterConfig

    return {"request_router_config": RequestRouterConfig(
        request_router_class="serve.routing:UnitAffinityRouter",
        request_router_kwargs={"max_imbalance": cfg.serve.llm_routing_max_imbalance})}


def build_app(cfg: LongRAGConfig, index: str, *, encoder_cls: Any = None, index_cls: Any = None,
              engine_cls: Any = None) -> serve.Application:
    """The application graph over the build at ``index``. The backends default to the real ones
    (see :mod:`serve.deployments`); tests inject fakes (``tests/fakes.py``)."""
    llm = LLMServer.options(ray_actor_options={"num_cpus": cfg.llm.num_cpus},
                            **llm_router_options(cfg)).bind(cfg.llm, engine_cls)
    if cfg.serve.colocate:
        return Ingress.bind(cfg, llm, {}, index=index, encoder_cls=encoder_cls, index_cls=index_cls)
    return Ingress.bind(cfg, llm, {
        "encoder": QueryEncoder.bind(cfg.embedding, encoder_cls, index=index),
        "retriever": Retriever.bind(index, cfg.index, index_cls, cfg.retrieval),
        "reader": Reader.bind(llm, cfg.llm, cfg.reader, cfg.mixpr),
        "longcontext": LongContextReader.bind(llm, cfg.llm, cfg.mixpr, longcontext_embedding(cfg.embedding)),
        "dual": bind_dual(cfg, llm, encoder_cls),
    })


def colocated_stages(cfg: LongRAGConfig, llm: DeploymentHandle, index: str | None, encoder_cls: Any = None,
                     index_cls: Any = None) -> dict[str, InProcess]:
    """Every stage but the LLM, in this process (``serve.colocate``): the deployments' own classes."""
    from serve.dual import DualExtractor, DualFilter, DualGenerator, DualReader

    if index_cls is None:
        from actors.inprocess_index import InProcessIndex

        index_cls = InProcessIndex
    chunks = longcontext_embedding(cfg.embedding)
    return {
        "encoder": InProcess(QueryEncoder.func_or_class(cfg.embedding, encoder_cls, index=index)),
        "retriever": InProcess(Retriever.func_or_class(index, cfg.index, index_cls, cfg.retrieval)),
        "reader": InProcess(Reader.func_or_class(llm, cfg.llm, cfg.reader, cfg.mixpr)),
        "longcontext": InProcess(LongContextReader.func_or_class(llm, cfg.llm, cfg.mixpr, chunks)),
        "dual": InProcess(DualReader.func_or_class(
            *(InProcess(stage.func_or_class(llm, cfg.llm, cfg.dual)) for stage in (DualExtractor, DualFilter, DualGenerator)),
            cfg.dual, chunks, encoder_cls)),
    }

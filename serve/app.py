"""The LongRAG Serve application: the ingress deployment and the app builder.

    python -m serve.run serve/configs/cpu.yaml             # the embedded default (make serve)
    serve run serve/configs/cpu.yaml                       # the same with Ray's CLI
    serve run serve.app:app_builder index=artifacts/sample  # without a config file

Endpoints: ``POST /v1/retrieve``, ``POST /v1/answer`` (``"stream": true``: server-sent events),
``POST /v1/longcontext``, the OpenAI-compatible ``POST /v1/chat/completions`` and ``GET /v1/models``,
``GET /healthz`` (the routers of :mod:`serve.routes`), the web playground at ``GET /``
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

    With ``serve.colocate_retrieval`` (``encoder`` and ``retriever`` None) the query encoder and the
    retriever are the same classes as the deployments, built here in this replica's process over
    the index at ``index`` (its shards loaded in process, :class:`actors.inprocess_index.InProcessIndex`)."""

    def __init__(self, config: LongRAGConfig, reader: DeploymentHandle, llm: DeploymentHandle,
                 longcontext: DeploymentHandle, dual: DeploymentHandle | None = None, *,
                 encoder: DeploymentHandle | None = None, retriever: DeploymentHandle | None = None,
                 index: str | None = None, encoder_cls: Any = None, index_cls: Any = None) -> None:
        try:
            app_name = serve.get_replica_context().app_name
        except Exception:  # outside a Serve replica (not used so)
            app_name = None
        if encoder is None:
            encoder = InProcess(QueryEncoder.func_or_class(config.embedding, encoder_cls))
        if retriever is None:
            if index_cls is None:
                from actors.inprocess_index import InProcessIndex

                index_cls = InProcessIndex
            retriever = InProcess(Retriever.func_or_class(index, config.index, index_cls))
        self.gateway = Gateway(config=config, encoder=encoder, retriever=retriever, reader=reader, llm=llm,
                               longcontext=longcontext, dual=dual, metrics=AppMetrics(), app_name=app_name)

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Serve calls this in the replica after ``__init__``: the app is built here, over this
        replica's gateway, never pickled."""
        return create_api(self.gateway)

    async def check_health(self) -> None:
        """Serve's periodic check: an in-process retriever's own (its index lease and repair)."""
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


def build_app(cfg: LongRAGConfig, index: str, *, encoder_cls: Any = None, index_cls: Any = None,
              engine_cls: Any = None) -> serve.Application:
    """The application graph over the build at ``index``. The backends default to the real ones
    (see :mod:`serve.deployments`); tests inject fakes (``tests/fakes.py``)."""
    llm = LLMServer.bind(cfg.llm, engine_cls)
    if cfg.serve.colocate_retrieval:
        stages: dict[str, Any] = {"index": index, "encoder_cls": encoder_cls, "index_cls": index_cls}
    else:
        stages = {"encoder": QueryEncoder.bind(cfg.embedding, encoder_cls),
                  "retriever": Retriever.bind(index, cfg.index, index_cls)}
    return Ingress.bind(
        cfg,
        Reader.bind(llm, cfg.llm, cfg.reader, cfg.mixpr),
        llm,
        LongContextReader.bind(llm, cfg.llm, cfg.mixpr, longcontext_embedding(cfg.embedding)),
        bind_dual(cfg, llm, encoder_cls),
        **stages,
    )

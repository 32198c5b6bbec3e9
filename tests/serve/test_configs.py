"""The Serve configs hold together without a cluster: every config (and the KubeRay RayService's
serveConfigV2) passes Ray Serve's own schema (``ServeDeploySchema``) with LongRAG app args and
overrides that load, autoscaling targets within what a replica accepts, the CPU config within a
2-core machine, and no deployment told to use a GPU it lacks. (The ``ray.serve.llm`` apps'
``llm_configs`` need vLLM to validate: tests/vllm checks them.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from longrag.config import LongRAGConfig
from serve.app import AppArgs, Ingress
from serve.deployments import LLMServer, QueryEncoder, Reader, Retriever, replica_device
from serve.dual import DualExtractor, DualFilter, DualGenerator, DualReader
from serve.longcontext import LongContextReader, longcontext_embedding

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "serve" / "configs"
CONFIG_FILES = sorted(p.name for p in CONFIGS.glob("*.yaml"))
RAYSERVICE = ROOT / "cluster" / "kuberay" / "rayservice.yaml"
DEPLOYMENTS = {d.name: d for d in (Ingress, QueryEncoder, Retriever, Reader, LLMServer, LongContextReader,
                                   DualReader, DualExtractor, DualFilter, DualGenerator)}


def _longrag_app(config_file: str) -> dict[str, Any]:
    config = yaml.safe_load((CONFIGS / config_file).read_text())
    (app,) = [a for a in config["applications"] if a["import_path"] == "serve.app:app_builder"]
    return app


def _effective(app: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per deployment: the options Serve runs it with (the config's over the decorator's)."""
    overrides = {d["name"]: d for d in app.get("deployments", [])}
    unknown = set(overrides) - set(DEPLOYMENTS)
    assert not unknown, f"config names deployments the app does not have: {unknown}"
    out = {}
    for name, dep in DEPLOYMENTS.items():
        o = overrides.get(name, {})
        actor = {**(dep.ray_actor_options or {}), **o.get("ray_actor_options", {})}
        auto = o.get("autoscaling_config")
        replicas = auto["max_replicas"] if auto else o.get("num_replicas", 1)
        out[name] = {
            "max_ongoing_requests": o.get("max_ongoing_requests", dep.max_ongoing_requests),
            "target": (auto or {}).get("target_ongoing_requests"),
            "max_replicas": replicas,
            "num_cpus": float(actor.get("num_cpus", 1)),
            "num_gpus": float(actor.get("num_gpus", 0)),
        }
    return out


def _serve_configs() -> dict[str, dict[str, Any]]:
    """Every Serve config of the repository: serve/configs/*.yaml and the RayService's serveConfigV2."""
    configs = {name: yaml.safe_load((CONFIGS / name).read_text()) for name in CONFIG_FILES}
    service = yaml.safe_load(RAYSERVICE.read_text())
    configs["kuberay/rayservice.yaml"] = yaml.safe_load(service["spec"]["serveConfigV2"])
    return configs


def test_every_config_is_found():
    assert {"cpu.yaml", "gpu.yaml", "vllm-cpu.yaml", "vllm-gpu.yaml"} <= set(CONFIG_FILES)


@pytest.mark.parametrize("name", [*CONFIG_FILES, "kuberay/rayservice.yaml"])
def test_config_passes_serve_schema_and_longrag_args_load(name):
    """What `serve deploy` checks first (ServeDeploySchema), then what app_builder does with its args:
    AppArgs, and every override applied to a LongRAGConfig (a typo'd field fails here, not at deploy)."""
    config = _serve_configs()[name]
    schema = ServeDeploySchema.model_validate(config)
    routed = [a.route_prefix for a in schema.applications if a.route_prefix is not None]
    assert len(set(routed)) == len(routed), name
    longrag_apps = [a for a in config["applications"] if a["import_path"] == "serve.app:app_builder"]
    assert len(longrag_apps) == 1, name
    args = AppArgs.model_validate(longrag_apps[0]["args"])
    LongRAGConfig().with_overrides(args.overrides)
    for app in longrag_apps:
        known = set(DEPLOYMENTS)
        if LongRAGConfig().with_overrides(app["args"].get("overrides", [])).serve.colocate:
            known = {"Ingress", "LLMServer"}  # the rest live in the Ingress: Serve would refuse their names
        unknown = {d["name"] for d in app.get("deployments", [])} - known
        assert not unknown, f"{name} names deployments the app does not have: {unknown}"


def test_serve_schema_check_catches_a_bad_config():
    config = _serve_configs()["cpu.yaml"]
    config["applications"][0]["deployments"][0]["max_ongoing_requests"] = "many"
    with pytest.raises(Exception, match="max_ongoing_requests"):
        ServeDeploySchema.model_validate(config)


GUARDED_APP = "serve.app:app_builder"  # every route of it passes serve.guard (keys, rate limits, body caps)
PRIVATE_LLM_APP = "serve.llm_app:build_private_app"


def unguarded_routes(config: dict[str, Any]) -> list[str]:
    """The routes of ``config``'s HTTP proxy that an application other than the guarded LongRAG app
    answers (an OpenAI router of ray.serve.llm under /llm: the GPUs to anyone reaching the port)."""
    return [f"{a['name']}: {a.get('route_prefix', '/')}" for a in config["applications"]
            if a.get("route_prefix", "/") is not None and a["import_path"] != GUARDED_APP]


def _llm_apps(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in config["applications"] if a["import_path"] == PRIVATE_LLM_APP}


def test_no_route_of_any_proxy_skips_the_guard():
    """Issue 40, item 4: the vLLM apps have no route; only the guarded app answers on the proxy, local
    configs included (what runs on 127.0.0.1 in a test runs on 0.0.0.0 on a cluster)."""
    for name, config in _serve_configs().items():
        assert unguarded_routes(config) == [], name
        for app in _llm_apps(config).values():
            assert "route_prefix" in app and app["route_prefix"] is None, (name, app["name"])
    # the layout before the fix: ray.serve.llm's OpenAI router on the public proxy under /llm
    before = _serve_configs()["gpu.yaml"]
    before["applications"].append({"name": "llm", "route_prefix": "/llm",
                                   "import_path": "ray.serve.llm:build_openai_app", "args": {"llm_configs": []}})
    assert unguarded_routes(before) == ["llm: /llm"]
    assert unguarded_routes({"applications": [{"name": "x", "import_path": "serve.llm_app:build_app"}]}) == ["x: /"]


def test_the_llm_backend_points_at_an_llm_app_of_the_same_config():
    """Where a config deploys ray.serve.llm beside LongRAG, the app (and the dual stages with a model of
    their own) reach it by handle: llm.backend=serve, an application of the same config, its model id."""
    for name, config in _serve_configs().items():
        llm_apps = _llm_apps(config)
        if not llm_apps:
            continue
        (rag,) = [a for a in config["applications"] if a["import_path"] == GUARDED_APP]
        cfg = LongRAGConfig().with_overrides(rag["args"]["overrides"])
        for llm in (cfg.llm, cfg.dual.extractor_llm, cfg.dual.filter_llm, cfg.dual.generator_llm):
            if llm is None:
                continue
            assert llm.backend == "serve" and llm.base_url is None, name
            assert llm.serve_app in llm_apps, (name, llm.serve_app)
            assert llm.model == llm_apps[llm.serve_app]["args"]["model_loading_config"]["model_id"], name


@pytest.mark.parametrize("config_file", ["cpu.yaml", "cpu-cluster.yaml", "gpu.yaml", "vllm-cpu.yaml", "vllm-gpu.yaml"])
def test_autoscaling_targets_are_within_max_ongoing_requests(config_file):
    """A target above max_ongoing_requests can never be reached: Serve would never scale up."""
    for name, opts in _effective(_longrag_app(config_file)).items():
        if opts["target"] is not None:
            assert opts["target"] <= opts["max_ongoing_requests"], (config_file, name, opts)


@pytest.mark.parametrize("config_file", ["cpu.yaml", "cpu-cluster.yaml"])
def test_cpu_config_fits_a_two_core_machine(config_file):
    """`make serve` on a 2-core machine: every deployment at its most replicas plus the index
    application (shards x index.replicas replicas, once, not once per Retriever replica; none when
    the shards are loaded in the Ingress)."""
    app = _longrag_app(config_file)
    cfg = LongRAGConfig().with_overrides(app["args"].get("overrides", []))
    shards = int(re.search(r"--shards (\d+)", (ROOT / "Makefile").read_text()).group(1))  # `make index`
    deployments = _effective(app)
    if cfg.serve.colocate:  # serve.app.build_app deploys the Ingress and the LLMServer only
        deployments = {name: deployments[name] for name in ("Ingress", "LLMServer")}
    total = sum(o["num_cpus"] * o["max_replicas"] for o in deployments.values())
    if not cfg.serve.colocate:
        total += shards * cfg.index.replicas * cfg.index.shard_num_cpus
    assert total <= 2.0 + 1e-9, f"{config_file} asks for {total:.2f} CPUs at most: {deployments}"
    assert deployments["LLMServer"]["num_cpus"] >= 1  # llama.cpp runs a thread of its own


def test_gpu_config_gives_cuda_only_to_deployments_with_a_gpu():
    app = _longrag_app("gpu.yaml")
    cfg = LongRAGConfig().with_overrides(app["args"]["overrides"])
    deployments = _effective(app)
    assert cfg.embedding.device == "cuda" and deployments["QueryEncoder"]["num_gpus"] > 0
    # The long-context reader's hybrid encoder: its device follows its own replica's GPUs.
    assert deployments["LongContextReader"]["num_gpus"] == 0
    device = replica_device(longcontext_embedding(cfg.embedding).device)
    assert device == "cpu"


def test_gpu_config_longcontext_encoder_loads_without_a_gpu():
    """What the LongContextReader of gpu.yaml loads for retriever=hybrid, on a GPU-less replica."""
    import numpy as np
    import torch

    from longrag.index.embedding import Embedder

    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU")
    app = _longrag_app("gpu.yaml")
    overrides = [o for o in app["args"]["overrides"] if o.startswith("embedding.")]
    cfg = LongRAGConfig().with_overrides([*overrides, "embedding.model=all-MiniLM-L6-v2"])  # bundled stand-in
    emb = longcontext_embedding(cfg.embedding)
    embedder = Embedder(emb.model_copy(update={"device": replica_device(emb.device)}))
    vectors = embedder.encode_queries(["Who wrote Animal Farm?"])
    assert vectors.shape == (1, embedder.dim) and np.isfinite(vectors).all()


@pytest.mark.parametrize("config_file", ["cpu-cluster.yaml", "gpu.yaml"])
def test_dual_stages_have_their_own_autoscaling_and_the_gpu_config_gives_e_and_f_a_small_model(config_file):
    app = _longrag_app(config_file)
    named = {d["name"]: d for d in app["deployments"]}
    for name in ("DualReader", "DualExtractor", "DualFilter", "DualGenerator"):
        assert "autoscaling_config" in named[name], (config_file, name)
    cfg = LongRAGConfig().with_overrides(app["args"].get("overrides", []))
    if config_file == "gpu.yaml":
        assert cfg.dual.extractor_llm.model == cfg.dual.filter_llm.model == "small" != cfg.llm.model
        assert cfg.dual.generator_llm is None  # the generator uses the app's (stronger) reader model


@pytest.mark.parametrize("config_file", ["gpu.yaml", "vllm-gpu.yaml", "kuberay/rayservice.yaml"])
def test_gpu_readers_reuse_the_documents_prefix(config_file):
    """Issue 39: on GPUs vLLM's prefix caching keeps the KV blocks of the reader's documents-first
    prompts (system message, top unit) across requests, as the llama.cpp path's unit cache does."""
    config = _serve_configs()[config_file]
    llm_configs = [app["args"] for app in _llm_apps(config).values()]
    assert llm_configs and all(c["engine_kwargs"].get("enable_prefix_caching") is True for c in llm_configs)

"""Serve's own cost on this machine, the floor under the app's overhead: a FastAPI ingress that
does no work. ``jobs.bench serve`` deploys it beside the app (route ``/floor``) and posts the same
``/v1/retrieve`` body to it: the proxy, the replica and FastAPI's parsing and validation of the
request, nothing of LongRAG's."""

from fastapi import FastAPI
from ray import serve

from serve.schemas import RetrieveRequest

api = FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": 0.01}, max_ongoing_requests=128)
@serve.ingress(api)
class Floor:
    @api.post("/v1/retrieve")
    async def retrieve(self, req: RetrieveRequest) -> dict[str, str]:
        return {"question": req.question}


app = Floor.bind()

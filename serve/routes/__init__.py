"""The ingress' HTTP routes, one router per part of the API; each reaches the replica's
:class:`serve.gateway.Gateway` through the :func:`serve.gateway.gateway` dependency.

* :mod:`serve.routes.health`: ``GET /livez``, ``GET /readyz`` (``GET /healthz``, its old name);
* :mod:`serve.routes.rag`: ``POST /v1/retrieve``, ``POST /v1/answer``;
* :mod:`serve.routes.openai`: ``GET /v1/models``, ``POST /v1/chat/completions``;
* :mod:`serve.routes.longcontext`: ``POST /v1/longcontext``.
"""

from serve.routes import health, longcontext, openai, rag

ROUTERS = (health.router, rag.router, openai.router, longcontext.router)

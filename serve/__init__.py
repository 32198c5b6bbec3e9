"""Ray Serve application: FastAPI ingress + query encoder, retriever, reader and LLM deployments."""

"""The servers the served models are compared with: a FastAPI micro-batcher and infinity-emb."""

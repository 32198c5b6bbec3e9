"""Ray actors around the core objects: index shards, the sharded-search client, the embedding
callable for Ray Data."""

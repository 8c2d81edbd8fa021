"""minikv: a small paged-KV inference engine that teaches how serving engines cache keys and values."""

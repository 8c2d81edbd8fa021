"""minikv: a small paged-KV inference engine that teaches how serving engines cache keys and values.

    from minikv import load_model, Engine, EngineConfig
    model, tokenizer = load_model()                      # the shipped model, data/tiny-llama
    engine = Engine(model, tokenizer, EngineConfig())    # one node: a page pool and a scheduler
    [response] = engine.generate(["alice: save pin 0912.\\n"])

`Cluster`, `ClusterConfig` and `SafetySwitches`: the prefill/decode pair and its mitigations (disagg/).
Names are imported on first use, so `python -m minikv scan-logs` does not pay for torch.
"""

from importlib import import_module

_EXPORTS = {
    "load_model": "minikv.model.checkpoint",
    "Engine": "minikv.engine.engine",
    "EngineConfig": "minikv.engine.config",
    "Request": "minikv.engine.request",
    "Response": "minikv.engine.request",
    "SamplingParams": "minikv.model.sampling",
    "Cluster": "minikv.disagg.cluster",
    "ClusterConfig": "minikv.disagg.cluster",
    "SafetySwitches": "minikv.disagg.switches",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    """Import a public name from the module that defines it, the first time it is used."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'minikv' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value

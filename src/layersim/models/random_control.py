"""The random-init control (Wu et al. 2020 compare against untrained networks of the same architecture): run
"random" of the activation folder, label RANDOM in figures. It has no folder of its own: its weights are drawn
by transformers' from_config from the pretrained folder's config.json under a fixed seed."""

from __future__ import annotations

import hashlib
from pathlib import Path

from layersim.models.registry import _loaded, verified_info  # _loaded: loading errors as one sentence naming the folder

RANDOM_RUN = "random"


def control_runs(seed: int | None, count: int = 1) -> dict[str, int]:
    """The random-init controls' runs and init seeds: RANDOM_RUN with `seed` (RANDOM in every figure), then, with
    similarity.random_controls = `count` > 1, "random2", "random3", … with seed + 1, seed + 2, …: further draws of
    random weights, which give the above-random headline its spread over draws. None: no control."""
    if seed is None:
        return {}
    return {RANDOM_RUN if k == 0 else f"{RANDOM_RUN}{k + 1}": seed + k for k in range(count)}


def random_encoder(folder: str | Path, seed: int):
    """The architecture of the verified model folder `folder` (its own config.json), every weight freshly
    initialised by transformers' ``from_config`` under the torch seed :func:`random_init_torch_seed` (`seed`);
    the global RNG is left as it was. The same seed gives the same weights for the same torch and transformers."""
    import torch
    from transformers import AutoConfig, AutoModel

    verified_info(folder)
    config = _loaded(folder, lambda: AutoConfig.from_pretrained(folder))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(random_init_torch_seed(seed))
        return AutoModel.from_config(config)


def random_init_torch_seed(seed: int) -> int:
    """The torch seed of the random-init control with seed `seed`: derived, not `seed` itself, so that it never
    redraws a model that was itself initialised from a small seed (the tiny models are: tiny-bert is seed 0)."""
    return int.from_bytes(hashlib.sha256(f"layersim random-init control {seed}".encode()).digest()[:8], "little")


def random_init_digest(base_digest: str, seed: int) -> str:
    """What the random-init control's tables record as model_digest: the digest of the pretrained folder it
    takes its architecture and tokenizer from, and the seed (it has no weights file of its own to digest)."""
    return hashlib.sha256(f"{base_digest}\0random-init seed {seed}\n".encode()).hexdigest()


def random_run_metadata(orig: dict, seed: int) -> dict:
    """The metadata the random-init control's activation tables hold, and must hold when read, from `orig`,
    the pretrained run's (model_digest, task_digest, shape, …): model_digest :func:`random_init_digest` of
    it, base_digest the pretrained one and init_seed the seed, so a reader sees which seed made the table."""
    return {**orig, "model_digest": random_init_digest(orig["model_digest"], seed),
            "base_digest": orig["model_digest"], "init_seed": seed}

"""Shared fixtures: offline model snapshots, made once per test session."""

from __future__ import annotations

import os

# Tests never use the network: the hub is unreachable at once instead of after retries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def shared_dvc_cache(tmp_path_factory):
    """One DVC cache (and run-cache) for every tiny project the integration tests build: download and
    fine-tuning stages that two projects share run once per test run."""
    from dvc_project import SHARED_CACHE

    folder = tmp_path_factory.mktemp("dvc-cache")
    previous = os.environ.get(SHARED_CACHE)
    os.environ[SHARED_CACHE] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop(SHARED_CACHE, None)
    else:
        os.environ[SHARED_CACHE] = previous


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a test module: tiny models and small matrices gain nothing from intra-op
    threads, and on a shared CPU the hand-offs cost milliseconds per op. Restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Callable[[str], Path]:
    """A factory: ``tiny_model_dir("tiny-bert")`` gives the folder of that model's snapshot.

    Any offline model name works ("tiny-bert", "tiny-roberta", "tiny-albert", "tiny-electra",
    "minilm-l6"); each is snapshotted once per session and shared read-only by every test.
    """
    from layersim.models.registry import snapshot_model

    root = tmp_path_factory.mktemp("models")
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            dest = root / name
            snapshot_model(name, dest)
            cache[name] = dest
        return cache[name]

    return get

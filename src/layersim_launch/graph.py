"""The pipeline as DVC sees it: every stage and matrix item (``finetune@rte-1``) a node, with the nodes it
reads from, and which nodes are not up to date. DVC's own index is the source; nothing here parses dvc.yaml."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Node:
    address: str              # what `dvc repro -s` takes: "finetune@synth-negation-1"
    upstream: tuple[str, ...]  # the nodes whose outputs it reads

    @property
    def stage(self) -> str:
        """The stage's name in dvc.yaml (the part before ``@``), which picks its resources."""
        return self.address.split("@", 1)[0]


def pipeline(root: Path) -> list[Node]:
    """Every node of the workspace's dvc.yaml, upstream before downstream (DVC's stage graph, whose edges
    run from a stage to the stages it depends on)."""
    import networkx
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        graph = repo.index.graph
        order = list(reversed(list(networkx.topological_sort(graph))))
        return [Node(stage.addressing, tuple(sorted(up.addressing for up in graph.successors(stage))))
                for stage in order]


def stale(root: Path, nodes: list[Node], dvc: list[str]) -> list[Node]:
    """The nodes to run: those `dvc status` reports changed and everything downstream of them (their inputs
    will be rewritten), in the same order. A downstream node whose inputs come out the same is a no-op for
    `dvc repro -s`, so including it costs one DVC start."""
    result = subprocess.run([*dvc, "status", "--json"], cwd=root, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"`dvc status` failed in {root}: {result.stderr.strip() or result.stdout.strip()}")
    changed = {key.rsplit(":", 1)[-1] for key in json.loads(result.stdout or "{}")}
    chosen: set[str] = set()
    for node in nodes:  # upstream first, so one pass propagates downstream
        if node.address in changed or chosen.intersection(node.upstream):
            chosen.add(node.address)
    return [node for node in nodes if node.address in chosen]


def upstream_of(nodes: list[Node], targets: list[str]) -> list[Node]:
    """The target nodes and everything they read from, in the same order (as `dvc repro <targets>` runs);
    an unknown target raises ValueError naming the valid nodes."""
    by_address = {node.address: node for node in nodes}
    unknown = [t for t in targets if t not in by_address]
    if unknown:
        raise ValueError(f"unknown node {unknown[0]!r}; the pipeline's nodes are: {', '.join(by_address)}")
    wanted, todo = set(), list(targets)
    while todo:
        address = todo.pop()
        if address not in wanted:
            wanted.add(address)
            todo.extend(by_address[address].upstream)
    return [node for node in nodes if node.address in wanted]

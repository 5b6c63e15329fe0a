"""``embed --engine ray``: the chunks of a caption set encoded by the workers of a Ray cluster.

:func:`d2s_search.embed.embed_side` stays the one place that decides which chunks are done
(resumable parts), writes each part and assembles the files; the workers only encode. Each
worker builds the encoders once (:class:`EncoderRecipe`: the bundle's ONNX sessions, or MiniLM
for the captions) and encodes whole chunks, so the vectors are those one process computes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .embed import Chunk, encode_chunk
from .ray_ingest import BATCHES_PER_WORKER, RayOptions, connect, result_of, started


@dataclass(frozen=True)
class EncoderRecipe:
    """How a worker builds the encoders ``embed`` uses (everything in it is picklable)."""

    bundle: str | None
    text_encoder: str = "bundle"  # or "minilm"
    device: str = "auto"
    features: bool = False

    def build(self) -> dict[str, Any]:
        """side ("text", "img") -> its encode function."""
        fns: dict[str, Any] = {}
        if self.bundle:
            from .embed import bundle_encoders

            text_fn, image_fn, _ = bundle_encoders(self.bundle, self.device, features=self.features)
            fns = {"text": text_fn, "img": image_fn}
        if self.text_encoder == "minilm":
            from .train.minilm import MiniLMEncoder

            fns["text"] = MiniLMEncoder(device="cuda" if self.device == "cuda" else "cpu")
        return fns


class EmbedWorker:
    """A Ray actor holding the encoders."""

    def __init__(self, recipe: EncoderRecipe, threads: int) -> None:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # torch (MiniLM) keeps to its CPUs
        self.fns = recipe.build()

    def pid(self) -> int:
        return os.getpid()

    def encode(self, side: str, ids: list[str], inputs: list, batch_size: int) -> Chunk:
        return encode_chunk(self.fns[side], ids, inputs, batch_size)


class RayChunkRunner:
    """A :data:`~d2s_search.embed.ChunkRunner` on Ray workers; use it as a context manager (the
    workers start on entry, and a Ray instance started for it stops on exit)."""

    def __init__(self, recipe: EncoderRecipe, options: RayOptions) -> None:
        self.recipe, self.options = recipe, options
        self.workers: list = []
        self._started_here = False

    def __enter__(self) -> RayChunkRunner:
        from .extras import require

        require("ray", who="--engine ray")
        import ray

        self._started_here = connect(ray, self.options)
        try:
            actor = ray.remote(EmbedWorker).options(
                num_cpus=self.options.cpus_per_worker, num_gpus=self.options.gpus_per_worker,
                max_restarts=self.options.max_task_retries, max_task_retries=self.options.max_task_retries)
            threads = max(1, int(self.options.cpus_per_worker))
            self.workers = [actor.remote(self.recipe, threads) for _ in range(self.options.workers)]
            started(ray, self.workers, self.options)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        import ray

        self.workers = []
        if self._started_here:
            ray.shutdown()

    def __call__(self, side: str, chunks: list[tuple[int, list[str], list]], batch_size: int
                 ) -> Iterator[tuple[int, Chunk]]:
        import ray

        waiting = list(chunks)
        pending: dict[Any, tuple[int, int]] = {}  # ref -> (chunk number, worker)
        load = dict.fromkeys(range(len(self.workers)), 0)
        while waiting or pending:
            while waiting and min(load.values()) < BATCHES_PER_WORKER:
                c, ids, inputs = waiting.pop(0)
                slot = min(load, key=load.__getitem__)
                pending[self.workers[slot].encode.remote(side, ids, inputs, batch_size)] = (c, slot)
                load[slot] += 1
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            c, slot = pending.pop(ref)
            load[slot] -= 1
            yield c, result_of(ray, ref)

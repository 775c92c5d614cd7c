"""Data-parallel evaluation under torchrun: each rank runs a shard of the items, rank 0 writes the one result.

    torchrun --standalone --nproc-per-node 2 -m harness.cli eval --model qwen3-vl-8b --quant oscar ...
    make eval MODEL=qwen3-vl-8b QUANT=oscar GPUS=2                                    (the same command)

torchrun starts one process per GPU and sets RANK, LOCAL_RANK and WORLD_SIZE. Each rank
- joins a gloo process group: the ranks exchange records and wait at barriers, never tensors, so the group lives
  on the host (no NCCL communicator taking GPU memory, no NCCL watchdog timing out a long shard);
- takes cuda:LOCAL_RANK as its device and current CUDA device (CUDA graphs, Triton launches and the allocator's
  peak statistics follow the current device), or the CPU on a machine without GPUs;
- runs items[rank::world_size] (round robin: neighbouring items, often alike in cost, go to different ranks) and
  records each finished item in its own progress file, <method>.rank<r>.partial.jsonl (harness/results.py).
At the end rank 0 gathers every rank's records, puts them in the task's item order and builds, validates and
writes the result exactly as a one-process run does (aggregation and bootstrap intervals once, on all records),
plus system.parallel: world size, devices, items per shard and the run's items per second with the ranks side by
side. The samples are the records a one-process run writes, item for item.

Resume: every rank starts from the records of every progress file of the result (the one-process file and any
rank's, whatever the rank count was), so a rerun after a killed rank, with the same or another number of
processes, runs only the items nobody finished. When one rank fails, torchrun stops the others; a barrier never
outlives the run.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from harness import progress as PF
from harness import results as R

# How long a rank waits at a barrier for the slowest shard. Long on purpose: a failing rank ends the run through
# torchrun, which stops the other ranks, so this bounds only a rank that hangs.
WAIT = timedelta(hours=24)


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run: rank (global), world_size, local_rank (its GPU on this host)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.world_size > 1


def ranks_from_env(environ=None) -> Ranks:
    """Ranks from torchrun's RANK / WORLD_SIZE / LOCAL_RANK (all absent: one process)."""
    env = os.environ if environ is None else environ
    try:
        world = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError as err:
        raise ValueError(
            f"RANK / WORLD_SIZE / LOCAL_RANK must be integers ({err}); start the run with torchrun"
        ) from None
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ValueError(
            f"RANK={rank}, LOCAL_RANK={local}, WORLD_SIZE={world}: need 0 <= RANK < WORLD_SIZE and "
            "LOCAL_RANK >= 0; start the run with torchrun"
        )
    return Ranks(rank, world, local)


def start(device: str | None = None, device_map: str | None = None, environ=None) -> tuple[Ranks, str | None]:
    """(ranks, this rank's device): joins torchrun's process group when there are several ranks and makes
    cuda:LOCAL_RANK the current device. One process: (Ranks(), device) with nothing started."""
    ranks = ranks_from_env(environ)
    if not ranks.parallel:
        return ranks, device
    if device_map:
        raise ValueError(
            f"--device-map {device_map} spreads one model over the GPUs, torchrun runs one whole model "
            "per GPU: use one or the other (one process with --device-map for a model too large for a "
            "GPU)"
        )
    import torch
    import torch.distributed as dist

    device = rank_device(device, ranks.local_rank, torch.cuda.is_available())
    if device.startswith("cuda"):
        if ranks.local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"LOCAL_RANK {ranks.local_rank} but this host has {torch.cuda.device_count()} GPU(s): "
                "start at most one process per GPU (torchrun --nproc-per-node)"
            )
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=WAIT)
    return ranks, device


def rank_device(device: str | None, local_rank: int, cuda: bool) -> str:
    """The rank's device: cuda:LOCAL_RANK for None or "cuda" on a GPU host, else the CPU. A numbered GPU is
    refused: every rank would take that same GPU."""
    if device in (None, "cuda"):
        return f"cuda:{local_rank}" if cuda else "cpu"
    if device == "cpu":
        return device
    raise ValueError(
        f"--device {device} under torchrun: every rank would use it; leave --device out (each rank "
        "takes cuda:LOCAL_RANK) or pass --device cpu"
    )


def finish() -> None:
    """Leave the process group, if this process joined one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier(ranks: Ranks) -> None:
    if ranks.parallel:
        import torch.distributed as dist

        dist.barrier()


def shard(items: list[Any], ranks: Ranks) -> list[Any]:
    """This rank's items: items[rank::world_size], the same on every run with the same items and world size."""
    return items[ranks.rank :: ranks.world_size]


def main_first(ranks: Ranks, fn: Callable[[], Any]) -> Any:
    """fn() on rank 0 first, then on the others (e.g. loading data that builds a shared cache on first use)."""
    if ranks.main:
        value = fn()
    barrier(ranks)
    return value if ranks.main else fn()


def all_gather(ranks: Ranks, value: Any) -> list[Any]:
    """Every rank's value, in rank order (Python objects through the gloo group)."""
    if not ranks.parallel:
        return [value]
    import torch.distributed as dist

    out: list[Any] = [None] * ranks.world_size
    dist.all_gather_object(out, value)
    return out


def check_same(ranks: Ranks, value: Any, what: str) -> None:
    """Raise ValueError on every rank unless all ranks hold the same value (e.g. the data fingerprint)."""
    values = all_gather(ranks, value)
    if any(v != values[0] for v in values):
        raise ValueError(f"the ranks disagree on {what}: {values}; give every rank the same files and options")


def on_main(ranks: Ranks, fn: Callable[[], Any]) -> Any:
    """fn() on rank 0, its return value handed to every rank; an exception it raises is raised on every rank
    (as ValueError, RuntimeError or OSError with rank 0's message), so no rank waits for a result that never comes."""
    if not ranks.parallel:
        return fn()
    import torch.distributed as dist

    box: list[Any] = [None]
    error = None
    if ranks.main:
        try:
            box[0] = ("ok", fn())
        except Exception as err:  # handed to the other ranks, then raised here as it was
            error = err
            kind = next((k for k in (ValueError, RuntimeError, OSError) if isinstance(err, k)), RuntimeError)
            box[0] = ("error", kind, f"rank 0: {err}")
    dist.broadcast_object_list(box, src=0)
    if error is not None:
        raise error
    if box[0][0] == "error":
        raise box[0][1](box[0][2])
    return box[0][1]


# ---------------------------------------------------------------- progress files of several ranks


class RankProgress(PF.Progress):
    """A rank's progress: `records` holds what every progress file of the result recorded (the items done), `add`
    appends to this rank's own file."""

    def __init__(self, path: Path, identity: dict[str, Any], records: list[dict[str, Any]], ranks: Ranks):
        super().__init__(path, identity, records)
        self.ranks = ranks


def open_progress(
    result_path: Path, identity: dict[str, Any], restart: bool, ranks: Ranks, replace_other: bool = False
) -> RankProgress:
    """This rank's progress file, opened or created, with the records of every progress file of the result.

    --restart (restart=True) discards them: each rank its own, rank 0 those of no current rank. With
    `replace_other` (--force) they are discarded only when one of them holds another run (another config or code),
    and resumed otherwise. Every rank reads the files between two barriers, before any rank writes; a file from
    other settings raises ResultFileError on every rank (the message says to rerun with --restart)."""
    own = PF.progress_path(result_path, ranks.rank if ranks.parallel else None)
    if replace_other and not restart:
        other = [(p, diff) for p in PF.progress_paths(result_path) for diff in [PF.progress_diff(p, identity)] if diff]
        barrier(ranks)  # every rank has read the headers before any rank deletes a file
        if other and ranks.main:
            path, diff = other[0]
            print(
                f"{path}: discarding an unfinished run of another config or code ({'; '.join(diff)})", file=sys.stderr
            )
        restart = bool(other)
    if restart:
        own.unlink(missing_ok=True)
        if ranks.main:
            live = {PF.progress_path(result_path, r) for r in range(ranks.world_size)} if ranks.parallel else {own}
            for path in PF.progress_paths(result_path):
                if path not in live:
                    path.unlink(missing_ok=True)
    barrier(ranks)
    found: dict[str, dict[str, Any]] = {}
    for path in PF.progress_paths(result_path):
        if path != own:  # read only: the file exists, so open_progress checks its header and writes nothing
            for record in PF.open_progress(path, identity).records:
                found.setdefault(str(record["id"]), record)
    barrier(ranks)
    progress = PF.open_progress(own, identity)
    mine = progress.done_ids
    records = progress.records + [r for i, r in found.items() if i not in mine]
    return RankProgress(own, identity, records, ranks)


def remove_progress(result_path: Path) -> None:
    """Delete every progress file of the result (rank 0, once the result is written)."""
    for path in PF.progress_paths(result_path):
        path.unlink(missing_ok=True)


def gather_records(
    records: list[dict[str, Any]], shard_items: list[dict[str, Any]], ids: list[str], ranks: Ranks
) -> list[dict[str, Any]] | None:
    """On rank 0: every rank's records of its shard, in the task's item order (`ids`); None on the other ranks."""
    if not ranks.parallel:
        return PF.records_in_order(records, ids)
    import torch.distributed as dist

    wanted = {str(item["id"]) for item in shard_items}
    mine = [r for r in records if str(r["id"]) in wanted]
    parts: list[Any] | None = [None] * ranks.world_size if ranks.main else None
    dist.gather_object(mine, parts, dst=0)
    if not ranks.main:
        return None
    return PF.records_in_order([r for part in parts for r in part], ids)


def check_complete(records: list[dict[str, Any]], ids: list[str]) -> None:
    """Raise RuntimeError naming the items of `ids` that no record covers (a merge that lost a shard)."""
    missing = [i for i in ids if i not in {str(r["id"]) for r in records}]
    if missing:
        raise RuntimeError(f"no rank recorded {len(missing)} item(s) ({', '.join(missing[:5])}); rerun to resume")


# ---------------------------------------------------------------- what a data-parallel result records


def rank_figures(adapter, shard_records: list[dict[str, Any]]) -> dict[str, Any]:
    """This rank's device, GPU name, peak memory and summed loop time over its shard's records."""
    import torch

    device = str(getattr(adapter, "device", None) or next(adapter.model.parameters()).device)
    gpu = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else None
    loop = sum(R.number(r.get("loop_s")) or 0.0 for r in shard_records)
    return {"device": device, "gpu": gpu, "peak_memory": R.peak_memory(), "items": len(shard_records), "loop_s": loop}


def gather_figures(
    ranks: Ranks, adapter, records: list[dict[str, Any]], shard_items: list[dict[str, Any]]
) -> list[dict[str, Any]] | None:
    """Every rank's rank_figures (on every rank), or None for one process."""
    if not ranks.parallel:
        return None
    wanted = {str(item["id"]) for item in shard_items}
    return all_gather(ranks, rank_figures(adapter, [r for r in records if str(r["id"]) in wanted]))


def record_parallel(result: dict[str, Any], figures: list[dict[str, Any]]) -> dict[str, Any]:
    """Put the ranks' figures into `result["system"]` (schema: system.parallel): the devices (system.device lists
    them all), the largest peak memory of any rank, and the run's clock with the ranks side by side:
    wall_s = the largest rank's summed loop time, items_per_s = items / wall_s (system.items_per_s stays the
    per-device figure, items / all loop time, comparable with a one-process run's)."""
    system = result["system"]
    wall = max(f["loop_s"] for f in figures)
    n = sum(f["items"] for f in figures)
    system["device"] = ",".join(f["device"] for f in figures)
    peaks = [f["peak_memory"] for f in figures] + [system["peak_memory"]]
    system["peak_memory"] = {
        key: max((p[key] for p in peaks if p[key] is not None), default=None) for key in ("cpu_rss_bytes", "cuda_bytes")
    }
    system["parallel"] = {
        "world_size": len(figures),
        "devices": [f["device"] for f in figures],
        "gpus": [f["gpu"] for f in figures],
        "shard_items": [f["items"] for f in figures],
        "wall_s": wall,
        "items_per_s": n / wall if wall > 0 else None,
    }
    return result

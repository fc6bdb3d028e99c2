"""`frenzy-slurm site detect`: turn NVML probe answers (one node per pool) into site-file pools.

The probe (`frenzy_slurm.runtime.nvml_probe`) runs on a compute node through the Slurm seam; this
module only interprets its JSON and merges the result into the site file. The merge keeps what the
admin wrote: comments, `overrides`, `overheads`, `cpus_per_gpu`, bandwidths; it rewrites `gpu`,
`gpus_per_node` and `intra_node` where NVML disagrees (reporting each change), and sets
`overrides.memory_gib` only where NVML's total memory differs from the catalog and the admin has not
set it, and drops what NVML measured from the pool's `unconfirmed:` list. Pools without NVML keep their
entry, or get one from Slurm's GRES description: a model its GRES type pins down is written with
`unconfirmed:`, one it does not is left out with a comment saying what to fill in (unknown stays unknown).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frenzy_slurm.core.gpus import GpuSpec, catalog, match_gpu
from frenzy_slurm.core.inputfile import read_config_text
from frenzy_slurm.core.units import GiB
from frenzy_slurm.site.tools import guess_from_gres, link_name
from frenzy_slurm.slurm import SlurmCommandError, SlurmUnavailable
from frenzy_slurm.slurm.view import gres_spelling, pool_label

if TYPE_CHECKING:
    from frenzy_slurm.slurm import SlurmBackend
    from frenzy_slurm.slurm.view import ClusterView

MEMORY_TOLERANCE = 0.03  # NVML total vs catalog: ECC and firmware reservations differ by a few percent


@dataclass
class Detected:
    """One pool as detection sees it."""

    partition: str
    gres_type: str | None  # None: the partition's GRES has no type (gpu:N)
    gpus_per_node: int  # from NVML where it answered, else Slurm's GRES count
    source: str  # "nvml" or "slurm"
    host: str | None = None
    product: str | None = None  # NVML's product name
    gpu: GpuSpec | None = None  # catalog match
    memory_gib: float | None = None  # NVML total memory per GPU
    intra_node: str | None = None  # nvlinkN / pcieN
    driver: str | None = None
    cuda: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return pool_label(self.partition, self.gres_type)


def _link(gpus: list[dict]) -> str | None:
    """nvlinkN where every GPU of the node has an active NVLink to a peer or NVSwitch, else pcieN."""
    if len(gpus) > 1 and all((g.get("nvlink") or {}).get("active_links") for g in gpus):
        gen = min((g["nvlink"].get("generation") or 0) for g in gpus)
        if gen:
            return f"nvlink{min(gen, 5)}"
    gens: list[int] = [g["pcie_generation"] for g in gpus if g.get("pcie_generation")]
    if gens:
        return f"pcie{max(3, min(5, min(gens)))}"
    return None


def _product_family(product: str) -> str:
    """NVML product name without the memory technology, which the catalog does not name: NVML calls the
    H100 SXM 'NVIDIA H100 80GB HBM3' (and the PCIe card 'NVIDIA H100 PCIe')."""
    return re.sub(r"\bHBM\d*e?\b", " ", product, flags=re.IGNORECASE)


def interpret(
    partition: str,
    gres_type: str | None,
    slurm_gpus_per_node: int,
    answer: dict[str, Any] | None,
    failure: str | None = None,
) -> Detected:
    """A pool from one node's probe answer (None with `failure` when the probe step did not run)."""
    det = Detected(partition, gres_type, slurm_gpus_per_node, "slurm")
    if answer is None or not answer.get("nvml"):
        why = failure or (answer or {}).get("error") or "no answer"
        det.problems.append(
            f"no NVML on {(answer or {}).get('host', 'the probe node')}: {why}; "
            "the pool is described from Slurm's GRES only"
        )
        return det
    gpus = answer.get("gpus") or []
    det.source, det.host = "nvml", answer.get("host")
    det.driver, det.cuda = answer.get("driver_version"), answer.get("cuda_version")
    if not gpus:
        det.problems.append(f"NVML on {det.host} sees no GPU (is CUDA_VISIBLE_DEVICES empty, or the GRES File= wrong?)")
        return det
    if any(g.get("mig_enabled") for g in gpus):
        det.problems.append(
            f"MIG is enabled on {det.host}: frenzy-slurm plans whole GPUs; a MIG slice's memory and "
            "speed are not the product's (describe such GRES types by hand with overrides)"
        )
    names = {g["name"] for g in gpus}
    if len(names) > 1:
        det.problems.append(
            f"{det.host} mixes GPU models {sorted(names)} under one GRES type; split them into GRES types in gres.conf"
        )
    det.product = gpus[0]["name"]
    det.memory_gib = min(g["memory_total_bytes"] for g in gpus) / GiB
    if len(gpus) != slurm_gpus_per_node:
        det.problems.append(
            f"NVML sees {len(gpus)} GPU(s) on {det.host}, Slurm's GRES says {slurm_gpus_per_node}; "
            "using NVML's count (check gres.conf)"
        )
    det.gpus_per_node = len(gpus)
    det.intra_node = _link(gpus)
    det.gpu = match_gpu(f"{_product_family(det.product)} {round(det.memory_gib)}GB")
    if det.gpu is None:
        det.problems.append(
            f"'{det.product}' ({det.memory_gib:.1f} GiB) matches no catalog GPU; set gpu: by hand "
            "to the closest model and its peaks in overrides (frenzy-slurm site catalog)"
        )
    return det


def _proposed_pool(det: Detected) -> tuple[dict[str, Any], dict[str, str]]:
    """The pool's entry, and comments by the key they go after. What NVML measured is written as it is; what
    only Slurm's names suggest is written with `unconfirmed:` where the name pins one catalog model down, and
    left out with a comment saying what to fill in where it does not (unknown stays unknown)."""
    pool: dict[str, Any] = {
        "partition": det.partition,
        # untyped GRES (gpu:N): the pool says so, and only NVML (or the admin) can name the model
        **({"gres_type": det.gres_type} if det.gres_type else {"untyped": True}),
    }
    type_key = "gres_type" if det.gres_type else "untyped"
    comments: dict[str, str] = {}
    unconfirmed: list[str] = []
    if det.source == "nvml":
        gpu = det.gpu
        if gpu is None:
            comments[type_key] = (
                f"gpu model unknown: NVML calls it '{det.product}' ({det.memory_gib or 0:.1f} GiB), which matches "
                "no catalog GPU; set gpu: to the closest model of `frenzy-slurm site catalog` and its peaks in "
                "overrides"
            )
    else:
        gpu, comment = guess_from_gres(det.gres_type)
        if gpu is None:
            comments[type_key] = comment
        else:
            unconfirmed.append("gpu")
            comments["unconfirmed"] = comment
    if gpu is not None:
        pool["gpu"] = gpu.name
    pool["gpus_per_node"] = det.gpus_per_node
    if det.intra_node is not None:
        pool["intra_node"] = det.intra_node
    elif gpu is not None:
        pool["intra_node"] = link_name(gpu)
        unconfirmed.append("intra_node")
        comments.setdefault("unconfirmed", "intra_node is the catalog's, not measured: check it, then delete this line")
    else:
        comments["gpus_per_node"] = "intra_node unknown: nvlink1-5, pcie3-5 or GB/s between the node's GPUs"
    if unconfirmed:
        pool["unconfirmed"] = unconfirmed
    if det.memory_gib and gpu and abs(det.memory_gib - gpu.memory_gib) > MEMORY_TOLERANCE * gpu.memory_gib:
        pool["overrides"] = {"memory_gib": round(det.memory_gib, 2)}
    return pool, comments


def _note(det: Detected, today: str) -> str:
    if det.source == "nvml":
        return (
            f"detected {today} by NVML on {det.host}: {det.gpus_per_node} x {det.product}, "
            f"{det.memory_gib:.1f} GiB, {det.intra_node or 'link unknown'}, driver {det.driver}, CUDA {det.cuda}"
        )
    return (
        f"{today}: no NVML answer; from Slurm's GRES ({gres_spelling(det.gres_type, det.gpus_per_node)}); "
        "check gpu: and intra_node:"
    )


def merge_site(text: str | None, cluster: str, detected: list[Detected], today: str) -> tuple[str, list[str]]:
    """The site file with the detected pools merged in (comments kept), and one line per change made."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    doc = yaml.load(text) if text else None
    changes: list[str] = []
    if doc is None:
        doc = CommentedMap()
        doc["cluster"] = cluster
        doc["defaults"] = CommentedMap([("inter_node_gbs", 25), ("usable_fraction", 0.95)])
        doc.yaml_set_comment_before_after_key(
            "cluster",
            before="Site file written by `frenzy-slurm site detect`. Check it, then run `frenzy-slurm site validate`.",
        )
        doc["pools"] = CommentedSeq()
    pools = doc.setdefault("pools", CommentedSeq())
    for det in detected:
        entry = next(
            (p for p in pools if p.get("partition") == det.partition and p.get("gres_type") == det.gres_type), None
        )
        proposal, comments = _proposed_pool(det)
        if entry is None:
            entry = _new_entry(proposal, comments)
            pools.append(entry)
            changes.append(
                f"{det.where}: added ({proposal.get('gpu', 'gpu unknown')}, {proposal['gpus_per_node']} per node, "
                f"{proposal.get('intra_node', 'link unknown')}; source {det.source})"
            )
        elif det.source == "nvml":
            changes += _update_entry(entry, det, proposal)
        entry.yaml_add_eol_comment(_note(det, today), "partition")
    out = io.StringIO()
    yaml.dump(doc, out)
    return out.getvalue(), changes


def _new_entry(proposal: dict[str, Any], comments: dict[str, str]) -> Any:
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    entry = CommentedMap(proposal)
    if "unconfirmed" in proposal:  # written [gpu, intra_node], as the admin reads and edits it
        seq = CommentedSeq(proposal["unconfirmed"])
        seq.fa.set_flow_style()
        entry["unconfirmed"] = seq
    for key, comment in comments.items():
        entry.yaml_add_eol_comment(comment, key)
    return entry


def _update_entry(entry: Any, det: Detected, proposal: dict[str, Any]) -> list[str]:
    """An existing pool brought in line with what NVML measured; what was measured is no longer unconfirmed.
    One line per change."""
    changes = []
    measured = [k for k, v in (("gpu", det.gpu), ("gpus_per_node", True), ("intra_node", det.intra_node)) if v]
    for key in measured:
        if entry.get(key) != proposal[key]:
            changes.append(f"{det.where}: {key} {entry.get(key)} -> {proposal[key]} (NVML on {det.host})")
            entry[key] = proposal[key]
    unconfirmed = entry.get("unconfirmed")
    if unconfirmed:
        for key in [k for k in unconfirmed if k in measured]:
            unconfirmed.remove(key)
            changes.append(f"{det.where}: {key} {entry[key]} measured by NVML on {det.host}, no longer unconfirmed")
        if not unconfirmed:
            del entry["unconfirmed"]
    mem = proposal.get("overrides", {}).get("memory_gib")
    overrides = entry.get("overrides")
    if mem is not None and not (overrides and "memory_gib" in overrides):
        from ruamel.yaml.comments import CommentedMap

        if overrides is None:
            entry["overrides"] = overrides = CommentedMap()
        overrides["memory_gib"] = mem
        changes.append(
            f"{det.where}: overrides.memory_gib = {mem} (NVML total; catalog says "
            f"{catalog()[proposal['gpu']].memory_gib:g})"
        )
    return changes


PROBE_MODULE = "frenzy_slurm.runtime.nvml_probe"


def probe_argv(python: str) -> list[str]:
    """The probe step's command. `site detect` is run by an admin, often as root: `-P` keeps the working
    directory (and /tmp, where srun falls back when it does not exist on the node) off `sys.path`, so a
    `pynvml.py` planted there is never imported as root. The step itself runs from `/` (see run_step)."""
    return [python, "-P", "-m", PROBE_MODULE]


def _parse_answer(stdout: str) -> dict | None:
    """The probe prints one JSON object; anything else on stdout (site banners, MOTD) is ignored."""
    import json

    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def probe_pools(
    backend: SlurmBackend, view: ClusterView, python: str, timeout: float, partitions: tuple[str, ...] = ()
) -> list[Detected]:
    """One probe step per (partition, GRES type) of the view, through the Slurm seam; a pool whose step
    fails (busy, refused, a read-only backend) is described from Slurm's GRES and says why."""
    detected = []
    for pool in view.pools():
        if partitions and pool.partition not in partitions:
            continue
        answer, failure = None, None
        try:
            out = backend.run_step(pool.key, pool.gpus_per_node, probe_argv(python), timeout)
            answer = _parse_answer(out)
            if answer is None:
                failure = f"the probe printed no JSON (is frenzy-slurm installed for {python} on the nodes?)"
        except (SlurmCommandError, SlurmUnavailable) as exc:
            lines = exc.message.strip().splitlines()
            failure = f"probe step failed: {lines[-1] if lines else exc}"
        detected.append(interpret(pool.partition, pool.gpu_type, pool.gpus_per_node, answer, failure))
    return detected


def read_text(path: Path) -> str | None:
    """The site file being updated (a bounded read of a regular file), or None where there is none yet."""
    return read_config_text(path, "site file") if path.exists() else None

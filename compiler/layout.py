"""The parallel layout: one frozen type that checks its own arithmetic (torchtitan ParallelDims).

Axis names are short in code (tp, pp, cp, ep, dp_replicate, dp_shard) and long in
the spec (tensor_parallel, ...). Data parallel dp = dp_replicate x dp_shard;
ZeRO/FSDP shards over dp_shard only (dp_replicate > 1 with sharding is HSDP).
Expert parallel is carved out of dp x cp (the Megatron convention), so it does
not enter the world size. The expert layers re-fold the tp x cp x dp ranks of a
pipeline stage as etp x ep x expert-dp (Megatron-Core's expert rank generator,
core/parallel_state.py): etp is the expert tensor-parallel degree, tp unless set
(--expert-tensor-parallel-size).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from compiler.split import PipelineSplit

Recompute = Literal["none", "selective", "full"]
Schedule = Literal["gpipe", "1f1b", "interleaved_1f1b"]
Offload = Literal["none", "cpu", "nvme"]


@dataclass(frozen=True)
class Layout:
    gpu: str  # catalog name of the GPU type
    gpus_per_node: int
    tp: int
    pp: int
    cp: int
    ep: int
    dp_replicate: int
    dp_shard: int
    zero_stage: int
    micro_batch: int
    grad_accum: int
    vpp: int = 1
    schedule: Schedule = "1f1b"
    recompute: Recompute = "none"
    sequence_parallel: bool = False
    offload_optimizer: Offload = "none"
    offload_params: Offload = "none"
    # Megatron's split mechanism (compiler.split); None: the default for the model's layer count
    # (compiler.split.default_split). Plans always record the resolved one.
    split: PipelineSplit | None = None
    # Megatron's expert tensor-parallel degree; None: tp (Megatron's default). A value equal to tp is stored as
    # None, so that one layout has one form (plan.json leaves it out)
    etp: int | None = field(default=None, metadata={"omit_if_none": True})

    def __post_init__(self) -> None:
        # internal invariants only: what a user can get wrong (zero 0 with dp_shard > 1, virtual stages without the
        # interleaved schedule, ep not dividing dp x cp, ...) is a layout rule in compiler.rules, checked with a
        # reason code before a Layout is built from user input (spec pins, dtc estimate, plan.json)
        for axis in ("tp", "pp", "cp", "ep", "dp_replicate", "dp_shard", "vpp", "micro_batch", "grad_accum",
                     "gpus_per_node"):
            value = getattr(self, axis)
            assert isinstance(value, int) and value >= 1, f"Layout.{axis} must be a positive int, got {value!r}"
        assert self.zero_stage in (0, 1, 2, 3), f"zero_stage must be 0-3, got {self.zero_stage}"
        assert self.split is None or isinstance(self.split, PipelineSplit), f"split: {self.split!r}"
        assert self.etp is None or (isinstance(self.etp, int) and self.etp >= 1), f"Layout.etp: {self.etp!r}"
        if self.etp == self.tp:
            object.__setattr__(self, "etp", None)

    @property
    def expert_tp(self) -> int:
        """The expert layers' tensor-parallel degree (Megatron --expert-tensor-parallel-size; default tp)."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """The expert data-parallel degree: the tp x cp x dp ranks of a stage over etp x ep."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def num_nodes(self) -> int:
        return -(-self.world_size // self.gpus_per_node)

    @property
    def gpus_on_a_node(self) -> int:
        """The GPUs one node holds: gpus_per_node, fewer when the whole run is smaller than a node."""
        return min(self.gpus_per_node, self.world_size)

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: micro_batch x grad_accum x dp."""
        return self.micro_batch * self.grad_accum * self.dp

    @property
    def is_hsdp(self) -> bool:
        return self.zero_stage > 0 and self.dp_replicate > 1 and self.dp_shard > 1

    @property
    def num_parallel_dims(self) -> int:
        return sum(x > 1 for x in (self.tp, self.pp, self.cp, self.ep, self.dp))

    @property
    def tag(self) -> str:
        """A short name: t8_p4_c1_e1_d2_z1_mbs1_ga64_sel (calculon-style)."""
        parts = [f"t{self.tp}", f"p{self.pp}"]
        if self.vpp > 1:
            parts.append(f"v{self.vpp}")
        if self.cp > 1:
            parts.append(f"c{self.cp}")
        if self.ep > 1:
            parts.append(f"e{self.ep}")
        if self.etp is not None:
            parts.append(f"et{self.etp}")
        parts.append(f"d{self.dp}" if self.dp_replicate == 1 or self.dp_shard == 1
                     else f"d{self.dp_replicate}x{self.dp_shard}")
        parts.append(f"z{self.zero_stage}")
        parts.append(f"mbs{self.micro_batch}")
        parts.append(f"ga{self.grad_accum}")
        parts.append({"none": "nore", "selective": "sel", "full": "full"}[self.recompute])
        if self.sequence_parallel:
            parts.append("sp")
        if self.schedule == "gpipe":
            parts.append("gpipe")
        if self.offload_optimizer != "none":
            parts.append(f"oo{self.offload_optimizer}")
        if self.offload_params != "none":
            parts.append(f"op{self.offload_params}")
        return "_".join(parts)

    def describe(self) -> str:
        """One line for reports: tp=8 pp=4 dp=2 zero=1 micro_batch=1 grad_accum=64 recompute=selective."""
        bits = [f"tp={self.tp}", f"pp={self.pp}"]
        if self.vpp > 1:
            bits.append(f"vpp={self.vpp}")
        if self.cp > 1:
            bits.append(f"cp={self.cp}")
        if self.ep > 1:
            bits.append(f"ep={self.ep}")
        if self.etp is not None:
            bits.append(f"etp={self.etp}")
        dp = f"dp={self.dp}" if not self.is_hsdp else f"dp={self.dp} ({self.dp_replicate}x{self.dp_shard} hsdp)"
        bits += [dp, f"zero={self.zero_stage}", f"micro_batch={self.micro_batch}",
                 f"grad_accum={self.grad_accum}", f"recompute={self.recompute}"]
        if self.sequence_parallel:
            bits.append("sp")
        if self.pp > 1:
            bits.append(f"schedule={self.schedule}")
        if self.offload_optimizer != "none":
            bits.append(f"offload_optimizer={self.offload_optimizer}")
        if self.offload_params != "none":
            bits.append(f"offload_params={self.offload_params}")
        return " ".join(bits)

    def to_dict(self) -> dict:
        """The fields as plain data; a field marked omit_if_none is left out while None (as plan.json does)."""
        out = asdict(self)
        for f in fields(self):
            if f.metadata.get("omit_if_none") and out[f.name] is None:
                del out[f.name]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Layout":
        d = dict(d)
        if isinstance(d.get("split"), dict):
            d["split"] = PipelineSplit(**d["split"])
        return cls(**d)

    def with_(self, **changes) -> "Layout":
        return replace(self, **changes)

"""``ParallelDims``: the parallel degrees of one plan, validated once and shared by every layer.

The planner, ``wrap()``, the simulator and the exporters all read this one object instead of
separate ``--tp`` / ``--cp`` / ``--hybrid`` numbers. Degrees, outermost to innermost on the device
mesh (torchtitan's ``ParallelDims`` order, so TP and CP are the fastest-varying, i.e. inside a
node on a launcher that numbers ranks node by node):

- ``dp_replicate``: HSDP replicas (gradients all-reduced across them); 1 for plain FSDP/DDP.
- ``dp_shard``: the group FSDP2 / ZeRO shards parameters, gradients and optimizer state over.
- ``cp``: context parallelism, the sequence split across ranks (ring attention).
- ``tp``: tensor parallelism (Megatron-style column/row split; ``wrap()`` runs transformers' plan, without
  sequence parallelism).

Pipeline and expert parallelism (issue 23):

- ``pp``: pipeline stages, the outermost dimension (torchtitan's ``["pp", "dp_replicate", "dp_shard",
  "cp", "tp"]``), so on a launcher that numbers ranks node by node the stages split across nodes
  first. ``pp_schedule`` names the schedule (facts per schedule: ``profiles/pipeline_schedules.json``),
  ``virtual_stages`` the model chunks per rank (interleaved 1F1B; the V schedules ``zbv`` and
  ``dualpipev`` always run two), ``pp_layers`` an optional uneven split of the decoder layers, one
  count per rank.
- ``ep``: expert parallelism, carved out of ``dp_shard x cp`` as torchtitan places it (the routed
  experts are split over ``ep`` ranks of the FSDP group; their FSDP group is ``dp_shard x cp / ep``),
  so it is not a factor of the world size.

Rules a practitioner uses, checked here: the product pp x dp_replicate x dp_shard x cp x tp is the
world size; TP divides the query and key/value heads (each rank owns whole heads) and, by default,
TP x CP fits inside one node (their collectives are on the critical path every layer); CP divides
the sequence into 2 x cp chunks (load-balanced causal ring attention). Checks that need the model
or the GPUs take them as arguments; this module imports nothing heavier than pydantic.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # outermost first (torchtitan ParallelDims)
# Schedules (facts: profiles/pipeline_schedules.json). The V shapes hold two model chunks per rank.
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "zb_2p", "zbv", "dualpipev"]
PP_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "zb_2p", "zbv", "dualpipev")
V_SCHEDULES = ("zbv", "dualpipev")
_PP_FIELDS = ("pp", "pp_schedule", "virtual_stages", "ep", "pp_layers")  # left out of JSON when pp = ep = 1
MESH_STRATEGIES = ("zero3", "zero2")  # FSDP2 on the dp_shard x cp mesh (torchtitan: reshard after forward)


class ParallelDims(BaseModel):
    """Degrees of a 5-D device mesh (pp x dp_replicate x dp_shard x cp x tp) whose product is the
    world size, and the expert degree carved out of dp_shard x cp."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pp: int = Field(default=1, ge=1, description="Pipeline stages (ranks along the pipeline), outermost.")
    pp_schedule: PipelineSchedule = Field(default="1f1b", description="Pipeline schedule (profiles/"
                                          "pipeline_schedules.json); read only when pp > 1.")
    virtual_stages: int = Field(default=1, ge=1, description="Model chunks per pipeline rank (interleaved 1F1B; "
                                "zbv and dualpipev always run 2).")
    pp_layers: tuple[int, ...] | None = Field(default=None, description="Decoder layers per pipeline rank, "
                                              "first to last (an uneven split); None: layers / pp each.")
    ep: int = Field(default=1, ge=1, description="Expert-parallel degree: routed experts split over ep ranks "
                    "of dp_shard x cp (not a factor of the world size).")
    dp_replicate: int = Field(default=1, ge=1, description="HSDP replicas (all-reduce across them).")
    dp_shard: int = Field(default=1, ge=1, description="FSDP / ZeRO sharding group size.")
    cp: int = Field(default=1, ge=1, description="Context-parallel degree (sequence split, ring attention).")
    tp: int = Field(default=1, ge=1, description="Tensor-parallel degree (column/row split of the blocks).")
    world_size: int = Field(ge=1, description="Ranks in all; the product of the degrees.")

    @model_validator(mode="after")
    def _check(self) -> "ParallelDims":
        product = self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp
        if product != self.world_size:
            pp = f"pp {self.pp} x " if self.pp > 1 else ""
            raise ValueError(
                f"parallel degrees do not multiply to the world size: {pp}dp_replicate {self.dp_replicate} x dp_shard "
                f"{self.dp_shard} x cp {self.cp} x tp {self.tp} = {product}, not {self.world_size}"
            )
        if (self.dp_shard * self.cp) % self.ep:
            raise ValueError(f"ep {self.ep} must divide dp_shard {self.dp_shard} x cp {self.cp} = "
                             f"{self.dp_shard * self.cp} (expert parallelism is carved out of the FSDP ranks)")
        if self.virtual_stages > 1 and self.pp_schedule not in ("interleaved_1f1b",) + V_SCHEDULES:
            raise ValueError(f"virtual stages {self.virtual_stages} need an interleaved schedule (interleaved_1f1b, "
                             f"zbv or dualpipev); {self.pp_schedule} runs one stage per rank")
        if self.pp_schedule in V_SCHEDULES and self.virtual_stages > 2:
            raise ValueError(f"{self.pp_schedule} runs exactly 2 model chunks per rank (a V shape); "
                             f"got virtual stages {self.virtual_stages}")
        if self.pp_layers is not None and (len(self.pp_layers) != self.pp or min(self.pp_layers) < 1):
            raise ValueError(f"pp_layers {list(self.pp_layers)} must give pp {self.pp} positive layer counts, "
                             "one per pipeline rank")
        return self

    @model_serializer(mode="wrap")
    def _serialize(self, handler):  # plans without pp/ep keep their JSON byte-identical
        data = handler(self)
        if self.pp == 1 and self.ep == 1 and isinstance(data, dict):
            for name in _PP_FIELDS:
                data.pop(name, None)
        return data

    @classmethod
    def data_parallel(cls, world_size: int) -> "ParallelDims":
        """The DP-family layout: every rank is a data-parallel rank."""
        return cls(dp_shard=world_size, world_size=world_size)

    @property
    def dp(self) -> int:
        """Data-parallel ranks (distinct micro-batches per step)."""
        return self.dp_replicate * self.dp_shard

    @property
    def model_parallel(self) -> int:
        """Ranks that share one replica's compute (TP x CP)."""
        return self.tp * self.cp

    @property
    def is_data_parallel_only(self) -> bool:
        return self.tp == 1 and self.cp == 1 and self.dp_replicate == 1 and self.pp == 1 and self.ep == 1

    @property
    def chunks_per_rank(self) -> int:
        """Model chunks one pipeline rank holds: 2 under the V schedules, ``virtual_stages`` otherwise."""
        return 2 if self.pp_schedule in V_SCHEDULES else self.virtual_stages

    @property
    def expert_data_parallel(self) -> int:
        """The FSDP group of the routed experts: dp_shard x cp / ep (torchtitan's dp_shard_mod_ep x cp)."""
        return self.dp_shard * self.cp // self.ep

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Decoder layers on each pipeline rank, first to last (``pp_layers`` or an even split)."""
        if self.pp_layers is not None:
            return self.pp_layers
        return (num_layers // self.pp,) * self.pp

    @property
    def hybrid(self) -> bool:
        """HSDP: sharded within dp_shard, replicated across dp_replicate."""
        return self.dp_replicate > 1

    @property
    def shape(self) -> dict[str, int]:
        """Degrees > 1 by mesh dimension name, outermost first (the DeviceMesh's mesh_dim_names)."""
        return {name: getattr(self, name) for name in DIM_NAMES if getattr(self, name) > 1}

    @property
    def label(self) -> str:
        """``dp_shard 4 x tp 2``; ``dp 8`` for data parallelism alone."""
        if self.is_data_parallel_only:
            return f"dp {self.dp_shard}"
        text = " x ".join(f"{name} {degree}" for name, degree in self.shape.items())
        if self.pp > 1:
            chunks = f", v {self.chunks_per_rank}" if self.chunks_per_rank > 1 else ""
            text = text.replace(f"pp {self.pp}", f"pp {self.pp} ({self.pp_schedule}{chunks})", 1)
        return f"{text} (ep {self.ep})" if self.ep > 1 else text

    def check_model(self, *, num_attention_heads: int | None, num_kv_heads: int | None) -> None:
        """TP splits attention by whole heads: it must divide the query and key/value heads."""
        if self.tp == 1:
            return
        for what, heads in (("attention heads", num_attention_heads), ("key/value heads", num_kv_heads)):
            if heads is None:
                raise ValueError(f"--tp {self.tp} needs the model's {what}, which are not known for this model")
            if heads % self.tp:
                raise ValueError(f"--tp {self.tp} does not divide the model's {heads} {what}")

    def check_layers(self, *, num_layers: int | None, num_experts: int | None) -> None:
        """pp divides the decoder layers (or ``pp_layers`` sums to them; each chunk of an interleaved
        rank gets whole layers); ep divides the routed experts of an MoE model."""
        if self.pp > 1:
            if num_layers is None:
                raise ValueError(f"--pp {self.pp} needs the model's number of layers, which is not known")
            chunks = self.chunks_per_rank
            if self.pp_layers is not None:
                if sum(self.pp_layers) != num_layers:
                    raise ValueError(f"pp_layers {list(self.pp_layers)} sum to {sum(self.pp_layers)}, not the "
                                     f"model's {num_layers} layers")
                if any(n % chunks for n in self.pp_layers):
                    raise ValueError(f"pp_layers {list(self.pp_layers)}: each rank's layers must split into its "
                                     f"{chunks} chunks")
            elif num_layers % (self.pp * chunks):
                what = f"pp {self.pp} x {chunks} chunks = {self.pp * chunks}" if chunks > 1 else f"--pp {self.pp}"
                raise ValueError(f"{what} does not divide the model's {num_layers} layers; give an uneven "
                                 "split (--pp-layers) or another degree")
        if self.ep > 1:
            if not num_experts:
                raise ValueError(f"--ep {self.ep} needs a mixture-of-experts model; this one has no routed experts")
            if num_experts % self.ep:
                raise ValueError(f"--ep {self.ep} does not divide the model's {num_experts} experts")

    def check_sequence(self, seq_len: int) -> None:
        """Load-balanced ring attention splits the sequence into 2 x cp equal chunks."""
        if self.cp > 1 and seq_len % (2 * self.cp):
            raise ValueError(f"--cp {self.cp} needs a sequence length divisible by {2 * self.cp}; got {seq_len}")

    def check_node(self, gpus_per_node: int, *, allow_cross_node: bool = False) -> None:
        """TP x CP inside a node unless asked otherwise (their traffic is per layer, on the critical path)."""
        if allow_cross_node or self.model_parallel <= gpus_per_node:
            return
        if self.pp == 1 and self.world_size > gpus_per_node:
            raise ValueError(
                f"tp {self.tp} x cp {self.cp} = {self.model_parallel} ranks span more than one node "
                f"({gpus_per_node} GPUs per node); put pipeline stages across nodes (--pp) before TP or CP")
        raise ValueError(
            f"tp {self.tp} x cp {self.cp} = {self.model_parallel} ranks span more than one node "
            f"({gpus_per_node} GPUs per node); keep TP and CP inside a node"
        )


def split_layers(num_layers: int, pp: int, chunks: int = 1) -> tuple[int, ...] | None:
    """An uneven split for the search when pp x chunks does not divide the layers: whole chunks per rank,
    the extra ones on the middle ranks (the first and last ranks carry the embedding and the head).
    None when the split is even (or impossible: fewer chunks than ranks)."""
    units, parts = divmod(num_layers, chunks)
    if num_layers % (pp * chunks) == 0 or parts or units < pp:
        return None
    base, extra = divmod(units, pp)
    order = sorted(range(pp), key=lambda r: (r in (0, pp - 1), abs(r - (pp - 1) / 2), -r))  # rank 0 holds most in flight
    counts = [base] * pp
    for r in order[:extra]:
        counts[r] += 1
    return tuple(c * chunks for c in counts)

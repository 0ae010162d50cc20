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

Pipeline parallelism is not modelled. Rules a practitioner uses, checked here: the product is the
world size; TP divides the query and key/value heads (each rank owns whole heads) and, by default,
TP x CP fits inside one node (their collectives are on the critical path every layer); CP divides
the sequence into 2 x cp chunks (load-balanced causal ring attention). Checks that need the model
or the GPUs take them as arguments; this module imports nothing heavier than pydantic.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

DIM_NAMES = ("dp_replicate", "dp_shard", "cp", "tp")
MESH_STRATEGIES = ("zero3", "zero2")  # FSDP2 on the dp_shard x cp mesh (torchtitan: reshard after forward)


class ParallelDims(BaseModel):
    """Degrees of a 4-D device mesh whose product is the world size."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dp_replicate: int = Field(default=1, ge=1, description="HSDP replicas (all-reduce across them).")
    dp_shard: int = Field(default=1, ge=1, description="FSDP / ZeRO sharding group size.")
    cp: int = Field(default=1, ge=1, description="Context-parallel degree (sequence split, ring attention).")
    tp: int = Field(default=1, ge=1, description="Tensor-parallel degree (column/row split of the blocks).")
    world_size: int = Field(ge=1, description="Ranks in all; the product of the degrees.")

    @model_validator(mode="after")
    def _check(self) -> "ParallelDims":
        product = self.dp_replicate * self.dp_shard * self.cp * self.tp
        if product != self.world_size:
            raise ValueError(
                f"parallel degrees do not multiply to the world size: dp_replicate {self.dp_replicate} x dp_shard "
                f"{self.dp_shard} x cp {self.cp} x tp {self.tp} = {product}, not {self.world_size}"
            )
        return self

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
        return self.tp == 1 and self.cp == 1 and self.dp_replicate == 1

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
        return " x ".join(f"{name} {degree}" for name, degree in self.shape.items())

    def check_model(self, *, num_attention_heads: int | None, num_kv_heads: int | None) -> None:
        """TP splits attention by whole heads: it must divide the query and key/value heads."""
        if self.tp == 1:
            return
        for what, heads in (("attention heads", num_attention_heads), ("key/value heads", num_kv_heads)):
            if heads is None:
                raise ValueError(f"--tp {self.tp} needs the model's {what}, which are not known for this model")
            if heads % self.tp:
                raise ValueError(f"--tp {self.tp} does not divide the model's {heads} {what}")

    def check_sequence(self, seq_len: int) -> None:
        """Load-balanced ring attention splits the sequence into 2 x cp equal chunks."""
        if self.cp > 1 and seq_len % (2 * self.cp):
            raise ValueError(f"--cp {self.cp} needs a sequence length divisible by {2 * self.cp}; got {seq_len}")

    def check_node(self, gpus_per_node: int, *, allow_cross_node: bool = False) -> None:
        """TP x CP inside a node unless asked otherwise (their traffic is per layer, on the critical path)."""
        if allow_cross_node or self.model_parallel <= gpus_per_node:
            return
        raise ValueError(
            f"tp {self.tp} x cp {self.cp} = {self.model_parallel} ranks span more than one node "
            f"({gpus_per_node} GPUs per node); keep TP and CP inside a node"
        )

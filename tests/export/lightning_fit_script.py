"""Run by test_export_lightning.py: train a tiny model for two steps under an exported Lightning file.

``python lightning_fit_script.py EXPORTED.py MODEL_DIR``. The exported file is executed as written
except ``accelerator="gpu"`` -> ``"cpu"`` (this machine has no GPU; ModelParallelStrategy and DDP
then use gloo) and Trainer arguments that keep the run short and quiet. Lightning's own launcher
starts the other ranks (it re-runs this script). Each rank writes one line to ``rank<N>.txt`` in
the working directory (the ranks share stdout, where lines interleave): its rank, the world size, the FSDP units, the mesh size of the sharded parameters, the MixedPrecisionPolicy dtypes and
the steps taken.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as L
import torch
import transformers
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

QUIET = ("    accumulate_grad_batches=1,\n    max_steps=2, logger=False, enable_checkpointing=False, "
         "enable_progress_bar=False, enable_model_summary=False,\n)")


def load(path: str) -> dict:
    source = open(path, encoding="utf-8").read().replace('accelerator="gpu"', 'accelerator="cpu"')
    source = source.replace("    accumulate_grad_batches=1,\n)", QUIET)
    namespace: dict = {}
    exec(compile(source, path, "exec"), namespace)
    return namespace


class TinyLM(L.LightningModule):
    def __init__(self, model_dir: str, shard_model) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(model_dir))
        self._shard_model = shard_model

    def configure_model(self) -> None:
        if self._shard_model is not None and not isinstance(self.model, FSDPModule):
            self._shard_model(self.model, self.device_mesh)

    def training_step(self, batch, batch_idx):
        return self.model(input_ids=batch, labels=batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    namespace = load(sys.argv[1])
    module = TinyLM(sys.argv[2], namespace.get("shard_model"))
    trainer = namespace["trainer"]
    vocab = module.model.config.vocab_size
    data = torch.utils.data.DataLoader(torch.randint(0, vocab, (8, 8), generator=torch.Generator().manual_seed(0)),
                                       batch_size=2)
    trainer.fit(module, data)
    units = sorted(type(m).__name__ for m in module.model.modules() if isinstance(m, FSDPModule))
    meshes = sorted({p.device_mesh.size() for p in module.model.parameters() if isinstance(p, DTensor)})
    stored = sorted({str(p.dtype) for p in module.model.parameters()})
    policies = sorted({str(m._get_fsdp_state()._mp_policy.param_dtype) for m in module.model.modules()
                       if isinstance(m, FSDPModule)})
    line = (f"rank={trainer.global_rank} world={trainer.world_size} units={','.join(units)} "
            f"meshes={meshes} stored={','.join(stored)} param_dtype={','.join(policies)} steps={trainer.global_step}")
    Path(f"rank{trainer.global_rank}.txt").write_text(line + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

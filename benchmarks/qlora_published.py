"""QLoRA estimates against published peak memory: each case of ``profiles/published_qlora.json``
planned with its stated settings, printed beside the published figure with the relative error.

Run: python benchmarks/qlora_published.py [--markdown]
Why published figures: fake tensors cannot run bitsandbytes kernels, so the simulator cannot check
a quantised base (``advisor.estimate.quantized``). The JSON's ``not_expressed`` lists published runs
whose settings the planner cannot express. The bound is asserted in tests/estimate/test_quantized.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from advisor.model.lora import LoraConfig  # noqa: E402
from advisor.planning.api import plan  # noqa: E402
from advisor.units import GIB  # noqa: E402

CASES = ROOT / "profiles" / "published_qlora.json"


def load_cases() -> list[dict]:
    return json.loads(CASES.read_text())["cases"]


def estimate_gib(case: dict) -> float:
    """The planner's per-GPU total for ``case`` at its stated strategy, micro-batch and checkpointing.
    torch_reserved figures exclude the CUDA context, so the runtime reserve is 0 for them."""
    targets = case["lora_targets"]
    lora = LoraConfig(rank=case["lora_rank"], targets=targets if isinstance(targets, str) else tuple(targets))
    result = plan(case["model"], case["gpus"], strategy=case["strategy"], engine=case["engine"],
                  precision=case["precision"], lora=lora, quantize=case["quantize"],
                  micro_batch_size=case["micro_batch_size"], seq_len=case["seq_len"],
                  activation_checkpointing=case["checkpointing"],
                  **({"reserve_gib": 0.0} if case["measure"] == "torch_reserved" else {}))
    return result.candidate(case["strategy"]).memory_bytes.total / GIB


def rows() -> list[tuple[dict, float, float]]:
    """(case, estimate GiB, relative error) per case."""
    out = []
    for case in load_cases():
        est = estimate_gib(case)
        out.append((case, est, (est - case["published_gib"]) / case["published_gib"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="Print a Markdown table.")
    args = parser.parse_args()
    results = rows()
    if args.markdown:
        print("| case | strategy | micro-batch | published GiB | estimate GiB | error |")
        print("|---|---|---|---|---|---|")
    for case, est, err in results:
        if args.markdown:
            print(f"| {case['id']} | {case['engine']} {case['strategy']} | {case['micro_batch_size']} | "
                  f"{case['published_gib']:.2f} | {est:.2f} | {err:+.0%} |")
        else:
            print(f"{case['id']:40s} {case['engine']:9s} {case['strategy']:14s} mb {case['micro_batch_size']:2d}  "
                  f"published {case['published_gib']:6.2f} GiB  estimate {est:6.2f} GiB  error {err:+6.1%}")
    worst = max(abs(err) for _, _, err in results)
    print(f"worst |error| {worst:.1%} over {len(results)} cases")


if __name__ == "__main__":
    main()

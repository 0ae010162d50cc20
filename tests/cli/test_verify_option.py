"""``advisor plan --verify`` where the simulator cannot run the recommendation (issue 19's review: the README's first
command recommends CPU offload): the plan is printed as without --verify, one note on stderr says why it was not
simulated, and the exit code is the plan's own."""

from __future__ import annotations

import json

from tests.cli._main import run_main

README = ["plan", "-m", "Qwen/Qwen2.5-7B", "-g", "2xA100"]


def test_an_offload_recommendation_is_printed_unverified_with_one_note(capsys):
    code, plain, _ = run_main(README, capsys)
    verified_code, out, err = run_main([*README, "--verify"], capsys)
    assert (code, verified_code) == (0, 0)
    assert out == plain  # the plan, as without --verify
    assert err.strip().splitlines() == [
        "note: --verify: not simulated: 'zero3_offload' is not simulated yet: offload moves state from the GPU to the "
        "CPU, and the simulated step already runs on the CPU"]


def test_the_json_document_says_why_it_was_not_verified(capsys):
    code, out, _ = run_main([*README, "--verify", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and "verification" not in doc
    assert doc["recommendation"]["strategy"] == "zero3_offload"
    assert doc["verification_skipped"].startswith("'zero3_offload' is not simulated yet")

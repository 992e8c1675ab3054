"""The error catalog: every error the library raises, triggered and matched by message.

``CATALOG`` is one table of ``(id, trigger, exception type, message regex)``;
``test_error`` runs each trigger and matches the message with ``pytest.raises``.

How the catalog is kept complete (``test_every_raise_site_is_in_the_catalog``):

1. A *raise site* is a line of library code that can start an error: a ``raise`` with an
   exception (bare re-raises excluded), or a call of one of the raising check helpers
   (``check_int``, ``check_float``, ``check_choice``, ``need_key``, ``need_ndim``,
   ``need_axis``, ``need_known_in_range``, today in ``purelayers/layers/_checks.py``;
   the ``raise`` statements inside those helpers, wherever they are defined, are
   counted at their call sites instead). An AST walk over the whole package
   (``purelayers/``, ``functional/`` and ``models/`` included) lists them as
   ``(file, line)``.
2. Each trigger's exception is traced back to the line that raised it: the innermost
   traceback frame in ``purelayers/`` outside the check helpers. A container that
   re-raises a child's error with its path (``raise e.within(...)``) is that site.
3. Every site must be reached by some trigger, or sit in a function listed in
   ``UNREACHABLE`` (its qualified name, in whichever module it lives, and the reason).
   Files whose errors are tested elsewhere are listed in ``TESTED_ELSEWHERE`` with their
   site count; a changed count fails too.

So adding a ``raise`` (or a ``check_*`` call) anywhere in the library without adding a
catalog entry that reaches it fails the test, naming the file, line and function; and
a catalog entry cannot claim a site it does not reach. Sites are found by line, not
counted per function, so one trigger cannot stand in for two sites. Nothing here names
the module a layer's checks live in: code that moves between modules (into a public
module, into ``functional/``) is found at its new place, and the entries that reached
it reach it there, since each is located by the traceback its trigger raises.

The entries: ``CATALOG`` below (containers, composites, models, checkpoints, the
first round's layers), and every registry case's own (``Case.errors``, in
``tests/registry.py`` and ``tests/catalog/``), so a new layer's entries sit in its row.
"""

from __future__ import annotations

import ast
import pathlib
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from purelayers.layers.errors import LayerError
from purelayers.params import CheckpointError
from tests import registry
from tests.composites import Residual

PKG = pathlib.Path(pl.__file__).resolve().parent
HELPERS = {
    "check_int", "check_float", "check_choice", "need_key", "need_ndim", "need_axis",
    "need_known_in_range",
}  # fmt: skip

# Files whose error paths are tested (with ``match=``) in their own test files, and their
# number of raise sites: a new site there must get a test there and this count bumped.
TESTED_ELSEWHERE = {
    "_safetensors_io.py": (
        15,
        "tests/test_checkpoint.py (fuzzed files, each error matched) and tests/test_checkpoint_scale.py",
    ),
    "_sharded_io.py": (1, "tests/test_checkpoint.py and tests/test_params.py"),
    "sharding.py": (20, "tests/test_sharding.py"),
    "_patterns.py": (2, "tests/test_sharding.py (bad rules) and tests/test_labels.py"),
    "_labels.py": (9, "tests/test_labels.py"),
    "_like.py": (1, "tests/test_training_state.py"),
    "_interop.py": (1, "tests/test_training_state.py"),
    "layers/_capture.py": (3, "tests/test_capture.py"),
    "lora/__init__.py": (9, "tests/test_lora.py and tests/test_lora_heads.py"),
    "lora/_checks.py": (6, "tests/test_lora.py"),
    "lora/model.py": (11, "tests/test_lora.py and tests/test_lora_heads.py"),
    "lora/layers.py": (6, "tests/test_lora.py"),
    "layers/_fit.py": (7, "tests/test_bad_input.py (every registered layer, each kind of misfit)"),
    "models/bert.py": (16, "tests/models/test_bert.py"),
    "models/bert_heads.py": (1, "tests/models/test_bert_heads.py"),
    "models/_heads.py": (2, "tests/models/test_bert_heads.py"),
    "models/vit.py": (12, "tests/models/test_vit.py and tests/models/test_cls_heads.py"),
    "models/vit_heads.py": (1, "tests/models/test_cls_heads.py"),
    "models/seq_cls.py": (2, "tests/models/test_cls_heads.py"),
    "models/distilbert.py": (10, "tests/models/test_cls_heads.py"),
    "models/modernbert.py": (16, "tests/models/test_modernbert.py"),
    "models/clip.py": (1, "tests/models/test_clip.py"),
    "models/_towers.py": (5, "tests/models/test_clip.py"),
    "models/clip_config.py": (13, "tests/models/test_clip.py"),
    "models/siglip.py": (5, "tests/models/test_clip.py"),
    "models/resnet.py": (9, "tests/models/test_resnet.py"),
    "models/phi3.py": (3, "tests/models/test_phi3.py"),
    "models/t5.py": (16, "tests/models/test_t5.py"),
    "models/_seq2seq.py": (4, "tests/models/test_t5.py and tests/models/test_whisper.py"),
    "models/whisper.py": (12, "tests/models/test_whisper.py"),
    "models/whisper_config.py": (7, "tests/models/test_whisper.py"),
    "functional/moe.py": (2, "tests/functional/test_moe.py"),
    "layers/moe.py": (4, "tests/functional/test_moe.py"),
    "models/_moe.py": (5, "tests/functional/test_moe.py and tests/models/test_moe_families.py"),
    "models/mixtral.py": (1, "tests/functional/test_moe.py"),
    "models/qwen3_moe.py": (2, "tests/functional/test_moe.py"),
    "models/gpt_oss.py": (3, "tests/models/test_gpt_oss.py"),
    "models/_mxfp4.py": (1, "tests/models/test_gpt_oss.py"),
}

# Sites no public call can reach, by the qualified name of their function (in whichever
# module it is defined): internal invariants.
UNREACHABLE: dict[str, str] = {
    "_checking.apply": "re-raises the misfit layers/_fit.py raised or the layer's own "
    "error (the traceback starts there), whichever names the problem",
    "raise_with_path": "re-raises the exception a child raised (the traceback starts there) "
    "with the child's path in its message",
    "CausalLM.build": "abstract: every model class overrides it",
    "CausalLM.hidden_size": "abstract: every model class overrides it",
    "DenseCausalLM.backbone": "abstract: every model class overrides it",
}

KEY = jax.random.key(0)


_TMP = tempfile.TemporaryDirectory(prefix="purelayers-errors-")  # removed at exit


def _tmp() -> pathlib.Path:
    return pathlib.Path(tempfile.mkdtemp(dir=_TMP.name))


def run(layer: L.Layer, shape, x_shape=None, *, dtype=jnp.float32, x=None, **kwargs) -> Any:
    """``layer.init`` for ``shape``, then ``apply`` to zeros of ``x_shape`` (or to ``x``).

    Traced abstractly (shape errors are raised while tracing), so nothing compiles.
    """

    def go():
        xs = jnp.zeros(shape if x_shape is None else x_shape, dtype) if x is None else x
        return layer.apply(layer.init(KEY, shape), xs, **kwargs)

    return jax.eval_shape(go)


def traced(fn):
    """``fn`` run under ``jax.eval_shape``: errors raised while tracing, nothing compiled."""
    return lambda *a, **k: jax.eval_shape(lambda: fn(*a, **k))


def jitted(layer: L.Layer, shape, x_shape, **kwargs) -> Any:
    params = layer.init(KEY, shape)
    fn = jax.jit(lambda p, x: layer.apply(p, x, **kwargs))
    return fn(params, jnp.zeros(x_shape))


def bn_run(layer, shape, x_shape=None, *, train=False, with_state=True):
    def go():
        state = layer.init_state(shape) if with_state else None
        x = jnp.ones(shape if x_shape is None else x_shape)
        return layer.apply(layer.init(KEY, shape), x, state=state, train=train)

    return jax.eval_shape(go)


@traced
def _apply_residual(x_shape):
    block = Residual(L.LayerNorm(), L.Sequential(L.Linear(8), L.Dropout(0.5)))
    params = block.init(KEY, (2, 8))
    return block.apply(params, jnp.zeros(x_shape), train=True)


@traced
def _residual_train_without_key():
    block = Residual(L.LayerNorm(), L.Sequential(L.Linear(8), L.Dropout(0.5)))
    return block.apply(block.init(KEY, (2, 8)), jnp.zeros((2, 8)), train=True)


@traced
def _nested_sequential():
    model = L.Sequential(L.Linear(8), L.Sequential(L.ReLU(), L.Linear(4), L.Linear(3)))
    params = model.init(KEY, (2, 6))
    params["1"]["2"]["weight"] = jnp.zeros((3, 5))
    return model.apply(params, jnp.zeros((2, 6)))


@traced
def _sequential_missing_child():
    model = L.Sequential(L.Linear(8), L.ReLU(), L.Linear(3))
    params = model.init(KEY, (2, 6))
    del params["2"]
    return model.apply(params, jnp.zeros((2, 6)))


@traced
def _norm_missing_affine(layer, name, shape):
    """An affine norm given params without one of its arrays fails; it is not skipped."""
    model = L.Sequential(layer)
    params = model.init(KEY, shape)
    del params["0"][name]
    kwargs = {"state": model.init_state(shape), "train": True} if "Batch" in repr(layer) else {}
    return model.apply(params, jnp.ones(shape), **kwargs)


def _fields_child(**fields):
    """A composite of the given child fields whose apply runs ``fc`` then ``out``."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Net(L.Layer):
        fc: L.Layer = L.Linear(4)
        out: L.Layer = L.Linear(2)
        spare: L.Layer = L.Identity()
        heads: Any = None

        def apply(self, params, x, *, key=None, train=False):
            return self.call("out", params, self.call("fc", params, x))

    return Net(**fields)


def _frozen_dict_set():
    net = _fields_child(heads={"a": L.Linear(2)})
    net.heads.extra = 1


def _child_init_refuses():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Ids(L.Layer):
        fc: L.Layer = L.Linear(4)
        conv: L.Layer = L.Conv2d(3, 1)

        def apply(self, params, x, *, key=None, train=False):
            return self.call("conv", params, self.call("fc", params, x))

    return Ids().init(KEY, (2, 5))


def _traced_train():
    model = L.Sequential(L.Linear(2), L.Dropout(0.5))
    params = model.init(KEY, (2, 3))
    return jax.jit(model.apply)(params, jnp.ones((2, 3)), train=True, key=KEY)


def _own_and_child_named_alike():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Twice(L.Layer):
        fc: L.Layer = L.Linear(4)

        def own_names(self):
            return ("fc",)

        def apply(self, params, x, *, key=None, train=False):
            return self.call("fc", params, x)

    return Twice()


@traced
def _residual_missing_child():
    block = Residual(L.Linear(8), L.Sequential(L.Linear(8)))
    params = block.init(KEY, (2, 8))
    del params["norm"]
    return block.apply(params, jnp.zeros((2, 8)))


@traced
def _residual_init_nested():
    """A custom layer's ``init_child`` names the child's field in the path."""
    block = Residual(L.LayerNorm(), L.Sequential(L.Linear(8), L.GroupNorm(3)))
    return L.Sequential({"res": block}).init(KEY, (2, 8))


class _Scale(L.Layer):
    """A user layer whose own shape check raises a plain ``ValueError``."""

    def apply(self, params, x, *, key=None, train=False):
        if x.shape[-1] != 4:
            raise ValueError(f"_Scale: input last axis expected 4, got {x.shape[-1]}")
        return 2 * x


@traced
def _sequential_user_value_error():
    return L.Sequential({"s": _Scale()}).apply({}, jnp.zeros((2, 5)))


@traced
def _sequential_init_nested():
    return L.Sequential(L.Linear(8), L.Sequential(L.ReLU(), L.GroupNorm(3))).init(KEY, (2, 8))


@traced
def _transformer_child(name):
    block = L.TransformerBlock(num_heads=2)
    params = block.init(KEY, (1, 3, 8))
    sub = params[name]
    sub["weight"] = jnp.zeros((*sub["weight"].shape[:-1], 5))
    return block.apply(params, jnp.zeros((1, 3, 8)))


@traced
def _repeat_apply_child():
    model = L.Repeat(L.Linear(8), 3)
    params = model.init(KEY, (2, 8))
    return model.apply(params, jnp.zeros((2, 7)))


@traced
def _repeat_in_sequential():
    model = L.Sequential(L.Linear(8), L.Repeat(L.TransformerBlock(num_heads=2), 2))
    params = model.init(KEY, (1, 3, 4))
    params["1"].tree["ln1"]["weight"] = jnp.ones((2, 6))  # both stacked blocks
    return model.apply(params, jnp.zeros((1, 3, 4)))


def _torch_parity(case):
    import torch  # present: test_error asks for the torch fixture for these entries

    x = np.ones((2, 4), np.float32)
    if case == "module":
        return pl.testing.assert_matches_torch(L.Linear(4), lambda x: x, x)
    if case == "names":
        return pl.testing.assert_matches_torch(L.Linear(4, bias=False), torch.nn.Linear(4, 4), x)
    if case == "outputs":
        return pl.testing.assert_matches_torch(L.Lambda(lambda x: (x, x)), torch.nn.Identity(), x)
    if case == "shapes":
        return pl.testing.assert_matches_torch(L.Lambda(lambda x: x.T), torch.nn.Identity(), x)
    if case == "custom-vjp":
        tanh = jax.custom_vjp(jnp.tanh)
        tanh.defvjp(lambda x: (jnp.tanh(x), x), lambda x, g: (g / jnp.cosh(x) ** 2,))
        return pl.testing.assert_matches_torch(L.Lambda(tanh), torch.nn.Tanh(), x)
    if case == "buffers":
        nested = torch.nn.Sequential(torch.nn.BatchNorm1d(4, affine=False))
        return pl.testing.assert_matches_torch(L.BatchNorm1d(affine=False), nested, x)
    torch.manual_seed(0)  # the report lists the larger difference first: fix the values
    module = torch.nn.Linear(4, 4)
    params = {"weight": jnp.zeros((4, 4)), "bias": jnp.ones(4)}
    return pl.testing.assert_matches_torch(L.Linear(4), module, x, params=params)


def _tied_lm():
    return L.Tied(
        L.Sequential({"wte": L.Embedding(5, 3), "head": L.Linear(5, bias=False)}),
        {"head.weight": "wte.weight"},
    )


@traced
def _repeat_per_block_params():
    model = L.Repeat(L.Linear(4), 3)
    params = model.init(KEY, (2, 4))
    return model.apply({"first": params[0], "last": params[2]}, jnp.zeros((2, 4)))


@traced
def _mha_apply(x_shape, init_shape=(1, 3, 8), **kwargs):
    layer = L.MultiHeadAttention(2)
    return layer.apply(layer.init(KEY, init_shape), jnp.zeros(x_shape), **kwargs)


@traced
def _mha_cache(cache_shape, x_shape=(1, 3, 8), **kw):
    layer = L.MultiHeadAttention(2, causal=True, **kw)
    params = layer.init(KEY, (1, 3, 8))
    cache = layer.init_cache(cache_shape)
    return layer.apply(params, jnp.zeros(x_shape), cache=cache)


def _repeat_cache_overflow():
    stack = L.Repeat(L.TransformerBlock(2), 2)
    params = stack.init(KEY, (1, 3, 8))
    _, cache = stack.apply(params, jnp.zeros((1, 3, 8)), cache=stack.init_cache((1, 4, 8)))
    return stack.apply(params, jnp.zeros((1, 3, 8)), cache=cache)


def _mha_cache_overflow():
    """Eager calls (a concrete cached length): 3 positions, then 3 more into a cache of 4."""
    layer = L.MultiHeadAttention(2, causal=True)
    params = layer.init(KEY, (1, 3, 8))
    _, cache = layer.apply(params, jnp.zeros((1, 3, 8)), cache=layer.init_cache((1, 4, 8)))
    return layer.apply(params, jnp.zeros((1, 3, 8)), cache=cache)


@traced
def _sdpa(q, k, v, **kw):
    return L.scaled_dot_product_attention(jnp.zeros(q), jnp.zeros(k), jnp.zeros(v), **kw)


def _save(params, **kw):
    return pl.params.save(_tmp() / "m.safetensors", params, **kw)


P = {"w": jnp.zeros((2, 3))}


@jax.custom_jvp
def _bad_grad(x):
    return jnp.sin(x)


_bad_grad.defjvp(lambda primals, tangents: (jnp.sin(primals[0]), 2.0 * tangents[0]))


def _truncated() -> pathlib.Path:
    path = _save(P)
    path.write_bytes(path.read_bytes()[:-3])
    return path


# (id, trigger, exception type, message regex)
# fmt: off

# -- purelayers.models ----------------------------------------------------------------

def _repeat_one_block_of_two():
    rep = L.Repeat(L.Linear(4), 2)
    blocks = rep.unstack(rep.init(KEY, (1, 4)))
    return rep.apply({"0": blocks["0"]}, jnp.zeros((1, 4)))


def _gpt2(**overrides):
    from purelayers import models as M

    config = dict(vocab_size=11, n_positions=8, n_embd=8, n_layer=1, n_head=2)
    return M.GPT2LMHeadModel(M.GPT2Config(**{**config, **overrides}))


def _llama():
    from purelayers import models as M

    return M.LlamaForCausalLM(M.LlamaConfig(
        vocab_size=11, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
        num_attention_heads=2))


def _lm_apply(model, ids, **kwargs):
    """The model's decoder (``transformer``, ``model``) applied, traced abstractly."""
    (decoder,) = [c for n, c in model.children().items() if n != "lm_head"]
    return jax.eval_shape(
        lambda p: decoder.apply(p, ids, **kwargs), pl.params.abstract(decoder, (1, 1))
    )


_SAMPLE = {"do_sample": True, "key": KEY}  # greedy decoding ignores the sampling settings


def _generate(**kwargs):
    from purelayers import models as M

    model = _gpt2()
    params = pl.params.abstract(model, (1, 1))
    args = {"max_new_tokens": 2, **kwargs}
    ids = args.pop("ids", np.zeros((1, 3), np.int32))
    return M.generate(model, params, ids, **args)


def _whisper_generate(**kwargs):
    from purelayers import models as M

    config = M.WhisperConfig(
        vocab_size=10, num_mel_bins=2, d_model=4, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=1, decoder_attention_heads=1, encoder_ffn_dim=4,
        decoder_ffn_dim=4, max_source_positions=2, max_target_positions=4, pad_token_id=0,
    )  # fmt: skip
    features = np.zeros((1, 2, 4), np.float32)
    return M.generate(M.WhisperForConditionalGeneration(config), {}, features, **kwargs)


def _folder(config=None, text=None, weights=None):
    """A model folder holding ``config.json`` (a dict, or raw text) and weights."""
    folder = _tmp()
    if text is not None or config is not None:
        (folder / "config.json").write_text(text if text is not None else __import__("json").dumps(config))
    if weights is not None:
        pl.params.save(folder / "model.safetensors", weights)
    return folder


def _from_pretrained(folder, **kwargs):
    from purelayers import models as M

    return M.from_pretrained(folder, **kwargs)


def _from_hub_offline(repo_id):
    """``from_pretrained(repo_id)`` with ``HF_HUB_OFFLINE=1`` and an empty cache."""
    import os

    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_HUB_CACHE")}
    os.environ.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(_tmp()))
    try:
        return _from_pretrained(repo_id)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _save_pretrained(model, **kwargs):
    from purelayers import models as M

    return M.save_pretrained(_tmp() / "out", model, None, **kwargs)


def _sft():
    from purelayers.models import sft

    return sft


class _ToyTokenizer:
    """What ``sft_batch`` needs of a transformers tokenizer: a chat template (``[role]
    text|``, the generation prompt ``[assistant]``, or a different one with ``odd``) and
    one id per character."""

    pad_token_id = None

    def __init__(self, eos=0, odd=False):
        self.eos_token_id, self.odd = eos, odd

    def apply_chat_template(self, turns, tokenize=False, add_generation_prompt=False):
        text = "".join(f"[{t['role']}]{t['content']}|" for t in turns)
        return text + ("[bot]" if self.odd else "[assistant]") * add_generation_prompt

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) % 50 for c in text]}


def _sft_batch(examples, tokenizer=None, **kwargs):
    return _sft().sft_batch(tokenizer or _ToyTokenizer(), examples, **{"max_length": 64, **kwargs})


_GPT2_JSON = dict(model_type="gpt2", vocab_size=11, n_positions=8, n_embd=8, n_layer=1, n_head=2)
_LLAMA_JSON = dict(
    model_type="llama", vocab_size=11, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
    num_attention_heads=2,
)  # fmt: skip


def _generation_folder(text):
    folder = _folder(_GPT2_JSON)
    (folder / "generation_config.json").write_text(text)
    return folder

CATALOG: list[tuple[str, Callable[[], Any], type[BaseException], str]] = [
    # -- core: containers and paths ----------------------------------------------------
    ("layer-apply-undefined", lambda: L.Layer().apply({}, 1.0), NotImplementedError,
     r"^Layer does not define apply$"),
    ("sequential-not-a-layer", lambda: L.Sequential(L.Linear(2), jnp.tanh), ValueError,
     r"^Sequential: layers\[1\] must be a Layer, got .*; wrap plain functions in Lambda\(fn\)"),
    ("sequential-path",
     lambda: run(L.Sequential(L.Linear(4), L.ReLU(), L.Linear(3)), (2, 5), x=jnp.zeros((2, 6))),
     LayerError,
     r"^Sequential\[0\] Linear: input last axis expected 5, got 6\n  x.shape"),
    ("sequential-nested-path", _nested_sequential, LayerError,
     r"^Sequential\[1\.2\] Linear: input last axis expected 5, got 4"),
    ("sequential-init-nested-path", _sequential_init_nested, LayerError,
     r"^Sequential\[1\.1\] GroupNorm: channels \(axis 1\) must divide into num_groups=3"),
    ("composite-init-path", _residual_init_nested, LayerError,
     r"^Sequential\[res\.body\.1\] GroupNorm: channels \(axis 1\) must divide into num_groups=3"),
    ("user-value-error-path", _sequential_user_value_error, LayerError,
     r"^Sequential\[s\] _Scale: input last axis expected 4, got 5$"),
    ("composite-call-path", lambda: _apply_residual((2, 7)), LayerError,
     r"^Residual\[norm\] LayerNorm: the last axis of x must be 8"),
    ("composite-call-nested-key", _residual_train_without_key, LayerError,
     r"^Residual\[body\.1\] Dropout: train=True draws random numbers and needs a PRNG key"),
    ("sequential-missing-child-params", _sequential_missing_child, LayerError,
     r"^Sequential\[2\] Linear: params has no entry 'weight'\n  got keys \[\]; pass the "
     r"tree init returned"),
    ("layernorm-missing-bias", lambda: _norm_missing_affine(L.LayerNorm(), "bias", (2, 4)),
     LayerError, r"^Sequential\[0\] LayerNorm: params has no entry 'bias'\n  got keys \['weight'\]"),
    ("rmsnorm-missing-weight", lambda: _norm_missing_affine(L.RMSNorm(), "weight", (2, 4)),
     LayerError, r"^Sequential\[0\] RMSNorm: params has no entry 'weight'\n  got keys \[\]"),
    ("groupnorm-missing-weight", lambda: _norm_missing_affine(L.GroupNorm(2), "weight", (2, 4, 3)),
     LayerError, r"^Sequential\[0\] GroupNorm: params has no entry 'weight'\n  got keys \['bias'\]"),
    ("batchnorm-missing-bias", lambda: _norm_missing_affine(L.BatchNorm1d(), "bias", (3, 4)),
     LayerError, r"^Sequential\[0\] BatchNorm1d: params has no entry 'bias'\n  got keys \['weight'\]"),
    ("composite-dict-key-dot", lambda: _fields_child(heads={"a.b": L.Linear(2)}), ValueError,
     r"^Net: heads: child names must be non-empty strings without '\.', got 'a\.b'"),
    ("composite-name-twice", lambda: _own_and_child_named_alike(), ValueError,
     r"^Twice: the name 'fc' is used twice, by a child \(field 'fc'\) and by one of the "
     r"layer's own arrays"),
    ("composite-frozen-dict", _frozen_dict_set, AttributeError, r"^FrozenDict is immutable$"),
    ("composite-unreached-child", lambda: _fields_child(spare=L.Linear(3)).init(KEY, (2, 5)),
     LayerError, r"^Net: child 'spare' \(Linear\) has parameters but apply did not call it"),
    ("composite-child-init-refuses", _child_init_refuses, LayerError,
     r"^Ids\[conv\] Conv2d: input rank expected 4 \(N, C, H, W\) or 3"),
    ("traced-train", _traced_train, LayerError,
     r"train is a traced value.*\n  pass it as a static argument: "
     r"jax\.jit\(model\.apply, static_argnames='train'\)"),
    ("composite-call-missing-params", _residual_missing_child, LayerError,
     r"^Residual\[norm\] Linear: params entries 'weight', 'bias' expected weight: an array of "
     r"shape \(8, 8\); bias: an array of shape \(8,\), got nothing"),
    ("init-shape-type", lambda: L.Linear(4).init(KEY, None), ValueError,
     r"^Linear\.init: shape must be the input's shape \(a tuple of non-negative ints\) or an "
     r"example array \(or jax\.ShapeDtypeStruct\), got None$"),
    ("init-shape-float", lambda: L.Linear(6).init(KEY, (4, 5.5)), ValueError,
     r"^Linear\.init: shape must be .* got \(4, 5\.5\)$"),
    ("init-shape-negative", lambda: L.Linear(6).init(KEY, (4, -5)), ValueError,
     r"^Linear\.init: shape must be .* got \(4, -5\)$"),
    ("init-state-shape-float", lambda: L.BatchNorm1d().init_state((4, 3.5)), ValueError,
     r"^BatchNorm1d\.init_state: shape must be .* got \(4, 3\.5\)$"),
    ("init-shape-traced", lambda: jax.eval_shape(L.Linear(6).init, KEY, (4, 5)), ValueError,
     r"^Linear\.init: shape must be static, got traced values .*jax\.eval_shape\(model\.init, key, "
     r"shape\) traces the shape too\. For an abstract params tree use "
     r"purelayers\.params\.abstract\(model, shape\)"),
    ("lambda-not-callable", lambda: L.Lambda(3), ValueError,
     r"^Lambda: fn must be callable, got 3$"),
    ("flatten-start-dim", lambda: L.Flatten(start_dim=1.5), ValueError,
     r"^Flatten: start_dim must be an integer >= -2147483648, got 1\.5$"),
    ("flatten-end-dim", lambda: L.Flatten(end_dim="x"), ValueError,
     r"^Flatten: end_dim must be an integer >= -2147483648, got 'x'$"),
    ("flatten-axes", lambda: L.Flatten(2, 1).apply({}, jnp.zeros((2, 3, 4))), LayerError,
     r"^Flatten: start_dim=2 and end_dim=1 must name axes of x.shape == \(2, 3, 4\)"),
    # -- linear ------------------------------------------------------------------------
    ("linear-out-features", lambda: L.Linear(0), ValueError,
     r"^Linear: out_features must be a positive integer, got 0$"),
    ("linear-init-scalar", lambda: L.Linear(2).init(KEY, ()), LayerError,
     r"^Linear: input rank expected at least 1 \(\.\.\., in_features\), got 0 \(a scalar\)$"),
    ("linear-last-axis-jit", lambda: jitted(L.Linear(3), (2, 4), (2, 5)), LayerError,
     r"^Linear: input last axis expected 4, got 5\n  x.shape == \(2, 5\); Linear was "
     r"initialized for 4 input features \(weight \(3, 4\)\)"),
    # -- activation --------------------------------------------------------------------
    ("activation-function-undefined",
     lambda: L.activation._Activation().apply({}, jnp.zeros(2)), NotImplementedError,
     r"^_Activation: a subclass defines function\(x\)$"),
    ("leaky-relu-slope", lambda: L.LeakyReLU(float("nan")), ValueError,
     r"^LeakyReLU: negative_slope must be a finite number, got nan$"),
    ("elu-alpha", lambda: L.ELU("1"), ValueError, r"^ELU: alpha must be a finite number, got '1'$"),
    ("gelu-approximate", lambda: L.GELU("fast"), ValueError,
     r"^GELU: approximate must be one of 'none', 'tanh', got 'fast'$"),
    ("softplus-beta", lambda: L.Softplus(beta=0.0), ValueError,
     r"^Softplus: beta must be nonzero \(the output is divided by it\), got 0\.0$"),
    ("softplus-beta-type", lambda: L.Softplus(beta="1"), ValueError,
     r"^Softplus: beta must be a finite number, got '1'$"),
    ("softplus-threshold", lambda: L.Softplus(threshold=float("inf")), ValueError,
     r"^Softplus: threshold must be a finite number, got inf$"),
    ("softmax-axis", lambda: L.Softmax(1.0), ValueError, r"^Softmax: dim must be an integer"),
    ("softmax-dim-and-axis", lambda: L.Softmax(1, axis=0), ValueError,
     r"^Softmax: dim and axis are one setting; got dim=1 and axis=0$"),
    ("log-softmax-axis", lambda: L.LogSoftmax(True), ValueError,
     r"^LogSoftmax: dim must be an integer .*, got True$"),
    ("prelu-num-parameters", lambda: L.PReLU(0), ValueError,
     r"^PReLU: num_parameters must be a positive integer, got 0$"),
    ("prelu-init-value", lambda: L.PReLU(init_value=None), ValueError,
     r"^PReLU: init_value must be a finite number, got None$"),
    ("prelu-init-torch-name", lambda: L.PReLU(init="0.1"), ValueError,
     r"^PReLU: init must be a finite number, got '0\.1'$"),
    ("prelu-init-twice", lambda: L.PReLU(init=0.1, init_value=0.2), ValueError,
     r"^PReLU: init and init_value name one argument; got init=0\.1 and init_value=0\.2$"),
    ("prelu-channels", lambda: L.PReLU(3).init(KEY, (2, 4, 5)), LayerError,
     r"^PReLU: input channels \(axis 1\) expected 3, got 4\n  x.shape == \(2, 4, 5\); "
     r"PReLU\(num_parameters=3\) learns one slope per channel on axis 1$"),
    # -- dropout -----------------------------------------------------------------------
    ("dropout-p", lambda: L.Dropout(1.5), ValueError,
     r"^Dropout: p must be in \[0, 1\], got 1\.5$"),
    ("dropout-needs-key", lambda: L.Dropout(0.1).apply({}, jnp.zeros(3), train=True), LayerError,
     r"^Dropout: train=True draws random numbers and needs a PRNG key; pass "
     r"key=jax\.random\.key\(seed\)"),
    ("dropout-int-train", lambda: L.Dropout2d(0.5).apply(
        {}, jnp.ones((1, 2, 3, 3), jnp.int32), train=True, key=jax.random.key(0)), LayerError,
     r"^Dropout2d: input dtype in train mode expected floating point, got int32\n  as torch, "
     r"which cannot scale integer, bool or complex inputs"),
    # -- embedding ---------------------------------------------------------------------
    ("embedding-num", lambda: L.Embedding(0, 4), ValueError,
     r"^Embedding: num_embeddings must be a positive integer, got 0$"),
    ("embedding-dim", lambda: L.Embedding(4, -1), ValueError,
     r"^Embedding: embedding_dim must be a positive integer, got -1$"),
    ("embedding-padding-idx", lambda: L.Embedding(4, 2, padding_idx=4), ValueError,
     r"^Embedding: padding_idx must be in \[-4, 4\), got 4$"),
    ("embedding-table-shape",
     lambda: L.Embedding(4, 2).apply({"weight": jnp.zeros((5, 2))}, jnp.zeros(3, jnp.int32)),
     LayerError,
     r"^Embedding: weight shape expected \(4, 2\), got \(5, 2\)\n  the table"),
    ("embedding-float-ids", lambda: run(L.Embedding(4, 2), (3,), x=jnp.zeros(3)), LayerError,
     r"^Embedding: ids dtype expected an integer dtype, got float32\n  .*astype\(jnp\.int32\)"),
    ("embedding-id-range",
     lambda: L.Embedding(4, 2).apply({"weight": jnp.zeros((4, 2))}, jnp.array([0, 4, 1])),
     LayerError,
     r"^Embedding: id 4 at index \(1,\) is out of range for a table of 4 "
     r"embeddings \(ids must be in \[0, 4\)\)$"),
    # -- conv --------------------------------------------------------------------------
    ("conv-out-channels", lambda: L.Conv2d(0, 3), ValueError,
     r"^Conv2d: out_channels must be a positive integer, got 0$"),
    ("conv-groups", lambda: L.Conv1d(4, 3, groups=0), ValueError,
     r"^Conv1d: groups must be a positive integer, got 0$"),
    ("conv-kernel-size", lambda: L.Conv2d(4, (3, 0)), ValueError,
     r"^Conv2d: kernel_size must be a positive integer or a tuple of 2 such integers, "
     r"got \(3, 0\)$"),
    ("conv-out-divisible", lambda: L.Conv2d(5, 3, groups=2), ValueError,
     r"^Conv2d: out_channels must be divisible by groups, got out_channels=5 and groups=2$"),
    ("conv-bias-flag", lambda: L.Conv1d(4, 3, bias=1), ValueError,
     r"^Conv1d: bias must be True or False, got 1$"),
    ("conv-in-divisible", lambda: L.Conv2d(4, 3, groups=2).init(KEY, (1, 3, 8, 8)), LayerError,
     r"^Conv2d: input channels must be divisible by groups=2; expected a multiple of 2, got 3"),
    ("conv-rank", lambda: L.Conv2d(4, 3).init(KEY, (8, 8)), LayerError,
     r"^Conv2d: input rank expected 4 \(N, C, H, W\) or 3 \(unbatched, C, H, W\), got 2 "
     r"\(x.shape == \(8, 8\)\)$"),
    ("conv-channels", lambda: run(L.Conv1d(4, 3), (1, 2, 8), (1, 3, 8)), LayerError,
     r"^Conv1d: input channels \(axis 1\) expected 2, got 3\n  x.shape == \(1, 3, 8\); Conv1d "
     r"was initialized for 2 input channels"),
    ("conv-reflect-too-wide",
     lambda: run(L.Conv1d(2, 3, padding=3, padding_mode="reflect"), (1, 1, 3)), LayerError,
     r"^Conv1d: padding_mode='reflect' needs each padding smaller than the input "
     r"size; input axis 2 size expected > 3, got 3"),
    ("conv-kernel-does-not-fit", lambda: run(L.Conv1d(2, 5), (1, 1, 3)), LayerError,
     r"^Conv1d: padded input size per spatial axis must hold the dilated kernel; "
     r"expected >= \(5,\), got \(3,\)"),
    ("conv-padding-value", lambda: L.Conv2d(4, 3, padding="full"), ValueError,
     r"^Conv2d: padding must be 'valid', 'same', an integer >= 0 or a tuple of 2 such "
     r"integers, got 'full'$"),
    ("conv-same-stride", lambda: L.Conv2d(4, 3, stride=2, padding="same"), ValueError,
     r"^Conv2d: padding='same' needs stride 1 \(as torch\), got stride=\(2, 2\)$"),
    ("conv-padding-mode", lambda: L.Conv2d(4, 3, padding_mode="wrap"), ValueError,
     r"^Conv2d: padding_mode must be one of .*, got 'wrap'$"),
    ("convT-padding-mode", lambda: L.ConvTranspose2d(4, 3, padding_mode="reflect"), ValueError,
     r"^ConvTranspose2d: padding_mode must be 'zeros' \(torch's transposed convolutions take "
     r"no other\), got 'reflect'$"),
    ("convt-output-padding",
     lambda: L.ConvTranspose2d(4, 3, stride=2, output_padding=2), ValueError,
     r"^ConvTranspose2d: output_padding must be smaller than either stride or "
     r"dilation \(max\(stride, dilation\) = \(2, 2\)\), got \(2, 2\)$"),
    ("convt-output-size-empty",
     lambda: run(L.ConvTranspose1d(2, 1, padding=1), (1, 1, 1)), LayerError,
     r"^ConvTranspose1d: output size per spatial axis expected >= 1, got \(-1,\)"),
    ("convt-output-size-arg",
     lambda: run(L.ConvTranspose1d(2, 3, stride=2), (1, 1, 4), output_size=(9, 9)), LayerError,
     r"^ConvTranspose1d: output_size expected 1 spatial sizes, got \(9, 9\)$"),
    ("convt-output-size-unreachable",
     lambda: run(L.ConvTranspose1d(2, 3, stride=2), (1, 1, 4), output_size=(12,)), LayerError,
     r"^ConvTranspose1d: output_size must be reachable by some output_padding; "
     r"expected each size in \[9, 10\], got \(12,\)$"),
    # -- pool --------------------------------------------------------------------------
    ("pool-output-empty", lambda: L.MaxPool1d(3).apply({}, jnp.zeros((1, 1, 2))), LayerError,
     r"^MaxPool1d: output size per spatial axis expected >= 1, got"),
    ("pool-padding-half", lambda: L.MaxPool2d(2, padding=2), ValueError,
     r"^MaxPool2d: padding must be at most half of kernel_size \(kernel_size // 2 = \(1, 1\)\), "
     r"got \(2, 2\)$"),
    ("pool-ceil-mode-flag", lambda: L.AvgPool1d(2, ceil_mode="yes"), ValueError,
     r"^AvgPool1d: ceil_mode must be True or False, got 'yes'$"),
    ("pool-stride", lambda: L.AvgPool2d(2, stride=(1, 0)), ValueError,
     r"^AvgPool2d: stride must be a positive integer or a tuple of 2 such integers, "
     r"got \(1, 0\)$"),
    ("adaptive-output-size", lambda: L.AdaptiveAvgPool2d((2, 0)), ValueError,
     r"^AdaptiveAvgPool2d: output_size must be a positive integer or a tuple of 2 positive "
     r"integers or None, got \(2, 0\)$"),
    ("pool-rank", lambda: L.MaxPool2d(2).apply({}, jnp.zeros((4, 4))), LayerError,
     r"^MaxPool2d: input rank expected 4 \(N, C, H, W\) or 3 \(unbatched, C, H, W\), got 2"),
    # -- norm --------------------------------------------------------------------------
    ("norm-eps", lambda: L.LayerNorm(eps=0.0), ValueError,
     r"^LayerNorm: eps must be > 0, got 0\.0$"),
    # inputs and params that do not fit (the params check's own messages: tests/test_bad_input.py)
    ("input-dtype", lambda: run(L.Linear(4), (2, 3), dtype=jnp.bool_), LayerError,
     r"^Linear: input dtype expected floating point, got bool\n  the torch "
     r"layer refuses bool inputs too; cast first \(x\.astype\(jnp\.float32\)\)$"),
    ("softmax-axis-out-of-range", lambda: run(L.Sequential(L.Linear(3), L.LogSoftmax(axis=-3)), (2, 3)),
     LayerError, r"^Sequential\[1\] LogSoftmax: axis -3 expected in \[-2, 1\] for an input of "
     r"rank 2, got x\.shape == \(2, 3\)$"),
    ("softmax-axis-root", lambda: run(L.Softmax(3), (2, 3, 4)), LayerError,
     r"^Softmax: axis 3 expected in \[-3, 2\]"),
    ("input-width-0", lambda: L.LSTM(4).init(KEY, (5, 2, 0)), LayerError,
     r"^LSTM: input_size \(input last axis\) expected at least 1 \(torch's RNNs refuse 0\), "
     r"got 0$"),
    ("pool-empty-axis", lambda: run(L.MaxPool2d(2), (2, 3, 0, 8)), LayerError,
     r"^MaxPool2d: input axis 2 length expected at least 1 \(only the batch axis may be empty, "
     r"as in torch\), got 0 \(x\.shape == \(2, 3, 0, 8\)\)$"),
    ("initializer-not-callable", lambda: L.Linear(6, weight_init="xavier_uniform"), ValueError,
     r"^Linear: weight_init must be an initializer fn\(key, shape, dtype\) or None, got "
     r"'xavier_uniform' \(for example pl\.init\.xavier_uniform\(\)\)$"),
    ("summary-model-alone", lambda: pl.params.summary(L.Linear(3)), ValueError,
     r"^summary: give the params to list: summary\(params\), or summary\(model, params, "
     r"state\) for the model's order; got Linear alone$"),
    ("summary-not-arrays", lambda: pl.params.summary(L.Linear(3), (2, 3)), ValueError,
     r"^summary: params must be a tree of arrays \(model\.init's result\), got a leaf 2 in "
     r"tuple \(2, 3\)$"),
    ("stacked-no-entry", lambda: L.Repeat(L.Linear(2), 2).init(KEY, (1, 2))["scale"], KeyError,
     r"scale"),
    ("initializer-factory-uncalled", lambda: L.Linear(6, bias_init=pl.init.zeros), ValueError,
     r"^Linear: bias_init must be an initializer fn\(key, shape, dtype\) or None, got the "
     r"factory pl\.init\.zeros itself \(call it: pl\.init\.zeros\(\)\)$"),
    ("attention-embed-0", lambda: L.MultiHeadAttention(2).init(KEY, (2, 5, 0)), LayerError,
     r"^MultiHeadAttention: input last axis \(embed_dim\) expected at least 1 \(torch's "
     r"attention refuses embed_dim 0\), got 0 \(shape \(2, 5, 0\)\)$"),
    ("rnn-empty-sequence", lambda: run(L.GRU(4, batch_first=True), (2, 0, 3)), LayerError,
     r"^GRU: sequence length expected at least 1 \(torch's RNNs refuse empty sequences too\), "
     r"got 0 \(x\.shape == \(2, 0, 3\)\)$"),
    ("rnn-lengths-range", lambda: L.LSTM(4).apply(L.LSTM(4).init(KEY, (5, 2, 3)),
                                                  jnp.zeros((5, 2, 3)), lengths=np.array([5, 6])),
     LayerError, r"^LSTM: lengths\[1\] expected in \[1, 5\] \(the sequence length; as torch's "
     r"pack_padded_sequence\), got 6$"),
    ("init-cache-shape-float", lambda: L.MultiHeadAttention(2).init_cache((2, 4.5, 8)), ValueError,
     r"^init: shape must be the input's shape .* got \(2, 4\.5, 8\)$"),
    ("init-cache-shape-traced",
     lambda: jax.eval_shape(lambda n: L.MultiHeadAttention(2).init_cache((2, n, 8)), 4),
     ValueError, r"^init: shape must be static, got traced values"),
    ("norm-int-input", lambda: run(L.LayerNorm(), (2, 4), dtype=jnp.int32), LayerError,
     r"^LayerNorm: input dtype expected a floating dtype, got int32\n  normalization layers"),
    ("norm-rank", lambda: L.LayerNorm(normalized_ndim=2).init(KEY, (4,)), LayerError,
     r"^LayerNorm: input rank expected at least normalized_ndim=2, got 1 \(x.shape == \(4,\)\)$"),
    ("norm-width", lambda: run(L.RMSNorm(), (2, 4), (2, 5)), LayerError,
     r"^RMSNorm: the last axis of x must be 4 \(the width it was initialized with\): expected "
     r"x.shape == \(\.\.\., 4\), got x.shape == \(2, 5\)\n  RMSNorm was initialized with"),
    ("layernorm-normalized-ndim", lambda: L.LayerNorm(normalized_ndim=0), ValueError,
     r"^LayerNorm: normalized_ndim must be a positive integer, got 0$"),
    ("rmsnorm-normalized-ndim", lambda: L.RMSNorm(normalized_ndim=1.0), ValueError,
     r"^RMSNorm: normalized_ndim must be a positive integer, got 1\.0$"),
    ("groupnorm-channels", lambda: run(L.GroupNorm(2), (2, 4, 3), (2, 6, 3)), LayerError,
     r"^GroupNorm: input channels \(axis 1\) expected 4, got 6\n  x.shape == \(2, 6, 3\); "
     r"GroupNorm was initialized for 4 channels"),
    ("groupnorm-num-groups", lambda: L.GroupNorm(0), ValueError,
     r"^GroupNorm: num_groups must be a positive integer, got 0$"),
    ("groupnorm-rank", lambda: L.GroupNorm(2).init(KEY, (4,)), LayerError,
     r"^GroupNorm: input rank expected at least 2 \(N, C, \*\), got 1$"),
    ("groupnorm-divide", lambda: L.GroupNorm(3).init(KEY, (2, 4)), LayerError,
     r"^GroupNorm: channels \(axis 1\) must divide into num_groups=3"),
    ("batchnorm-momentum", lambda: L.BatchNorm1d(momentum=1.5), ValueError,
     r"^BatchNorm1d: momentum must be in \[0, 1\], got 1\.5$"),
    ("batchnorm-rank", lambda: L.BatchNorm2d().init(KEY, (2, 3, 4)), LayerError,
     r"^BatchNorm2d: input rank expected 4 \(N, C, H, W\), got 3 \(x.shape == \(2, 3, 4\)\)$"),
    ("batchnorm-missing-state",
     lambda: bn_run(L.BatchNorm1d(), (4, 3), with_state=False), LayerError,
     r"^BatchNorm1d: track_running_stats=True keeps running statistics in a state "
     r"tree; pass state= from BatchNorm1d\.init_state\(shape\)"),
    ("batchnorm-one-value", lambda: bn_run(L.BatchNorm1d(), (1, 3), train=True), LayerError,
     r"^BatchNorm1d: training needs more than 1 value per channel for the batch variance: "
     r"expected N \* \(spatial size\) > 1, got x.shape == \(1, 3\)$"),
    ("batchnorm-channels-in-sequential",
     lambda: bn_run(L.Sequential(L.Linear(4), L.BatchNorm1d()), (2, 3), (2, 5)), LayerError,
     r"^Sequential\[0\] Linear: input last axis expected 3, got 5"),
    # -- attention ---------------------------------------------------------------------
    ("causal-mask-q-len", lambda: L.causal_mask(-1, 3), ValueError,
     r"^causal_mask: q_len must be an integer >= 0, got -1$"),
    ("causal-mask-kv-len", lambda: L.causal_mask(3, 2.0), ValueError,
     r"^causal_mask: kv_len must be an integer >= 0, got 2\.0$"),
    ("rope-odd", lambda: L.rotary_embedding(jnp.zeros((3, 5)), jnp.arange(3)), LayerError,
     r"^rotary_embedding: rotary embedding needs an even head_dim; expected an even number, "
     r"got 5\n  rotate-half"),
    ("rope-rank", lambda: L.rotary_embedding(jnp.zeros(4), 0), LayerError,
     r"^rotary_embedding: x rank expected at least 2 \(\[\.\.\., seq, head_dim\]\), got 1$"),
    ("rope-positions-rank",
     lambda: L.rotary_embedding(jnp.zeros((3, 4)), jnp.zeros((1, 3), jnp.int32)), LayerError,
     r"^rotary_embedding: positions rank expected at most 1, got 2$"),
    ("sdpa-mask-shape",
     lambda: _sdpa((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4), mask=jnp.ones((5, 3), bool)),
     LayerError,
     r"^scaled_dot_product_attention: mask must broadcast to \(\*batch, heads, "
     r"q_len, kv_len\); expected \(1, 2, 3, 3\), got \(5, 3\)$"),
    ("mha-int-mask", lambda: _mha_apply((1, 3, 8), mask=jnp.ones((3, 3), jnp.int32)), LayerError,
     r"^MultiHeadAttention: mask dtype expected bool \(True attends\) or floating \(added to "
     r"the scores\), got int32\n  an integer mask is ambiguous"),
    ("sdpa-dropout-key",
     lambda: _sdpa((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4), dropout_p=0.5), LayerError,
     r"^scaled_dot_product_attention: train=True draws random numbers"),
    ("sdpa-dropout-p",
     lambda: _sdpa((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4), dropout_p=1.5), ValueError,
     r"^scaled_dot_product_attention: dropout_p must be in \[0, 1\], got 1\.5$"),
    ("sdpa-rank", lambda: _sdpa((2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4)), LayerError,
     r"^scaled_dot_product_attention: q, k and v must have the same rank, at least 3"),
    ("sdpa-batch", lambda: _sdpa((1, 2, 3, 4), (2, 2, 3, 4), (2, 2, 3, 4)), LayerError,
     r"^scaled_dot_product_attention: batch axes must agree, and k and v must match except "
     r"in their last axis;\n  q.shape == \(1, 2, 3, 4\)"),
    ("sdpa-head-dim", lambda: _sdpa((1, 2, 3, 4), (1, 2, 3, 5), (1, 2, 3, 4)), LayerError,
     r"^scaled_dot_product_attention: k head_dim \(last axis\) expected 4, got 5$"),
    ("sdpa-gqa", lambda: _sdpa((1, 3, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4)), LayerError,
     r"^scaled_dot_product_attention: q's 3 heads must be a multiple of k's heads; expected "
     r"a divisor of 3, got 2$"),
    ("mha-num-heads", lambda: L.MultiHeadAttention(0), ValueError,
     r"^MultiHeadAttention: num_heads must be a positive integer, got 0$"),
    ("mha-num-kv-heads", lambda: L.MultiHeadAttention(4, num_kv_heads=0), ValueError,
     r"^MultiHeadAttention: num_kv_heads must be a positive integer, got 0$"),
    ("mha-kv-divides", lambda: L.MultiHeadAttention(4, num_kv_heads=3), ValueError,
     r"^MultiHeadAttention: num_kv_heads must be a divisor of num_heads"),
    ("mha-dropout", lambda: L.MultiHeadAttention(2, dropout=-0.1), ValueError,
     r"^MultiHeadAttention: dropout must be in \[0, 1\], got -0\.1$"),
    ("mha-rope-theta", lambda: L.MultiHeadAttention(2, rope_theta=0), ValueError,
     r"^MultiHeadAttention: rope_theta must be > 0, got 0$"),
    ("mha-head-dim", lambda: L.MultiHeadAttention(3).init(KEY, (1, 2, 8)), LayerError,
     r"^MultiHeadAttention: embed_dim 8 \(the last axis of x\) must be divisible by num_heads "
     r"3\n  choose num_heads among \[1, 2, 4, 8\]$"),
    ("mha-rope-odd-head-dim",
     lambda: L.MultiHeadAttention(2, rope=True).init(KEY, (1, 2, 6)), LayerError,
     r"^MultiHeadAttention: rotary embedding needs an even head_dim; expected an "
     r"even number, got 3"),
    ("mha-init-scalar", lambda: L.MultiHeadAttention(2).init(KEY, ()), LayerError,
     r"^MultiHeadAttention: input rank expected 2 or 3, got 0 \(a scalar\)$"),
    ("mha-cache-shape", lambda: L.MultiHeadAttention(2).init_cache((4, 8)), LayerError,
     r"^MultiHeadAttention: init_cache shape expected \(batch, max_len, embed_dim\), "
     r"got \(4, 8\)$"),
    ("mha-projection-path", lambda: _mha_apply((1, 3, 6), init_shape=(1, 3, 4)), LayerError,
     r"^MultiHeadAttention\[qkv\] Linear: input last axis expected 4, got 6"),
    ("mha-rank", lambda: _mha_apply((8,)), LayerError,
     r"^MultiHeadAttention: input rank expected 2 or 3 \(\(seq, E\) or \(batch, seq, E\)\), "
     r"got 1$"),
    ("mha-context-with-cache", lambda: _mha_apply(
         (1, 3, 8),
         cache=L.MultiHeadAttention(2).init_cache((1, 4, 8)),
         context=jnp.zeros((1, 2, 8)),
     ), LayerError,
     r"^MultiHeadAttention: context= \(cross-attention\) works without rope and "
     r"without cache$"),
    ("mha-dropout-key",
     lambda: run(L.MultiHeadAttention(2, dropout=0.5), (1, 3, 8), train=True), LayerError,
     r"^MultiHeadAttention: train=True draws random numbers and needs a PRNG key"),
    ("mha-cache-mismatch", lambda: _mha_cache((2, 4, 8)), LayerError,
     r"^MultiHeadAttention: cache keys/values shape expected \(1, 4, 2, 4\), got "
     r"\(\(2, 4, 2, 4\), \(2, 4, 2, 4\)\)\n  make it with init_cache"),
    ("mha-cache-too-short", lambda: _mha_cache((1, 2, 8)), LayerError,
     r"^MultiHeadAttention: sequence length at most max_len expected 2, got 3$"),
    ("repeat-cache-overflow", _repeat_cache_overflow, LayerError,
     r"^Repeat: cached length plus new positions at most max_len expected 4, got 3 \+ 3 = 6\n"),
    ("mha-cache-overflow", _mha_cache_overflow, LayerError,
     r"^MultiHeadAttention: cached length plus new positions at most max_len expected 4, "
     r"got 3 \+ 3 = 6\n  the cache is full; make a longer one with init_cache$"),
    # -- transformer and repeat --------------------------------------------------------
    ("block-mlp-ratio", lambda: L.TransformerBlock(2, mlp_ratio=0), ValueError,
     r"^TransformerBlock: mlp_ratio must be > 0, got 0$"),
    ("block-dropout", lambda: L.TransformerBlock(2, dropout=1.5), ValueError,
     r"^TransformerBlock: dropout must be in \[0, 1\], got 1\.5$"),
    ("block-activation", lambda: L.TransformerBlock(2, activation="tanh"), ValueError,
     r"^TransformerBlock: activation must be one of 'gelu', 'gelu_tanh', 'relu', 'swiglu', "
     r"got 'tanh'$"),
    ("block-norm", lambda: L.TransformerBlock(2, norm="batchnorm"), ValueError,
     r"^TransformerBlock: norm must be one of 'layernorm', 'rmsnorm', got 'batchnorm'$"),
    ("block-norm-eps", lambda: L.TransformerBlock(2, norm_eps=-1.0), ValueError,
     r"^TransformerBlock: norm_eps must be > 0, got -1\.0$"),
    ("block-hidden-dim", lambda: L.TransformerBlock(2, hidden_dim=0), ValueError,
     r"^TransformerBlock: hidden_dim must be a positive integer, got 0$"),
    ("block-attention-config", lambda: L.TransformerBlock(4, num_kv_heads=3), ValueError,
     r"^TransformerBlock: num_kv_heads must be a divisor of num_heads"),
    ("block-init-rank", lambda: L.TransformerBlock(2).init(KEY, (8,)), LayerError,
     r"^TransformerBlock: input rank expected 2 or 3 \(\(seq, E\) or \(batch, seq, E\)\), "
     r"got 1$"),
    ("block-init-child-path", lambda: L.TransformerBlock(3).init(KEY, (1, 2, 8)), LayerError,
     r"^TransformerBlock\[attn\] MultiHeadAttention: embed_dim 8 .* must be divisible by "
     r"num_heads 3"),
    ("block-apply-rank", lambda: run(L.TransformerBlock(2), (1, 3, 8), (8,)), LayerError,
     r"^TransformerBlock: input rank expected 2 or 3"),
    ("block-dropout-key",
     lambda: run(L.TransformerBlock(2, dropout=0.1), (1, 3, 8), train=True), LayerError,
     r"^TransformerBlock: train=True draws random numbers and needs a PRNG key"),
    ("block-child-ln1", lambda: run(L.TransformerBlock(2), (1, 3, 8), (1, 3, 6)), LayerError,
     r"^TransformerBlock\[ln1\] LayerNorm: the last axis of x must be 8"),
    ("block-child-fc", lambda: _transformer_child("fc"), LayerError,
     r"^TransformerBlock\[fc\] Linear: input last axis expected 5, got 8"),
    ("repeat-chain", lambda: L.Repeat(L.Linear(5), 2).init(KEY, (2, 4)), LayerError,
     r"^Repeat: Linear block output \(the next block's input\) expected shape \(2, 4\) and "
     r"dtype float32, its input's, got shape \(2, 5\) and dtype float32\n  a Repeat chains"),
    ("repeat-layer", lambda: L.Repeat(jnp.tanh, 2), ValueError,
     r"^Repeat: layer must be a Layer, got"),
    ("repeat-n", lambda: L.Repeat(L.Linear(2), 0), ValueError,
     r"^Repeat: n must be a positive integer, got 0$"),
    ("repeat-policy", lambda: L.Repeat(L.Linear(2), 2, remat=True, remat_policy="dots"),
     ValueError, r"^Repeat: remat_policy must be a jax\.checkpoint_policies policy or None, "
     r"got 'dots'$"),
    ("remat-layer", lambda: L.Remat(jnp.tanh), ValueError, r"^Remat: layer must be a Layer, got"),
    ("remat-policy", lambda: L.Remat(L.Linear(2), remat_policy=3), ValueError,
     r"^Remat: remat_policy must be a jax\.checkpoint_policies policy or None, got 3$"),
    ("repeat-init-path", lambda: L.Repeat(L.GroupNorm(3), 2).init(KEY, (2, 4)), LayerError,
     r"^Repeat\[0\] GroupNorm: channels \(axis 1\) must divide into num_groups=3"),
    ("repeat-no-cache", lambda: L.Repeat(L.Linear(2), 2).init_cache((1, 2, 2)), LayerError,
     r"^Repeat: Linear has no decoding cache$"),
    ("repeat-per-block-params", _repeat_per_block_params, LayerError,
     r"^Repeat: params must be the Stacked tree init returns\n  got dict with keys "
     r"\['first', 'last'\]; per-block trees become one with Repeat\.stack\(blocks\)"),
    ("repeat-apply-path", _repeat_apply_child, LayerError,
     r"^Repeat\[\*\] Linear: input last axis expected 8, got 7"),
    ("repeat-in-sequential-path", _repeat_in_sequential, LayerError,
     r"^Sequential\[1\.\*\.ln1\] LayerNorm: the last axis of x must be 6"),
    # -- recurrent ---------------------------------------------------------------------
    ("rnn-hidden-size", lambda: L.LSTM(0), ValueError,
     r"^LSTM: hidden_size must be a positive integer, got 0$"),
    ("rnn-bias-flag", lambda: L.GRU(4, bias="no"), ValueError,
     r"^GRU: bias must be True or False, got 'no'$"),
    ("lstm-forget-bias", lambda: L.LSTM(4, forget_bias="1"), ValueError,
     r"^LSTM: forget_bias must be a finite number, got '1'$"),
    ("lstm-forget-bias-needs-bias", lambda: L.LSTMCell(4, bias=False, forget_bias=1.0), ValueError,
     r"^LSTMCell: forget_bias=1\.0 sets the forget-gate bias, which needs bias=True; "
     r"got bias=False$"),
    ("rnn-num-layers", lambda: L.RNN(4, num_layers=0), ValueError,
     r"^RNN: num_layers must be a positive integer, got 0$"),
    ("rnn-dropout", lambda: L.GRU(4, dropout=1.5), ValueError,
     r"^GRU: dropout must be in \[0, 1\], got 1\.5$"),
    ("rnn-flag", lambda: L.LSTM(4, batch_first=1), ValueError,
     r"^LSTM: batch_first must be True or False, got 1$"),
    ("recurrent-kind-undefined",
     lambda: L.recurrent._Recurrent.kind.fget(L.LSTM(4)), NotImplementedError,
     r"^LSTM: a subclass defines kind$"),
    ("gru-reset-after", lambda: L.GRU(4, reset_after=None), ValueError,
     r"^GRU: reset_after must be True or False, got None$"),
    ("rnn-nonlinearity", lambda: L.RNN(4, nonlinearity="sigmoid"), ValueError,
     r"^RNN: nonlinearity must be one of 'tanh', 'relu', got 'sigmoid'$"),
    ("rnn-init-rank", lambda: L.LSTM(4).init(KEY, (3,)), LayerError,
     r"^LSTM: input rank expected 2 or 3 \(\(T, B, input\) or \(T, input\)\), got 1 "
     r"\(shape \(3,\)\)$"),
    ("rnn-apply-rank", lambda: run(L.GRU(4), (5, 3), (3,)), LayerError,
     r"^GRU: input rank expected 2 or 3 .*, got 1 \(x.shape == \(3,\)\)$"),
    ("rnn-input-size", lambda: run(L.LSTM(4, batch_first=True), (2, 5, 3), (2, 5, 6)), LayerError,
     r"^LSTM: input last axis \(input_size\) expected 3, got 6\n  x.shape == "
     r"\(2, 5, 6\); LSTM was initialized for 3 input features\n  the params do not fit this "
     r"input either: LSTM: params entry 'weight_ih_l0' shape expected \(16, 6\), got \(16, 3\)$"),
    ("rnn-dropout-key",
     lambda: run(L.LSTM(4, num_layers=2, dropout=0.5), (5, 3), train=True), LayerError,
     r"^LSTM: train=True draws random numbers and needs a PRNG key"),
    ("lstm-hx-pair", lambda: run(L.LSTM(4), (5, 2, 3), hx=jnp.zeros((1, 2, 4))), LayerError,
     r"^LSTM: hx expected a pair \(h_0, c_0\), got ArrayImpl$"),
    ("gru-hx-tuple", lambda: run(L.GRU(4), (5, 2, 3), hx=(jnp.zeros((1, 2, 4)),)), LayerError,
     r"^GRU: hx expected one array h_0 \(it has no cell state\), got a tuple$"),
    ("gru-cell-hx-tuple", lambda: run(L.GRUCell(4), (2, 3), hx=(jnp.zeros((2, 4)),)), LayerError,
     r"^GRUCell: hx expected one array \(it has no cell state\), got a tuple$"),
    ("rnn-h0-shape", lambda: run(L.GRU(4), (5, 2, 3), hx=jnp.zeros((2, 2, 4))), LayerError,
     r"^GRU: h_0 shape expected \(1, 2, 4\), got \(2, 2, 4\)$"),
    ("rnn-lengths-shape",
     lambda: run(L.RNN(4), (5, 2, 3), lengths=jnp.array([5, 4, 3])), LayerError,
     r"^RNN: lengths shape expected \(2,\), got \(3,\)\n  one length per sequence"),
    ("rnn-lengths-dtype",
     lambda: run(L.RNN(4), (5, 2, 3), lengths=jnp.array([5.0, 4.0])), LayerError,
     r"^RNN: lengths dtype expected an integer dtype, got float32$"),
    ("cell-init-rank", lambda: L.GRUCell(4).init(KEY, (2, 3, 5)), LayerError,
     r"^GRUCell: input rank expected 1 or 2 \(\(input,\) or \(batch, input\)\), got 3 "
     r"\(shape \(2, 3, 5\)\)$"),
    ("cell-apply-rank", lambda: run(L.RNNCell(4), (2, 3), (1, 2, 3)), LayerError,
     r"^RNNCell: input rank expected 1 or 2 .*, got 3 \(x.shape == \(1, 2, 3\)\)$"),
    ("cell-input-size", lambda: run(L.LSTMCell(4), (2, 3), (2, 5)), LayerError,
     r"^LSTMCell: input last axis \(input_size\) expected 3, got 5"),
    ("lstm-cell-hx-pair", lambda: run(L.LSTMCell(4), (2, 3), hx=jnp.zeros((2, 4))), LayerError,
     r"^LSTMCell: hx expected a pair \(h, c\), got ArrayImpl$"),
    ("cell-hx-shape",
     lambda: run(L.LSTMCell(4), (2, 3), hx=(jnp.zeros((2, 4)), jnp.zeros(4))), LayerError,
     r"^LSTMCell: hx c shape expected \(2, 4\), got \(4,\)$"),
    ("rnn-cell-nonlinearity", lambda: L.RNNCell(4, nonlinearity="gelu"), ValueError,
     r"^RNNCell: nonlinearity must be one of 'tanh', 'relu', got 'gelu'$"),
    ("gru-cell-reset-after", lambda: L.GRUCell(4, reset_after=0), ValueError,
     r"^GRUCell: reset_after must be True or False, got 0$"),
    # -- params: names, strict loading, save ---------------------------------------------
    ("flatten-dotted-key", lambda: pl.params.flatten({"a.b": jnp.zeros(1)}), ValueError,
     r"^flatten: key 'a\.b' under 'the root' cannot be a checkpoint name component "
     r"\(empty or containing '\.'\)$"),
    ("unflatten-empty-part", lambda: pl.params.unflatten({"a..b": 1}), ValueError,
     r"^unflatten: 'a\.\.b' has an empty name component$"),
    ("unflatten-array-then-group", lambda: pl.params.unflatten({"a": 1, "a.b": 2}), ValueError,
     r"^unflatten: 'a\.b' needs 'a' to be a group, but it is an array$"),
    ("unflatten-group-then-array", lambda: pl.params.unflatten({"a.b": 1, "a": 2}), ValueError,
     r"^unflatten: 'a' is both an array and a group of arrays$"),
    ("merge-clash", lambda: pl.params.merge({"w": 1}, {"w": 2}), ValueError,
     r"^merge: 'w' is both a parameter and a buffer$"),
    ("load-strict-keys", lambda: pl.params.load_state_dict(P, {"v": np.zeros((2, 3))}), KeyError,
     r"load_state_dict: the checkpoint does not match the model by name; missing keys: "
     r"\['w'\]; unexpected keys: \['v'\]"),
    ("load-abstract-missing", lambda: pl.params.load_state_dict({"w": jax.ShapeDtypeStruct((2,), jnp.float32)}, {}, strict=False), KeyError,
     r"load_state_dict: missing keys with no template value to keep: \['w'\]"),
    ("load-not-numbers", lambda: pl.params.load_state_dict(P, {"w": [["a", "b", "c"]] * 2}), ValueError,
     r"^load_state_dict: values that are not numbers under 'w' \(list\)$"),
    ("load-shape", lambda: pl.params.load_state_dict(P, {"w": np.zeros((3, 2))}), ValueError,
     r"^load_state_dict: shape mismatch for w: expected \(2, 3\), got \(3, 2\)$"),
    ("save-dtype", lambda: _save({"w": np.array(["a", "b"])}), ValueError,
     r"^save: 'w' has dtype <U1, which safetensors cannot store; use one of"),
    ("save-metadata-type", lambda: _save(P, metadata=[("a", "b")]), ValueError,
     r"^save: metadata must be a dict of str to str, got \[\('a', 'b'\)\]$"),
    ("save-metadata-values", lambda: _save(P, metadata={"epoch": 3}), ValueError,
     r"^save: metadata must map str to str, got 'epoch': 3 \(str to int\); convert it"),
    ("save-metadata-reserved",
     lambda: _save(P, metadata={pl.params._io.ORDER_KEY: "x"}), ValueError,
     r"^save: metadata key '.*' is reserved for the name order$"),
    ("save-metadata-reserved-aliases",
     lambda: _save(P, metadata={"purelayers.aliases": "{}"}), ValueError,
     r"^save: metadata key 'purelayers\.aliases' is reserved for the tied names$"),
    ("save-to-folder", lambda: pl.params.save(_tmp(), P), ValueError,
     r"^save: .* is a folder; pass a file name such as .*, or max_shard_bytes="),
    ("save-abstract", lambda: _save({"w": jax.ShapeDtypeStruct((2,), jnp.float32)}), ValueError,
     r"^save: 'w' is a jax\.ShapeDtypeStruct \(an abstract template holds no values\): save arrays"),
    ("save-no-folder", lambda: pl.params.save(_tmp() / "none" / "m.safetensors", P), FileNotFoundError,
     r"^save: the folder of .*none/m\.safetensors does not exist$"),
    ("save-shards-onto-file", lambda: (lambda f: (f.write_bytes(b"x"), pl.params.save(f, P, max_shard_bytes=8)))(_tmp() / "m.safetensors"), ValueError,
     r"^save: .*m\.safetensors is a file; a sharded save \(max_shard_bytes=\) writes a folder$"),
    ("save-shard-type", lambda: _save(P, max_shard_bytes=1.5), ValueError,
     r"^save: max_shard_bytes must be a positive int, got 1\.5$"),
    ("save-shard-size", lambda: _save(P, max_shard_bytes=0), ValueError,
     r"^save: max_shard_bytes must be a positive int, got 0$"),
    ("load-missing-file", lambda: pl.params.load(_tmp() / "none.safetensors"), FileNotFoundError,
     r"^no checkpoint at .*none\.safetensors: the file does not exist$"),
    ("load-truncated", lambda: pl.params.load(_truncated()), CheckpointError, r"m\.safetensors"),
    ("rename-rule-name", lambda: pl.params.rename({"a": 1}, {"": "b"}), ValueError,
     r"^rename: rule '' is not a dotted name$"),
    ("rename-rule-target", lambda: pl.params.rename({"a": 1}, {"a": 3}), ValueError,
     r"^rename: rule 'a' maps to 3, not a str or None$"),
    ("rename-mapping", lambda: pl.params.rename({"a": 1}, ["a"]), ValueError,
     r"^rename: mapping must be a dict or a function, got \['a'\]$"),
    ("rename-result", lambda: pl.params.rename({"a": 1}, lambda n: n + "."), ValueError,
     r"^rename: 'a' maps to 'a\.', which is not a dotted name$"),
    ("rename-clash", lambda: pl.params.rename({"a": 1, "b": 2}, {"a": "c", "b": "c"}), ValueError,
     r"^rename: several names map to one name: "),
    # -- init ----------------------------------------------------------------------------
    ("fans-rank", lambda: pl.init.fans((3,)), ValueError,
     r"^fans: shape must have at least 2 axes \(\[out, in, \*kernel\]\), got \(3,\)$"),
    ("gain-param", lambda: pl.init.calculate_gain("leaky_relu", "0.1"), ValueError,
     r"^calculate_gain: param must be a number, got '0\.1'$"),
    ("gain-nonlinearity", lambda: pl.init.calculate_gain("swish"), ValueError,
     r"^calculate_gain: nonlinearity must be one of .*'leaky_relu', got 'swish'$"),
    ("orthogonal-rank", lambda: pl.init.orthogonal()(KEY, (4,), jnp.float32), ValueError,
     r"^orthogonal: shape must have at least 2 axes, got \(4,\)$"),
    ("uniform-range", lambda: pl.init.uniform(2.0, 1.0), ValueError,
     r"^uniform: a must be <= b, got a=2\.0, b=1\.0$"),
    ("initializer-number", lambda: pl.init.xavier_uniform(gain="x"), ValueError,
     r"^xavier_uniform: gain must be a real number, got 'x'$"),
    ("normal-std", lambda: pl.init.normal(std=-1.0), ValueError,
     r"^normal: std must be >= 0, got -1\.0$"),
    ("trunc-normal-std", lambda: pl.init.trunc_normal(std=0.0), ValueError,
     r"^trunc_normal: std must be > 0, got 0\.0$"),
    ("trunc-normal-range", lambda: pl.init.trunc_normal(a=2.0, b=-2.0), ValueError,
     r"^trunc_normal: a must be < b, got a=2\.0, b=-2\.0$"),
    ("kaiming-mode", lambda: pl.init.kaiming_normal(mode="avg"), ValueError,
     r"^kaiming_normal: mode must be 'fan_in' or 'fan_out', got 'avg'$"),
    # -- debug ---------------------------------------------------------------------------
    ("debug-assert-finite", lambda: pl.debug.assert_finite({"a": jnp.array([1.0, jnp.nan])}),
     pl.debug.CheckError,
     r"^assert_finite: value is not finite: NaN or Inf in a \(1 of 2 entries\)$"),
    ("debug-checked-nan", lambda: pl.debug.checked(jnp.log)(-jnp.ones(2)), pl.debug.CheckError,
     r"^checked\(log\): a NaN appeared inside the function: nan generated by primitive: log"),
    ("debug-checked-output", lambda: pl.debug.checked(lambda x: x * 2)(jnp.array([3e38])),
     pl.debug.CheckError,
     r"^checked\(.*<lambda>\): the output is not finite: NaN or Inf in value \(1 of 1 entries\)$"),
    # -- testing -------------------------------------------------------------------------
    ("torch-parity-module", lambda: _torch_parity("module"), TypeError,
     r"^assert_matches_torch: module must be a torch\.nn\.Module, got <function"),
    ("torch-parity-custom-vjp", lambda: _torch_parity("custom-vjp"), TypeError,
     r"^assert_matches_torch: Lambda has no forward-mode autodiff \(a custom VJP inside it"),
    ("torch-parity-names", lambda: _torch_parity("names"), AssertionError,
     r"^assert_matches_torch: parameter names differ\n  ours  \['weight'\]\n  torch "
     r"\['weight', 'bias'\]$"),
    ("torch-parity-buffers", lambda: _torch_parity("buffers"), AssertionError,
     r"^assert_matches_torch: buffer names differ\n  ours  \['running_mean', 'running_var', "
     r"'num_batches_tracked'\]\n  torch \['0\.running_mean'"),
    ("torch-parity-outputs", lambda: _torch_parity("outputs"), AssertionError,
     r"^assert_matches_torch: 2 outputs, torch's 1$"),
    ("torch-parity-shapes", lambda: _torch_parity("shapes"), AssertionError,
     r"^assert_matches_torch: output 0: shape \(4, 2\), torch's \(2, 4\)$"),
    ("torch-parity-values", lambda: _torch_parity("values"), AssertionError,
     r"^assert_matches_torch: Linear differs from Linear \(rtol=1e-05, atol=1e-05\):\n  "
     r"output 0: max \|diff\|"),
    ("gradcheck-no-float-args",
     lambda: pl.testing.gradcheck(lambda i: i * 1.0, jnp.arange(3)), ValueError,
     r"^gradcheck: no floating-point leaf in args to differentiate$"),
    ("gradcheck-no-float-output",
     lambda: pl.testing.gradcheck(lambda x: (x > 0).astype(jnp.int32), jnp.ones(2)), ValueError,
     r"^gradcheck: fn returned no floating-point output"),
    ("gradcheck-wrong-derivative",
     lambda: pl.testing.gradcheck(_bad_grad, jnp.ones(2)), AssertionError,
     r"^gradcheck: the reverse-mode derivative with respect to .*argument 0.* "
     r"disagrees with central finite differences"),
    ("allclose-names",
     lambda: pl.testing.assert_tree_allclose({"a": 1.0}, {"b": 1.0}), AssertionError,
     r"^tree: names differ: \['a'\] vs \['b'\]$"),
    ("allclose-values",
     lambda: pl.testing.assert_tree_allclose({"a": 1.0}, {"a": 2.0}), AssertionError,
     r"^tree differs \(rtol=1e-05, atol=1e-06\): a"),
    # -- composition: named children, tying, stacked blocks, attention parts ------------
    ("stacked-index", lambda: pl.params.Stacked({"w": jnp.zeros((2, 3))}, 2)[5], IndexError,
     r"^Stacked: block 5 of 2$"),
    ("merge-stacked", lambda: pl.params.merge({"a": pl.params.Stacked({"w": jnp.zeros((2, 3))}, 2)}, {"a": {"x": jnp.zeros(1)}}), ValueError,
     r"^merge: stacked params and state must both be Stacked, of one n$"),
    ("rope-theta", lambda: L.RotaryEmbedding(0.0), ValueError,
     r"^RotaryEmbedding: theta must be > 0, got 0\.0$"),
    ("core-heads", lambda: L.AttentionCore(0), ValueError,
     r"^AttentionCore: num_heads must be a positive integer, got 0$"),
    ("core-kv", lambda: L.AttentionCore(4, num_kv_heads=0), ValueError,
     r"^AttentionCore: num_kv_heads must be a positive integer, got 0$"),
    ("core-kv-div", lambda: L.AttentionCore(4, num_kv_heads=3), ValueError,
     r"^AttentionCore: num_kv_heads must be a divisor of num_heads=4, got 3$"),
    ("core-dropout", lambda: L.AttentionCore(4, dropout=1.5), ValueError,
     r"^AttentionCore: dropout must be in \[0, 1\], got 1\.5$"),
    ("core-rope", lambda: L.AttentionCore(4, rope=True), ValueError,
     r"^AttentionCore: rope must be a RotaryEmbedding or None, got True$"),
    ("core-scale", lambda: L.AttentionCore(4, scale=0.0), ValueError,
     r"^AttentionCore: scale must be > 0, got 0\.0$"),
    ("core-split", lambda: L.AttentionCore(3).apply({}, jnp.zeros((1, 2, 8))), LayerError,
     r"^AttentionCore: q must be \(batch, seq, heads \* head_dim\) with 3 heads; expected a last axis divisible by 3, got \(1, 2, 8\)$"),
    ("core-mismatch", lambda: L.AttentionCore(2).apply({}, jnp.zeros((1, 2, 8)), jnp.zeros((1, 2, 6)), jnp.zeros((1, 2, 6))), LayerError,
     r"^AttentionCore: q, k and v must agree in batch, k and v in length, q and k in head_dim;"),
    ("core-rope-cross", lambda: L.AttentionCore(2, rope=L.RotaryEmbedding()).apply({}, jnp.zeros((1, 2, 8)), jnp.zeros((1, 3, 8)), jnp.zeros((1, 3, 8))), LayerError,
     r"^AttentionCore: rope needs self\-attention \(kv_len == q_len\); expected 2, got 3$"),
    ("core-rope-odd", lambda: L.AttentionCore(2, rope=L.RotaryEmbedding()).apply({}, jnp.zeros((1, 2, 6))), LayerError,
     r"^AttentionCore: rotary embedding needs an even head_dim; expected an even number, got 3"),
    ("call-no-child", lambda: L.Sequential(L.Linear(2)).call("x", {}, jnp.zeros((1, 2))), LayerError,
     r"^Sequential: has no child 'x'"),
    ("seq-dot", lambda: L.Sequential({"a.b": L.ReLU()}), ValueError,
     r"^Sequential: child names must be non\-empty strings without '\.', got 'a\.b' \(a dot would split the checkpoint name\)$"),
    ("seq-dup", lambda: L.Sequential([("a", L.ReLU()), ("a", L.Tanh())]), ValueError,
     r"^Sequential: two children are named 'a'$"),
    ("linear-transposed", lambda: L.Linear(2, transposed=1), ValueError,
     r"^Linear: transposed must be True or False, got 1$"),
    ("mha-rope", lambda: L.MultiHeadAttention(2, rope=3), ValueError,
     r"^MultiHeadAttention: rope must be True, False or a RotaryEmbedding, got 3$"),
    ("attn-field", lambda: L.Attention(1, L.Linear(2), L.Linear(2), L.Linear(2), L.AttentionCore(1)), ValueError,
     r"^Attention: q_proj must be a Layer, got 1$"),
    ("attn-core", lambda: L.Attention(L.Linear(2), L.Linear(2), L.Linear(2), L.Linear(2), 3), ValueError,
     r"^Attention: core must be an AttentionCore, got 3$"),
    ("attn-build-head-dim", lambda: L.Attention.build(8, 2, head_dim=0), ValueError,
     r"^Attention\.build: head_dim must be a positive integer, got 0$"),
    ("attn-build-embed-dim", lambda: L.Attention.build(8.0, 2), ValueError,
     r"^Attention\.build: embed_dim must be a positive integer, got 8\.0$"),
    ("attn-build-heads-over-width", lambda: L.Attention.build(8, 16), ValueError,
     r"^Attention\.build: head_dim must be a positive int \(embed_dim // num_heads is 0\), got None$"),
    ("attn-cache", lambda: L.Attention.build(8, 2).init_cache((1, 4)), LayerError,
     r"^Attention: init_cache shape expected \(batch, max_len, embed_dim\), got \(1, 4\)$"),
    ("repeat-stack", lambda: L.Repeat(L.Linear(2), 2).stack({"0": {}}), LayerError,
     r"^Repeat: blocks expected \['0', '1'\], got \['0'\]$"),
    ("repeat-depth", lambda: L.Repeat(L.Linear(2), 3).apply(L.Repeat(L.Linear(2), 2).init(KEY, (1, 2)), jnp.zeros((1, 2))), LayerError,
     r"^Repeat: params blocks expected 3, got 2$"),
    ("tied-layer", lambda: L.Tied(3, {"a": "b"}), ValueError,
     r"^Tied: layer must be a Layer, got 3$"),
    ("tied-stacked", lambda: L.Tied(L.Sequential({"blocks": L.Repeat(L.Linear(4), 2), "head": L.Linear(4, bias=False)}), {"head.weight": "blocks.0.weight"}), ValueError,
     r"^Tied: original 'blocks\.0\.weight' lies in the stacked blocks of the Repeat at 'blocks', which holds one array per name"),
    ("tied-empty", lambda: L.Tied(L.Linear(2), {}), ValueError,
     r"^Tied: aliases must be a non\-empty mapping of alias to original, got \{\}$"),
    ("tied-unknown", lambda: L.Tied(L.Sequential({"wte": L.Embedding(5, 3)}), {"head.weight": "wte.weight"}), ValueError,
     r"^Tied: alias 'head\.weight' names no array of Sequential; name a parameter its children declare \(e\.g\. 'lm_head\.weight'\)$"),
    ("tied-self", lambda: L.Tied(L.Sequential({"wte": L.Embedding(5, 3)}), {"wte.weight": "wte.weight"}), ValueError,
     r"^Tied: 'wte\.weight' is tied to itself$"),
    ("tied-both", lambda: L.Tied(L.Sequential({"a": L.Linear(3), "b": L.Linear(3), "c": L.Linear(3)}), {"a.weight": "b.weight", "b.weight": "c.weight"}), ValueError,
     r"^Tied: 'b\.weight' is both an alias and an original$"),
    ("tied-shapes", lambda: L.Tied(L.Sequential({"wte": L.Embedding(5, 3), "head": L.Linear(4, bias=False)}), {"head.weight": "wte.weight"}).init(KEY, (1, 2)), LayerError,
     r"^Tied: 'head\.weight' and 'wte\.weight' must be arrays of one shape expected \(5, 3\), got \(4, 3\)$"),
    ("tied-untie", lambda: _tied_lm().apply({}, jnp.zeros((1, 2), jnp.int32)), LayerError,
     r"^Tied: params has no entry 'wte\.weight' \(the original of 'head\.weight'\)$"),
    ("model-not-layer", lambda: pl.params.load_state_dict({"w": jnp.zeros(2)}, {"w": np.zeros(2)}, model=3), ValueError,
     r"^load_state_dict: model must be a purelayers Layer, got 3$"),
    ("alias-differs", lambda: pl.params.load_state_dict(_tied_lm().init(KEY, (1, 2)), {"wte.weight": np.zeros((5, 3)), "head.weight": np.ones((5, 3))}, model=_tied_lm()), ValueError,
     r"^load_state_dict: 'head\.weight' is tied to 'wte\.weight' but the checkpoint holds different values under the two names; nothing was loaded$"),
    ("save-aliases-no-model", lambda: pl.params.save(_tmp() / "m.safetensors", {"w": jnp.zeros(2)}, write_aliases=True), ValueError,
     r"^save: write_aliases=True needs model= \(the layer that ties them\)$"),
    ("save-alias-missing", lambda: pl.params.save(_tmp() / "m.safetensors", {"w": jnp.zeros(2)}, model=_tied_lm(), write_aliases=True), ValueError,
     r"^save: 'wte\.weight', the original of 'head\.weight', is not in params$"),
    ("block-norm-layer", lambda: L.TransformerBlock(2, norm=3), ValueError,
     r"^TransformerBlock: norm must be a Layer or one of \('layernorm', 'rmsnorm'\), got 3$"),
    ("block-activation-layer", lambda: L.TransformerBlock(2, activation=3), ValueError,
     r"^TransformerBlock: activation must be a Layer or one of \('gelu', 'gelu_tanh', 'relu', 'swiglu'\), got 3$"),
    ("block-no-heads", lambda: L.TransformerBlock(), ValueError,
     r"^TransformerBlock: give num_heads \(for the default attention\) or attn$"),
    ("block-attn", lambda: L.TransformerBlock(attn="mha"), ValueError,
     r"^TransformerBlock: attn must be a Layer or None, got 'mha'$"),
    ("swiglu-odd", lambda: L.SwiGLU().apply({}, jnp.zeros((2, 3))), LayerError,
     r"^SwiGLU: input last axis expected an even width, got 3$"),
    ("model-child-init-path", lambda: _gpt2().children()["transformer"].children()["h"].layer.init(KEY, ()),
     LayerError, r"^GPT2Block\[ln_1\] LayerNorm: input rank expected at least normalized_ndim=1, got 0"),
    ("repeat-per-block-names", lambda: _repeat_one_block_of_two(), LayerError,
     r"^Repeat: per-block params expected \['0', '1'\], got \['0'\]$"),
    ("lm-mask-shape", lambda: _lm_apply(_gpt2(), np.zeros((2, 3), np.int32), attention_mask=np.ones((2, 4))),
     LayerError, r"^GPT2Model: attention_mask must be \(batch, keys\).*expected \(2, 3\), got \(2, 4\)"),
    ("lm-position-ids-shape", lambda: _lm_apply(_gpt2(), np.zeros((2, 3), np.int32), position_ids=np.zeros((2, 4), np.int32)),
     LayerError, r"GPT2Model: position_ids shape expected \(2, 3\), got \(2, 4\)"),
    ("lm-dropout-needs-key", lambda: _lm_apply(_gpt2(embd_pdrop=0.5), np.zeros((1, 3), np.int32), train=True),
     LayerError, r"dropout"),
    ("lm-config-type", lambda: __import__("purelayers.models", fromlist=["x"]).GPT2LMHeadModel({"n_embd": 8}),
     TypeError, r"^GPT2LMHeadModel: config must be a GPT2Config, got dict$"),
    ("lm-ids-rank", lambda: _lm_apply(_gpt2(), np.zeros((3,), np.int32)), LayerError,
     r"GPT2Model: input_ids must be \(batch, seq\); expected 2, got 1"),
    ("llama-ids-rank", lambda: _lm_apply(_llama(), np.zeros((3,), np.int32)), LayerError,
     r"LlamaModel: input_ids must be \(batch, seq\); expected 2, got 1"),
    ("gpt2-cache-too-long", lambda: _gpt2().init_cache((1, 9)), LayerError,
     r"GPT2Model: init_cache max_len at most n_positions expected 8, got 9"),
    ("config-from-dict-type", lambda: __import__("purelayers.models", fromlist=["x"]).GPT2Config.from_dict([1]),
     TypeError, r"^GPT2Config\.from_dict: expected a dict, got list$"),
    ("config-from-dict-model-type", lambda: __import__("purelayers.models", fromlist=["x"]).GPT2Config.from_dict({"model_type": "bert"}),
     ValueError, r"^GPT2Config\.from_dict: model_type is 'bert', expected 'gpt2'$"),
    ("gpt2-config-int", lambda: _gpt2(n_layer=0), ValueError, r"^GPT2Config: n_layer must be a positive int, got 0$"),
    ("gpt2-config-heads", lambda: _gpt2(n_head=3), ValueError, r"^GPT2Config: n_embd=8 must be divisible by n_head=3$"),
    ("gpt2-config-activation", lambda: _gpt2(activation_function="swish"), ValueError,
     r"^GPT2Config: activation_function must be one of .*got 'swish'$"),
    ("gpt2-config-unsupported", lambda: _gpt2(reorder_and_upcast_attn=True), ValueError,
     r"^GPT2Config: scale_attn_by_inverse_layer_idx and reorder_and_upcast_attn are not supported$"),
    ("llama-config-int", lambda: __import__("purelayers.models", fromlist=["x"]).LlamaConfig(hidden_size=-1), ValueError,
     r"^LlamaConfig: hidden_size must be a positive int, got -1$"),
    ("llama-config-pad", lambda: __import__("purelayers.models", fromlist=["x"]).LlamaConfig(vocab_size=10, pad_token_id=10), ValueError,
     r"^LlamaConfig: pad_token_id must be None or an int in \[-vocab_size, vocab_size\) = \[-10, 10\) \(the embedding's padding row"),
    ("causal-generation-config", lambda: __import__("purelayers.models", fromlist=["x"]).LlamaForCausalLM(
        __import__("purelayers.models", fromlist=["x"]).LlamaConfig(), generation_config=[2]), ValueError,
     r"^LlamaForCausalLM: generation_config must be a dict \(a generation_config\.json's contents\), got list$"),
    ("llama-config-act", lambda: __import__("purelayers.models", fromlist=["x"]).LlamaConfig(hidden_act="gelu"), ValueError,
     r"^LlamaConfig: hidden_act must be 'silu', got 'gelu'$"),
    ("llama-config-kv", lambda: __import__("purelayers.models", fromlist=["x"]).LlamaConfig(num_key_value_heads=5), ValueError,
     r"^LlamaConfig: num_key_value_heads=5 must divide num_attention_heads=32$"),
    ("llama-config-width", lambda: __import__("purelayers.models", fromlist=["x"]).LlamaConfig(hidden_size=100), ValueError,
     r"^LlamaConfig: hidden_size=100 must be divisible by num_attention_heads=32 when head_dim is not given$"),
    ("llama-config-rope", lambda: __import__("purelayers.models", fromlist=["x"]).LlamaConfig(rope_parameters={"rope_type": "longrope", "factor": 4.0}), ValueError,
     r"^LlamaConfig: rope_type must be 'default', 'linear', 'dynamic', 'llama3' or 'yarn', got 'longrope'$"),
    ("mistral-attention-bias", lambda: __import__("purelayers.models", fromlist=["x"]).MistralConfig(attention_bias=True), ValueError,
     r"^MistralConfig: attention_bias is not a setting of transformers' MistralConfig \(the model is built without it\), got True$"),
    ("qwen2-sliding", lambda: __import__("purelayers.models", fromlist=["x"]).Qwen2Config(use_sliding_window=True, sliding_window=0), ValueError,
     r"^Qwen2Config: sliding_window must be a positive int with use_sliding_window=True, got 0$"),
    ("qwen3-layer-types-count", lambda: __import__("purelayers.models", fromlist=["x"]).Qwen3Config(num_hidden_layers=2, layer_types=["full_attention"]), ValueError,
     r"^Qwen3Config: layer_types must list num_hidden_layers=2 entries, got 1$"),
    ("qwen3-layer-type", lambda: __import__("purelayers.models", fromlist=["x"]).Qwen3Config(num_hidden_layers=1, layer_types=["chunked_attention"]), ValueError,
     r"^Qwen3Config: layer_types\[0\] must be 'full_attention' or 'sliding_attention', got 'chunked_attention'$"),
    ("gemma2-activation", lambda: __import__("purelayers.models", fromlist=["x"]).Gemma2Config(hidden_activation="relu"), ValueError,
     r"^Gemma2Config: hidden_activation must be one of \['gelu', 'gelu_pytorch_tanh', 'silu'\], got 'relu'$"),
    ("gemma2-bidirectional", lambda: __import__("purelayers.models", fromlist=["x"]).Gemma2Config(use_bidirectional_attention=True), ValueError,
     r"^Gemma2Config: use_bidirectional_attention=True is not supported$"),
    ("gemma2-window", lambda: __import__("purelayers.models", fromlist=["x"]).Gemma2Config(sliding_window=None), ValueError,
     r"^Gemma2Config: sliding_window must be a positive int for sliding_attention layers, got None$"),
    ("gemma2-softcap", lambda: __import__("purelayers.models", fromlist=["x"]).Gemma2Config(final_logit_softcapping=0.0), ValueError,
     r"^Gemma2Config: final_logit_softcapping must be None or > 0, got 0\.0$"),
    ("gemma3-rope-keys", lambda: __import__("purelayers.models", fromlist=["x"]).Gemma3TextConfig(rope_parameters={"rope_type": "default"}), ValueError,
     r"^Gemma3TextConfig: rope_parameters must be keyed by layer type \('full_attention', 'sliding_attention'\), got keys \['rope_type'\]$"),
    ("gemma3-rope-type", lambda: __import__("purelayers.models", fromlist=["x"]).Gemma3TextConfig(rope_parameters={"full_attention": {"rope_type": "longrope", "factor": 2.0}}), ValueError,
     r"^Gemma3TextConfig: rope_parameters\['full_attention'\]: rope_type must be 'default', 'linear', 'dynamic', 'llama3' or 'yarn', got 'longrope'$"),
    ("lm-logits-to-keep", lambda: jax.eval_shape(
        lambda p: _gpt2().apply(p, np.zeros((1, 3), np.int32), logits_to_keep=-1),
        pl.params.abstract(_gpt2(), (1, 1))), ValueError,
     r"^GPT2LMHeadModel: logits_to_keep must be an integer >= 0, got -1$"),
    ("generate-ids-rank", lambda: _generate(ids=np.zeros(3, np.int32)), ValueError,
     r"^generate: input_ids must be \(batch, prompt\), got shape \(3,\)$"),
    ("generate-not-causal", lambda: __import__("purelayers.models", fromlist=["x"]).generate(
        L.Linear(2), {}, np.zeros((1, 3), np.int32), max_new_tokens=2), ValueError,
     r"^generate: model must be a causal LM \(GPT-2, Llama, Mistral, Qwen2: a model with init_cache\), got Linear$"),
    ("generate-ids-range", lambda: _generate(ids=np.array([[1, 11, 2]])), ValueError,
     r"^generate: input_ids must be token ids in \[0, vocab_size=11\), got 11 \(padding positions too"),
    ("generate-max-new-tokens", lambda: _generate(max_new_tokens=0), ValueError,
     r"^generate: max_new_tokens must be a positive int, got 0$"),
    ("generate-needs-key", lambda: _generate(do_sample=True), ValueError,
     r"^generate: do_sample=True needs key= \(a jax\.random key\)$"),
    ("generate-temperature", lambda: _generate(temperature=0.0, **_SAMPLE), ValueError,
     r"^generate: temperature must be > 0, got 0\.0$"),
    ("generate-temperature-type", lambda: _generate(temperature="hot", **_SAMPLE), ValueError,
     r"^generate: temperature must be a number > 0, got 'hot'$"),
    ("generate-top-k", lambda: _generate(top_k=-1, **_SAMPLE), ValueError, r"^generate: top_k must be an int >= 0 \(0: off\) or None, got -1$"),
    ("generate-top-p", lambda: _generate(top_p=1.5, **_SAMPLE), ValueError, r"^generate: top_p must be in \(0, 1\], got 1\.5$"),
    ("generate-unsupported-option", lambda: _generate(num_beams=4, forced_decoder_ids=[]), ValueError,
     r"^generate: options not supported: forced_decoder_ids, num_beams \(generate decodes"),
    ("generate-features-mask", lambda: _whisper_generate(attention_mask=np.ones((1, 4)), max_new_tokens=1),
     ValueError, r"^generate: WhisperForConditionalGeneration takes no attention_mask$"),
    ("generate-mask-shape", lambda: _generate(attention_mask=np.ones((1, 4))), ValueError,
     r"^generate: attention_mask must be shaped like input_ids \(1, 3\), got \(1, 4\)$"),
    ("from-pretrained-no-config", lambda: _from_pretrained(_folder()), FileNotFoundError,
     r"^from_pretrained: .* has no config\.json$"),
    ("from-pretrained-bad-json", lambda: _from_pretrained(_folder(text="{")), ValueError,
     r"^from_pretrained: .*config\.json is not valid JSON"),
    ("from-pretrained-not-object", lambda: _from_pretrained(_folder(text="[1]")), ValueError,
     r"^from_pretrained: .*config\.json must hold a JSON object$"),
    ("from-pretrained-model-type", lambda: _from_pretrained(_folder({"model_type": "mamba"})), ValueError,
     r"^from_pretrained: .*config\.json has model_type 'mamba'; supported: gpt2, llama, mistral, qwen2, bert, vit(, \w+)*$"),
    ("from-pretrained-revision-of-folder", lambda: _from_pretrained(_folder(), revision="v1"), ValueError,
     r"^from_pretrained: revision='v1' is for a Hub id, and .* is a local folder$"),
    ("from-pretrained-not-an-id", lambda: _from_pretrained(_tmp() / "no" / "such"), FileNotFoundError,
     r"^from_pretrained: '.*' is neither a folder nor a Hub id \('org/name'\)$"),
    ("from-pretrained-id-not-cached", lambda: _from_hub_offline("tiny-org/absent"), FileNotFoundError,
     r"^from_pretrained: 'tiny-org/absent' is not a folder and was not found in the local cache \(HF_HUB_OFFLINE is set\): "),
    ("from-pretrained-config-value", lambda: _from_pretrained(_folder({**_GPT2_JSON, "n_head": 3})), ValueError,
     r"^from_pretrained: .*config\.json: GPT2Config: "),
    ("from-pretrained-config-missing", lambda: _from_pretrained(_folder({**_LLAMA_JSON, "rope_scaling": {"rope_type": "linear"}})), ValueError,
     r"^from_pretrained: .*config\.json: missing 'factor'$"),
    ("from-pretrained-generation-json", lambda: _from_pretrained(_generation_folder("{")), ValueError,
     r"^from_pretrained: .*generation_config\.json is not valid JSON"),
    ("from-pretrained-generation-object", lambda: _from_pretrained(_generation_folder("[1]")), ValueError,
     r"^from_pretrained: .*generation_config\.json must hold a JSON object$"),
    ("from-pretrained-no-weights", lambda: _from_pretrained(_folder(_GPT2_JSON)), CheckpointError,
     r"the folder holds no single checkpoint"),
    ("from-pretrained-misfit", lambda: _from_pretrained(_folder(_GPT2_JSON, weights={"wte": {"weight": np.zeros((11, 4), np.float32)}})),
     CheckpointError, r"does not fit the GPT2LMHeadModel its config\.json describes: .*missing keys"),
    ("generate-right-padded", lambda: _generate(attention_mask=np.array([[1, 1, 0]])), ValueError,
     r"^generate: attention_mask has a 0 after a 1 in row 0 \(a right-padded prompt.*pad prompts on the left"),
    ("save-pretrained-wrapped", lambda: _save_pretrained(__import__("purelayers.lora", fromlist=["x"]).wrap(_gpt2(), ["c_attn"])), ValueError,
     r"^save_pretrained: model is LoRA-wrapped; .*lora\.merge\(lmodel, params\).*lora\.save_adapter"),
    ("save-pretrained-no-tokenizer", lambda: _save_pretrained(_gpt2(), tokenizer_from=_tmp()), ValueError,
     r"^save_pretrained: tokenizer_from=.* holds none of the tokenizer files tokenizer\.json, "),
    ("causal-lm-loss-shape", lambda: _sft().causal_lm_loss(jnp.zeros((1, 3, 5)), jnp.zeros((1, 4), int)), ValueError,
     r"^causal_lm_loss: labels must be shaped like logits without the vocab axis, expected \(1, 3\), got \(1, 4\)$"),
    ("sft-max-length", lambda: _sft_batch([("a", "b")], max_length=0), ValueError,
     r"^sft_batch: max_length must be a positive int, got 0$"),
    ("sft-choice", lambda: _sft_batch([("a", "b")], padding_side="middle"), ValueError,
     r"^sft_batch: padding_side must be one of \('right', 'left'\), got 'middle'$"),
    ("sft-empty", lambda: _sft_batch([]), ValueError, r"^sft_batch: examples is empty$"),
    ("sft-missing-field", lambda: _sft_batch([("a", "b"), {"prompt": "a"}]), ValueError,
     r"^sft_batch: example 1 has no 'response' \(keys: \['prompt'\]\)$"),
    ("sft-not-a-pair", lambda: _sft_batch(["ab"]), ValueError,
     r"^sft_batch: example 0 must be a \(prompt, response\) pair or a dict with 'prompt' and 'response', got str$"),
    ("sft-not-text", lambda: _sft_batch([("a", 3)]), ValueError,
     r"^sft_batch: example 0's response must be a string, got int$"),
    ("sft-no-pad", lambda: _sft_batch([("a", "b")], tokenizer=_ToyTokenizer(eos=None)), ValueError,
     r"^sft_batch: the tokenizer has neither a pad_token_id nor an eos_token_id; pass pad_token_id=$"),
    ("sft-too-long", lambda: _sft_batch([("a", "b"), ("a", "b" * 20)], max_length=25), ValueError,
     r"^sft_batch: example 1 is 40 tokens, more than max_length=25 \(prompt 'a'\); raise max_length or pass truncation='right'$"),
    ("sft-prompt-fills", lambda: _sft_batch([("a" * 30, "b")], max_length=20, truncation="right"), ValueError,
     r"^sft_batch: example 0's prompt fills max_length=20 tokens, leaving no response token to train on"),
    ("sft-template-not-prefix", lambda: _sft_batch([("a", "b")], tokenizer=_ToyTokenizer(odd=True)), ValueError,
     r"^encode_chat: the chat template's rendering of the prompt \(add_generation_prompt=True\) is not a prefix"),
]
# fmt: on
CATALOG += registry.ERRORS  # each registry case's own entries (``Case.errors``)


# -- the check ---------------------------------------------------------------------------

_OBSERVED: dict[str, tuple[str, int]] = {}


def _origin(exc: BaseException) -> tuple[str, int] | None:
    """(file relative to the package, line) of the library line that raised ``exc``."""
    found = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        path = pathlib.Path(frame.f_code.co_filename).resolve()
        if PKG in path.parents and frame.f_code.co_name not in HELPERS:
            found = (path.relative_to(PKG).as_posix(), line)
    return found


def _trigger(entry) -> tuple[str, int] | None:
    _, fn, exc_type, pattern = entry
    # Unfiltered tracebacks: JAX then adds no note to the message, and every frame stays.
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", "off")
    try:
        with pytest.raises(exc_type, match=pattern) as info:
            fn()
    finally:
        jax.config.update("jax_traceback_filtering", before)
    return _origin(info.value)


@pytest.mark.parametrize("entry", CATALOG, ids=[e[0] for e in CATALOG])
def test_error(entry, request):
    if entry[0].startswith("torch-parity"):
        request.getfixturevalue("torch")  # skipped, or failing in CI, without torch
    _OBSERVED[entry[0]] = _trigger(entry)


def test_catalog_ids_unique():
    ids = [e[0] for e in CATALOG]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def _sites(path: pathlib.Path) -> dict[int, str]:
    """Raise sites of one file: ``{line: enclosing function}``."""
    tree = ast.parse(path.read_text())
    out: dict[int, str] = {}

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{scope}.{child.name}" if scope else child.name
            if not scope and inner in HELPERS:  # a helper's own raises: at its calls
                continue
            if (isinstance(child, ast.Raise) and child.exc is not None) or (
                isinstance(child, ast.Call)
                and getattr(child.func, "id", getattr(child.func, "attr", None)) in HELPERS
            ):
                out[child.lineno] = scope
            visit(child, inner)

    visit(tree, "")
    return out


def all_sites() -> dict[str, dict[int, str]]:
    return {
        p.relative_to(PKG).as_posix(): _sites(p)
        for p in sorted(PKG.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def test_every_raise_site_is_in_the_catalog(torch):
    # the torch fixture: the parity checks' raise sites are reached only with torch
    for entry in CATALOG:
        if entry[0] not in _OBSERVED:
            _OBSERVED[entry[0]] = _trigger(entry)
    reached = set(_OBSERVED.values())
    problems = []
    for file, sites in all_sites().items():
        if file in TESTED_ELSEWHERE:
            want = TESTED_ELSEWHERE[file][0]
            if len(sites) != want:
                problems.append(
                    f"{file}: {len(sites)} raise sites, TESTED_ELSEWHERE says {want}: test the "
                    f"new ones in {TESTED_ELSEWHERE[file][1]} and update the count"
                )
            continue
        for line, func in sorted(sites.items()):
            if (file, line) not in reached and func not in UNREACHABLE:
                problems.append(f"{file}:{line} (in {func or 'module'}) is reached by no entry")
    raising = {func for sites in all_sites().values() for func in sites.values()}
    stale = [k for k in UNREACHABLE if k not in raising]
    problems += [f"UNREACHABLE lists {k}, which raises nothing" for k in stale]
    assert not problems, "\n".join(problems)

"""pl.params.label / mask / matches: optimizer labels and masks by checkpoint name."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import purelayers as pl
from purelayers import _patterns
from purelayers import layers as L

RULES = {"*.bias": "no_decay", "*.ln?.*": "no_decay", "norm.*": "no_decay", "*": "decay"}
BLOCK = ("ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.out.weight")
BLOCK += ("attn.out.bias", "ln2.weight", "ln2.bias", "fc.weight", "fc.bias", "proj.weight")
BLOCK += ("proj.bias",)


@pytest.fixture
def optax():
    return pytest.importorskip("optax")


@functools.cache
def gpt():
    """Embedding, 2 Repeat'ed (Stacked) transformer blocks, final norm, head."""
    return L.Sequential(
        {
            "embed": L.Embedding(11, 4),
            "blocks": L.Repeat(L.TransformerBlock(2), 2),
            "norm": L.LayerNorm(),
            "head": L.Linear(11),
        }
    )


IDS = jnp.arange(6, dtype=jnp.int32).reshape(2, 3)


@functools.cache
def init():
    """The params (immutable arrays, so one tree serves every test)."""
    return gpt().init(jax.random.key(0), IDS)


def loss(params, ids):
    return jnp.mean(jnp.square(gpt().apply(params, ids)))


def test_label_gives_each_name_its_first_matching_rule():
    params = init()
    labels = pl.params.label(params, RULES)
    assert jax.tree.structure(labels) == jax.tree.structure(params)
    assert isinstance(labels["blocks"], pl.params.Stacked) and labels["blocks"].n == 2
    assert pl.params.flatten(labels) == {
        "embed.weight": "decay",
        **{
            f"blocks.{i}.{name}": "decay" if name.endswith("weight") else "no_decay"
            for i in range(2)
            for name in BLOCK
        },
        "blocks.0.ln1.weight": "no_decay",
        "blocks.0.ln2.weight": "no_decay",
        "blocks.1.ln1.weight": "no_decay",
        "blocks.1.ln2.weight": "no_decay",
        "norm.weight": "no_decay",
        "norm.bias": "no_decay",
        "head.weight": "decay",
        "head.bias": "no_decay",
    }
    # the params' own (torch) order, not the key-sorted order JAX rebuilds dicts in
    assert list(pl.params.flatten(labels)) == list(pl.params.flatten(params))
    assert list(pl.params.flatten(labels))[:3] == [
        "embed.weight",
        *(f"blocks.0.{n}" for n in BLOCK[:2]),
    ]


def test_label_first_match_wins_and_pairs_equal_a_dict():
    params = init()
    flat = pl.params.flatten(
        pl.params.label(params, {"head.bias": "a", "*.bias": "b", "head.*": "c", "*": "d"})
    )
    assert (flat["head.bias"], flat["head.weight"], flat["norm.bias"], flat["embed.weight"]) == (
        "a",
        "c",
        "b",
        "d",
    )
    swapped = pl.params.flatten(pl.params.label(params, {"*": "d", "head.bias": "a"}))
    assert set(swapped.values()) == {"d"}  # "*" first shadows every later rule
    pairs = [("re:blocks\\.\\d+\\.attn\\..*", 1), ("*", 0)]  # any hashable leaf labels
    assert pl.params.label(params, pairs) == pl.params.label(params, dict(pairs))
    assert set(pl.params.flatten(pl.params.label(params, pairs)).values()) == {0, 1}


def test_label_and_mask_on_jitted_abstract_and_none_trees():
    params = init()
    labels = pl.params.label(params, RULES)
    sorted_params = jax.jit(lambda p: p)(params)  # dicts come back key-sorted
    assert pl.params.label(sorted_params, RULES) == labels
    abstract = pl.params.abstract(gpt(), jax.ShapeDtypeStruct(IDS.shape, IDS.dtype))
    assert pl.params.label(abstract, RULES) == labels
    assert pl.params.mask(abstract, "blocks.*") == pl.params.mask(params, "blocks.*")
    # None is an empty subtree to JAX: it stays None and has no name
    tree = {"fc": {"weight": jnp.ones((2, 3)), "bias": None}, "extra": [None, jnp.ones(2)]}
    assert pl.params.label(tree, {"*.weight": "w", "*": "other"}) == {
        "fc": {"weight": "w", "bias": None},
        "extra": [None, "other"],
    }
    assert pl.params.mask(tree, "extra.*") == {
        "fc": {"weight": False, "bias": None},
        "extra": [None, True],
    }


def test_matches_is_the_shared_matcher():
    assert pl.params.matches is _patterns.matches
    assert pl.params.matches("*.bias", "blocks.3.fc.bias")
    assert not pl.params.matches("*.bias", "bias")
    assert pl.params.matches("re:blocks\\.[0-5]\\..*", "blocks.4.attn.weight")
    assert not pl.params.matches("re:blocks\\.[0-5]", "blocks.4.attn.weight")  # full match


def test_multi_transform_decays_exactly_the_decay_leaves(optax):
    params = init()
    labels = pl.params.label(params, RULES)
    decay, no_decay = optax.adamw(1e-2, weight_decay=0.1), optax.adam(1e-2)
    tx = optax.multi_transform({"decay": decay, "no_decay": no_decay}, labels)
    state = tx.init(params)
    leaves, label_leaves = jax.tree.leaves(params), jax.tree.leaves(labels)
    subsets = {
        "decay": [i for i, lab in enumerate(label_leaves) if lab == "decay"],
        "no_decay": [i for i, lab in enumerate(label_leaves) if lab == "no_decay"],
    }
    assert len(subsets["decay"]) == 6 and len(subsets["no_decay"]) == 11
    opts = {"decay": decay, "no_decay": no_decay}
    by_hand = {}  # each group's leaves, stepped by its own optimizer alone
    for group, idx in subsets.items():
        sub = [leaves[i] for i in idx]
        by_hand[group] = (sub, opts[group].init(sub))
    grad = jax.jit(jax.grad(loss))
    for step in range(2):
        grads = grad(params, IDS + step)
        updates, state = jax.jit(tx.update)(grads, state, params)
        params = optax.apply_updates(params, updates)
        grad_leaves = jax.tree.leaves(grads)
        for group, idx in subsets.items():
            sub, sub_state = by_hand[group]
            sub_updates, sub_state = jax.jit(opts[group].update)(
                [grad_leaves[i] for i in idx], sub_state, sub
            )
            by_hand[group] = (optax.apply_updates(sub, sub_updates), sub_state)
    leaves = jax.tree.leaves(params)
    for group, idx in subsets.items():
        for i, expected in zip(idx, by_hand[group][0], strict=True):
            np.testing.assert_allclose(leaves[i], expected, rtol=1e-6, atol=1e-7)


def _train(optax, tx, steps=3):
    params = init()
    state = tx.init(params)

    @jax.jit
    def step(params, state, ids):
        grads = jax.grad(loss)(params, ids)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    start = params
    for i in range(steps):
        params, state = step(params, state, IDS + i)
    return start, params


def _frozen_stay_and_others_move(start, end, frozen):
    before, after, bits = (pl.params.flatten(t) for t in (start, end, frozen))
    assert any(bits.values()) and not all(bits.values())
    for name, is_frozen in bits.items():
        if is_frozen:
            np.testing.assert_array_equal(after[name], before[name], err_msg=name)
        else:
            assert not np.array_equal(after[name], before[name]), name


def test_frozen_by_label_stay_bit_identical(optax):
    params = init()
    # a Repeat's blocks are frozen as their stacked arrays
    labels = pl.params.label(params, {"embed.*": "frozen", "blocks.*": "frozen", "*": "train"})
    tx = optax.multi_transform({"train": optax.adam(1e-2), "frozen": optax.set_to_zero()}, labels)
    start, end = _train(optax, tx)
    frozen = jax.tree.map(lambda lab: lab == "frozen", labels)
    _frozen_stay_and_others_move(start, end, frozen)


def test_frozen_by_mask_stay_bit_identical(optax):
    params = init()
    frozen = pl.params.mask(params, "embed.*", "re:blocks\\.\\d+\\.(ln1|attn)\\..*")
    tx = optax.chain(optax.masked(optax.set_to_zero(), frozen), optax.adam(1e-2))
    start, end = _train(optax, tx)
    _frozen_stay_and_others_move(start, end, frozen)


def test_label_and_mask_as_functions_optax_calls_under_jit(optax):
    params = init()
    tx = optax.multi_transform(
        {"decay": optax.adamw(1e-2, weight_decay=0.1), "no_decay": optax.adam(1e-2)},
        lambda tree: pl.params.label(tree, RULES),
    )
    by_tree = optax.multi_transform(
        {"decay": optax.adamw(1e-2, weight_decay=0.1), "no_decay": optax.adam(1e-2)},
        pl.params.label(params, RULES),
    )
    grads = jax.tree.map(jnp.ones_like, params)
    got = jax.jit(lambda g, p: tx.update(g, tx.init(p), p)[0])(grads, params)
    want = jax.jit(lambda g, p: by_tree.update(g, by_tree.init(p), p)[0])(grads, params)
    pl.testing.assert_tree_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_nested_stacks_name_every_block():
    tree = {"a": pl.params.Stacked({"b": pl.params.Stacked({"w": jnp.zeros((2, 3, 4))}, 3)}, 2)}
    labels = pl.params.label(tree, {"re:a\\.\\d\\.b\\.\\d\\.w": "x"})
    assert pl.params.flatten(labels) == {f"a.{i}.b.{j}.w": "x" for i in range(2) for j in range(3)}
    with pytest.raises(ValueError, match=r"'a\.\{0\.\.1\}\.b\.\{0\.\.2\}\.w' get different mask"):
        pl.params.mask(tree, "a.*.2.w")


SMALL = jax.eval_shape(
    lambda k: L.Sequential(L.Linear(3), L.LayerNorm(), L.Sequential(L.Linear(2))).init(k, (1, 2)),
    jax.random.key(0),
)
NAMES = list(pl.params.flatten(SMALL))


@st.composite
def glob_from_a_name(draw):
    """A glob that matches some name: one name's parts, a few replaced by ``*`` or ``?``."""
    parts = draw(st.sampled_from(NAMES)).split(".")
    out = []
    for part in parts:
        kind = draw(st.sampled_from(["keep", "star", "qmark", "prefix"]))
        if kind == "star":
            out.append("*")
        elif kind == "qmark":
            out.append("?" * len(part))
        elif kind == "prefix":
            out.append(part[: draw(st.integers(0, len(part)))] + "*")
        else:
            out.append(part)
    return ".".join(out)


@given(glob_from_a_name())
def test_mask_is_matches_per_name(pattern):
    assert pl.params.flatten(pl.params.mask(SMALL, pattern)) == {
        name: pl.params.matches(pattern, name) for name in NAMES
    }


# -- errors ---------------------------------------------------------------------------


def test_unmatched_names_raise_naming_all_of_them():
    params = init()
    with pytest.raises(ValueError, match=r"label: no rule matches 9 name\(s\) of params:") as info:
        pl.params.label(params, {"*.bias": "no_decay"})
    message = str(info.value)
    for name in ("embed.weight", "blocks.{0..1}.fc.weight", "norm.weight", "head.weight"):
        assert f"\n  {name}\n" in message
    assert "bias" not in message.split("patterns tried")[0]
    assert '"*": "decay"' in message  # the hint: a catch-all rule
    with pytest.raises(ValueError, match=r"no rule matches 1 name\(s\) of params:\n  head\.bias"):
        pl.params.label(params, {"*.weight": "w", "re:(?!head).*": "b"})


@pytest.mark.parametrize(
    "rules, match",
    [
        ("*", r"label: rules must be a dict \{pattern: label\} or a list of \(pattern, label\)"),
        (3, r"label: rules must be a dict .* got 3"),
        ([("*", "a", "b")], r"label: rules\[0\] must be a \(pattern, label\) pair, got \('\*'"),
        (["*"], r"label: rules\[0\] must be a \(pattern, label\) pair, got '\*'"),
        ({"re:(": "a"}, r"label: rules pattern 're:\(' is not a valid regular expression"),
        ([("*", "a"), ("re:[", "b")], r"label: rules\[1\] pattern 're:\[' is not a valid"),
        ({3: "a"}, r"label: rules pattern must be a string, got 3"),
        ({"*": ["a"]}, r"label: rules\['\*'\] label \['a'\] is not hashable; optax"),
        ([("*", {"a": 1})], r"label: rules\[0\] label \{'a': 1\} is not hashable"),
        ({"*": None}, r"label: rules\['\*'\] label None is not a single pytree leaf"),
        ([("*", ("a", 1))], r"label: rules\[0\] label \('a', 1\) is not a single pytree leaf"),
    ],
)
def test_bad_rules_raise_naming_the_argument(rules, match):
    with pytest.raises(ValueError, match=match):
        pl.params.label(init(), rules)


def test_rules_that_tell_stacked_blocks_apart_raise():
    params = init()
    with pytest.raises(
        ValueError,
        match=r"label: the blocks of the stacked array 'blocks\.\{0\.\.1\}\.attn\.out\.bias' get "
        r"different labels:\n  'a': blocks\.0\.attn\.out\.bias\n  'b': blocks\.1\.attn\.out\.bias"
        r"\n  a Repeat stores .* \(blocks\.\* rather than blocks\.0\)",
    ):
        pl.params.label(params, {"blocks.0.*": "a", "*": "b"})
    with pytest.raises(ValueError, match=r"different labels:\n  'a': .*\n  no rule: blocks\.1\."):
        pl.params.label(params, {"blocks.0.*": "a"})
    with pytest.raises(ValueError, match=r"mask: the blocks .* get different mask bits:\n  False"):
        pl.params.mask(params, "blocks.1.*")


def test_bad_mask_patterns_raise_naming_them():
    params = init()
    with pytest.raises(ValueError, match=r"mask: no patterns given; pass at least one"):
        pl.params.mask(params)
    with pytest.raises(
        ValueError, match=r"mask: patterns are separate arguments, got one list \['\*\.bias'\]"
    ):
        pl.params.mask(params, ["*.bias"])
    with pytest.raises(ValueError, match=r"mask: patterns\[1\] pattern 're:\[' is not a valid"):
        pl.params.mask(params, "*.bias", "re:[")
    with pytest.raises(ValueError, match=r"mask: patterns\[0\] pattern must be a string, got 3"):
        pl.params.mask(params, 3)
    with pytest.raises(
        ValueError,
        match=r"mask: no pattern matches a name of params: \['\*\.bais', 'bias'\]\n"
        r"  names look like blocks\.0\.attn\.out\.bias, ",
    ):
        pl.params.mask(params, "*.bais", "bias")  # a root "bias" is not "x.bias"
    with pytest.raises(
        ValueError, match=r"no pattern matches a name of params: \['\*'\]\n  params has no"
    ):
        pl.params.mask({}, "*")
    # beside a pattern that matches, one that matches nothing is fine, as in ``label``
    both = pl.params.mask(params, "*.bais", "*.bias")
    assert both == pl.params.mask(params, "*.bias")
    assert any(jax.tree.leaves(both)) and not all(jax.tree.leaves(both))

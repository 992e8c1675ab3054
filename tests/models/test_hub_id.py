"""``from_pretrained`` by Hugging Face Hub id, offline, against a cache folder laid out
as ``huggingface_hub`` lays it out (``models--org--name/snapshots/<commit>/...`` and
``refs/<branch>``), which the test fills."""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

from purelayers import lora
from purelayers import models as M


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A tmp ``HF_HUB_CACHE`` holding ``tiny-org/tiny-llama`` at two commits (``main``
    and the tag ``v1``), with ``HF_HUB_OFFLINE=1``; returns the cache and the models."""
    cache = tmp_path / "hub"
    repo = cache / "models--tiny-org--tiny-llama"
    config = M.LlamaConfig(
        vocab_size=19, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    made = {}
    for ref, commit, seed in (("main", "a" * 40, 0), ("v1", "b" * 40, 1)):
        model = M.LlamaForCausalLM(config)
        params = model.init(jax.random.key(seed), (1, 2))
        M.save_pretrained(repo / "snapshots" / commit, model, params)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
        made[ref] = model, params
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache, made


def test_a_hub_id_loads_from_the_cache_offline_at_a_revision(hub_cache):
    _, made = hub_cache
    ids = np.array([[3, 4, 5]])
    for revision, ref in ((None, "main"), ("v1", "v1"), ("b" * 40, "v1")):
        model, params = M.from_pretrained("tiny-org/tiny-llama", revision=revision)
        want_model, want = made[ref]
        assert model == want_model
        assert M.name_or_path(model) == "tiny-org/tiny-llama"
        wrapped = lora.wrap(model, ["q_proj"], r=2)  # kept by a LoRA-wrapped copy
        assert M.name_or_path(wrapped) == M.name_or_path(wrapped.model) == "tiny-org/tiny-llama"
        np.testing.assert_array_equal(
            np.asarray(model.apply(params, ids)), np.asarray(want_model.apply(want, ids))
        )


def test_a_missing_id_or_folder_is_named(hub_cache, tmp_path):
    cache, _ = hub_cache
    with pytest.raises(FileNotFoundError, match=r"'tiny-org/absent' is not a folder and was not"):
        M.from_pretrained("tiny-org/absent")
    with pytest.raises(FileNotFoundError, match=r"is neither a folder nor a Hub id"):
        M.from_pretrained(tmp_path / "no" / "such" / "folder")
    folder = cache / "models--tiny-org--tiny-llama" / "snapshots" / ("a" * 40)
    with pytest.raises(ValueError, match=r"revision='v1' is for a Hub id"):
        M.from_pretrained(folder, revision="v1")
    model, _ = M.from_pretrained(folder)
    assert M.name_or_path(model) == str(folder)
    shutil.rmtree(cache)
    with pytest.raises(FileNotFoundError, match=r"in the local cache \(HF_HUB_OFFLINE is set\)"):
        M.from_pretrained("tiny-org/tiny-llama")


def test_a_folder_loads_without_importing_huggingface_hub(hub_cache):
    import os
    import subprocess
    import sys

    cache, _ = hub_cache
    folder = cache / "models--tiny-org--tiny-llama" / "snapshots" / ("a" * 40)
    code = (
        "import sys; from purelayers import models as M; M.from_pretrained(sys.argv[1]); "
        "assert 'huggingface_hub' not in sys.modules, 'imported'"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code, str(folder)], check=True, env=env)

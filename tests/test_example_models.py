"""The pretrained-model examples and the generate benchmark run end to end, offline,
in a short smoke mode (a random GPT-2 that transformers builds and saves)."""

import importlib.util
import json
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str):
    sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


SMALL = ["--width", "32", "--depth", "2", "--heads", "2"]


def test_generate_example_streams_tokens_and_reports_speed(transformers, tmp_path):
    example = load_example("generate")
    metrics = example.main([*SMALL, "--max-new-tokens", "6", "--out", str(tmp_path)])
    assert metrics["new_tokens"] == 6 and metrics["tokens_per_second"] > 0
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics


def test_finetune_example_learns_and_transformers_loads_the_result(transformers, tmp_path):
    example = load_example("finetune_gpt2")
    args = [*SMALL, "--steps", "25", "--batch-size", "8", "--seq-len", "32", "--chars", "20000"]
    metrics = example.main([*args, "--lr", "1e-2", "--out", str(tmp_path)])
    assert metrics["valid_loss"] < metrics["initial_valid_loss"]
    assert metrics["transformers_max_logit_diff"] < 1e-4
    assert (tmp_path / "model" / "config.json").is_file()


def test_generate_benchmark_smoke(transformers, tmp_path):
    from benchmarks import generate

    out = generate.main(["--smoke", "--json", str(tmp_path / "g.json")])
    (row,) = out["rows"]
    assert row["same_tokens"]
    for impl in ("purelayers", "transformers"):
        assert row[impl]["tokens_per_s"] > 0 and row[impl]["ttft_s"] > 0
    assert json.loads((tmp_path / "g.json").read_text())["rows"][0]["batch"] == 1


def _tiny_chat_folder(transformers, torch, folder: Path) -> Path:
    """A random Phi-3 saved by transformers, with a BPE tokenizer trained here on the
    docstrings of a standard-library module and a chat template."""
    import inspect
    import textwrap

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    text = [inspect.getdoc(v) or "" for v in vars(textwrap).values()] + [textwrap.__doc__ or ""]
    specials = ["<unk>", "<s>", "</s>", "<|user|>", "<|end|>", "<|assistant|>"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator(text, trainers.BpeTrainer(vocab_size=120, special_tokens=specials))
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    tok.save_pretrained(folder)
    config = transformers.Phi3Config(
        vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        original_max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Phi3ForCausalLM(config).save_pretrained(folder)
    return folder


def test_generate_example_runs_a_folder_with_its_tokenizer_and_chat_template(
    torch, transformers, tmp_path
):
    """``--model`` a Phi-3 folder with a trained tokenizer and a chat template: the
    prompt goes through the template (automatically; ``--no-chat`` sends plain text),
    and the new tokens are transformers' greedy ones."""
    folder = _tiny_chat_folder(transformers, torch, tmp_path / "phi")
    example = load_example("generate")
    prompt = "Wrap the text"
    args = ["--model", str(folder), "--prompt", prompt, "--max-new-tokens", "5"]
    metrics = example.main([*args, "--out", str(tmp_path / "run")])
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    chat = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    assert chat.startswith("<|user|>") and chat.endswith("<|assistant|>")
    want_prompt = tok(chat, add_special_tokens=False)["input_ids"]
    assert metrics["chat"] is True and metrics["model_type"] == "phi3"
    assert metrics["prompt_ids"] == want_prompt
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    want = hf.generate(torch.tensor([want_prompt]), max_new_tokens=5, do_sample=False)
    assert metrics["new_ids"] == want[0, len(want_prompt) :].tolist()
    plain = example.main([*args, "--no-chat", "--out", str(tmp_path / "plain")])
    assert plain["chat"] is False and plain["prompt_ids"] == tok.encode(prompt)

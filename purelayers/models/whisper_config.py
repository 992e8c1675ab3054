"""``WhisperConfig``: ``transformers.WhisperConfig``'s fields and defaults."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from purelayers.layers._checks import check_choice, check_float, check_int
from purelayers.models.bert import _ACTIVATIONS
from purelayers.models.config import Config

__all__ = ["WhisperConfig"]


@dataclasses.dataclass(frozen=True)
class WhisperConfig(Config):
    """``transformers.WhisperConfig``'s fields and defaults (whisper-tiny's sizes are
    ``d_model=384``, 4 + 4 layers of 6 heads, 80 mel bins, 1500 encoder positions).

    The model reads the sizes, ``activation_function`` (the feed-forward's; the
    convolutional front end always uses the exact GELU, as transformers'),
    ``max_source_positions`` (the encoder's positions: ``input_features`` have ``2 *
    max_source_positions`` frames), ``max_target_positions`` (the decoder's learned
    positions), the dropouts (in training only), ``init_std``,
    ``tie_word_embeddings`` and the token ids. ``suppress_tokens`` and
    ``begin_suppress_tokens`` are what ``generate`` masks out at every step and at the
    first generated step, unless the model has a ``generation_config`` of its own, as
    transformers' ``model.generation_config`` starts from them. ``scale_embedding``
    is read and kept but, as in transformers 5, scales nothing. The SpecAugment and
    audio-classification fields are kept for ``config.json`` alone: training with
    ``apply_spec_augment`` or a layer drop is refused by ``apply``.
    """

    model_type: ClassVar[str] = "whisper"

    vocab_size: int = 51865
    num_mel_bins: int = 80
    encoder_layers: int = 4
    encoder_attention_heads: int = 6
    decoder_layers: int = 4
    decoder_attention_heads: int = 6
    decoder_ffn_dim: int = 1536
    encoder_ffn_dim: int = 1536
    encoder_layerdrop: float = 0.0
    decoder_layerdrop: float = 0.0
    decoder_start_token_id: int | None = 50257
    use_cache: bool = True
    is_encoder_decoder: bool = True
    activation_function: str = "gelu"
    d_model: int = 384
    dropout: float = 0.0
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    init_std: float = 0.02
    scale_embedding: bool = False
    max_source_positions: int = 1500
    max_target_positions: int = 448
    pad_token_id: int | None = 50256
    bos_token_id: int | None = 50256
    eos_token_id: int | tuple[int, ...] | None = 50256
    suppress_tokens: tuple[int, ...] | None = None
    begin_suppress_tokens: tuple[int, ...] | None = (220, 50256)
    use_weighted_layer_sum: bool = False
    classifier_proj_size: int = 256
    apply_spec_augment: bool = False
    mask_time_prob: float = 0.05
    mask_time_length: int = 10
    mask_time_min_masks: int = 2
    mask_feature_prob: float = 0.0
    mask_feature_length: int = 10
    mask_feature_min_masks: int = 0
    median_filter_width: int = 7
    tie_word_embeddings: bool = True

    def __post_init__(self):
        super().__post_init__()
        name = "WhisperConfig"
        for field in (
            "vocab_size",
            "num_mel_bins",
            "encoder_layers",
            "encoder_attention_heads",
            "decoder_layers",
            "decoder_attention_heads",
            "decoder_ffn_dim",
            "encoder_ffn_dim",
            "d_model",
            "max_source_positions",
            "max_target_positions",
        ):
            check_int(name, field, getattr(self, field))
        for field in ("encoder_attention_heads", "decoder_attention_heads"):
            if self.d_model % getattr(self, field):
                raise ValueError(
                    f"{name}: d_model must be divisible by {field}={getattr(self, field)}, "
                    f"got {self.d_model}"
                )
        if self.d_model % 2:  # the encoder's sinusoidal positions
            raise ValueError(f"{name}: d_model must be even, got {self.d_model}")
        for field in (
            "dropout",
            "attention_dropout",
            "activation_dropout",
            "encoder_layerdrop",
            "decoder_layerdrop",
        ):
            check_float(name, field, getattr(self, field), low=0.0, high=1.0, high_open=True)
        check_float(name, "init_std", self.init_std, low=0.0)
        check_choice(name, "activation_function", self.activation_function, tuple(_ACTIVATIONS))
        if self.is_encoder_decoder is not True:
            raise ValueError(
                f"{name}: is_encoder_decoder must be True, got {self.is_encoder_decoder!r}"
            )

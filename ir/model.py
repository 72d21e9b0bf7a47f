"""Model shapes (Llama-style decoders) and training settings.

Presets cover the models of the HexiScale and DHelix evaluations plus ``tiny`` for CPU runtime
tests; any Hugging Face ``config.json`` is read directly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from .checks import finite_number
from .errors import InvalidInputError
from .files import read_structured_file

__all__ = [
    "MAX_LAYERS",
    "MAX_MICRO_BATCHES",
    "PRESETS",
    "ModelConfig",
    "Recompute",
    "TrainingConfig",
    "load_model",
]

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


# planning time grows with the layer count (100,000 layers: ~14 s on 8 GPUs); real models have
# up to a few hundred, so more is a typo that would otherwise look like a hang
MAX_LAYERS = 10_000
# micro-batches per step: the planners' work grows with them (100,000: hexiscale ~2 s, CP-SAT's models
# 2.7 GB on 8 GPUs), and a step of more is a typo or a batch that wants a larger micro-batch
MAX_MICRO_BATCHES = 100_000


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """A Llama-style decoder: RMSNorm, rotary attention (GQA allowed), SwiGLU MLP, no biases."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise InvalidInputError(f"must be a positive integer, got {v!r}", field=f)
        if self.layers > MAX_LAYERS:
            raise InvalidInputError(f"{self.layers} layers exceeds the limit of {MAX_LAYERS}", field="layers")
        if not isinstance(self.name, str) or not self.name:
            raise InvalidInputError(f"must be a non-empty string, got {self.name!r}", field="name")
        if not isinstance(self.tie_embeddings, bool):
            raise InvalidInputError(f"must be true or false, got {self.tie_embeddings!r}", field="tie_embeddings")
        if self.hidden % self.heads:
            raise InvalidInputError(
                f"hidden size {self.hidden} is not divisible by the head count {self.heads}", field="hidden")
        if self.heads % self.kv_heads:
            raise InvalidInputError(
                f"head count {self.heads} is not a multiple of kv_heads {self.kv_heads}", field="kv_heads")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of the K (or V) projection: kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def params_per_layer(self) -> int:
        """Weights of one block: q,o (h x h), k,v (h x kv_hidden), gate/up/down (3 h f), 2 norms."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_hidden + 3 * h * self.ffn + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """Final norm plus the LM head (zero extra when tied to the embedding)."""
        return self.hidden + (0 if self.tie_embeddings else self.vocab * self.hidden)

    @property
    def total_params(self) -> int:
        return self.layers * self.params_per_layer + self.embedding_params + self.head_params

    def check_tp(self, tp: int) -> None:
        """Raise InvalidInputError unless TP degree ``tp`` divides heads, kv_heads and ffn."""
        if tp <= 0:
            raise InvalidInputError(f"TP degree must be positive, got {tp}", field="tp")
        for field, value in (("heads", self.heads), ("kv_heads", self.kv_heads), ("ffn", self.ffn)):
            if value % tp:
                raise InvalidInputError(
                    f"{field}={value} of model {self.name} is not divisible by TP degree {tp}", field="tp")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> ModelConfig:
        try:
            if not isinstance(data, dict):
                raise InvalidInputError("expected a mapping")
            allowed = {"name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "tie_embeddings"}
            for key in data:
                if key not in allowed:
                    raise InvalidInputError("unknown field", field=key)
            for key in ("name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
                if key not in data:
                    raise InvalidInputError("missing required field", field=key)
            return cls(**data)
        except InvalidInputError as err:
            raise (err.with_source(source) if source else err) from None


PRESETS: dict[str, ModelConfig] = {
    m.name: m
    for m in (
        ModelConfig(name="llama2-7b", layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000),
        ModelConfig(name="llama2-13b", layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824, vocab=32000),
        ModelConfig(name="llama-30b", layers=60, hidden=6656, heads=52, kv_heads=52, ffn=17920, vocab=32000),
        ModelConfig(name="llama2-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000),
        # GPT-3-style shapes used in the DHelix evaluation, as Llama-style blocks (SwiGLU ffn = 8h/3).
        ModelConfig(name="gpt-6.7b", layers=32, hidden=4096, heads=32, kv_heads=32, ffn=10944, vocab=50304),
        # tiny: 8 layers, byte-level vocabulary; fits the CPU runtime tests in seconds.
        ModelConfig(name="tiny", layers=8, hidden=64, heads=4, kv_heads=4, ffn=176, vocab=256),
    )
}

_HF_FIELDS = {
    "hidden_size": "hidden",
    "num_hidden_layers": "layers",
    "num_attention_heads": "heads",
    "intermediate_size": "ffn",
    "vocab_size": "vocab",
}


def _from_hf(path: Path, data: Any) -> ModelConfig:
    if not isinstance(data, dict):
        raise InvalidInputError("expected a JSON object", source=str(path))
    kwargs: dict[str, Any] = {"name": data.get("_name_or_path") or path.parent.name or path.stem}
    for hf, ours in _HF_FIELDS.items():
        if hf not in data:
            raise InvalidInputError("missing required field", source=str(path), field=hf)
        kwargs[ours] = data[hf]
    kwargs["kv_heads"] = data.get("num_key_value_heads") or data["num_attention_heads"]
    kwargs["tie_embeddings"] = bool(data.get("tie_word_embeddings", False))
    try:
        return ModelConfig(**kwargs)
    except InvalidInputError as err:
        inverse = {v: k for k, v in _HF_FIELDS.items()} | {"kv_heads": "num_key_value_heads"}
        raise InvalidInputError(err.message, source=str(path), field=inverse.get(err.field or "", err.field)) from None


def load_model(spec: str) -> ModelConfig:
    """A preset name (``llama2-7b``, ``tiny``, ...) or a path to a Hugging Face ``config.json``
    (or a hexhelix model JSON with ``layers``/``hidden``/...)."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.exists():
        raise InvalidInputError(
            f"unknown model {spec!r}: not a preset ({', '.join(PRESETS)}) and no such file", field="model")
    data = read_structured_file(path)
    if isinstance(data, dict) and "hidden" in data:
        return ModelConfig.from_dict(data, source=str(path))
    return _from_hf(path, data)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    """What one optimizer step processes and how: batch in sequences, micro-batch, sequence length,
    dtype, activation recompute, sequence parallelism and the bytes of model state per parameter."""

    global_batch: int = 64
    micro_batch: int = 1
    seq_len: int = 4096
    dtype: str = "bf16"
    recompute: str = "none"
    sequence_parallel: bool = True
    state_bytes_per_param: float = 16.0

    def __post_init__(self) -> None:
        for f in ("global_batch", "micro_batch", "seq_len"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise InvalidInputError(f"must be a positive integer, got {v!r}", field=f)
        if self.global_batch % self.micro_batch:
            raise InvalidInputError(
                f"global batch {self.global_batch} is not a multiple of the micro-batch {self.micro_batch}",
                field="global_batch")
        if self.num_micro_batches > MAX_MICRO_BATCHES:
            raise InvalidInputError(
                f"global batch {self.global_batch} / micro-batch {self.micro_batch} = "
                f"{self.num_micro_batches} micro-batches per step exceeds the limit of "
                f"{MAX_MICRO_BATCHES}; use a larger micro-batch", field="global_batch")
        if self.recompute not in RECOMPUTE_MODES:
            raise InvalidInputError(f"must be one of {', '.join(RECOMPUTE_MODES)}, got {self.recompute!r}",
                                    field="recompute")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPE_BYTES:
            raise InvalidInputError(f"must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}", field="dtype")
        sbp = self.state_bytes_per_param
        if not finite_number(sbp) or sbp <= 0:
            raise InvalidInputError(f"must be a positive number, got {sbp!r}", field="state_bytes_per_param")
        if not isinstance(self.sequence_parallel, bool):
            raise InvalidInputError(f"must be true or false, got {self.sequence_parallel!r}",
                                    field="sequence_parallel")

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches in one step across all pipelines."""
        return self.global_batch // self.micro_batch

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> TrainingConfig:
        try:
            if not isinstance(data, dict):
                raise InvalidInputError("expected a mapping")
            allowed = set(cls.__dataclass_fields__)
            for key in data:
                if key not in allowed:
                    raise InvalidInputError("unknown field", field=key)
            return cls(**data)
        except InvalidInputError as err:
            raise (err.with_source(source) if source else err) from None

"""Deterministic training data from a seed: byte-level windows of a small bundled English text
(so the loss means something: it falls from ln(256) ≈ 5.55 as the model learns the text), or
uniform synthetic tokens.

A sample is addressed by (seed, step, global micro-batch): micro-batch ``i`` of pipeline ``p`` is
global micro-batch ``Σ_{q<p} m_q + i`` (docs/program.md §2), so every layout of the same program —
and the single-process reference, which concatenates the global micro-batches in order — sees the
same sequences in the same places.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from hexhelix.ir.errors import InvalidInputError

__all__ = ["CORPUS_PATH", "DataSource", "byte_tokens"]

CORPUS_PATH = Path(__file__).with_name("data") / "corpus.txt"
DATASETS = ("text", "synthetic")


@cache
def byte_tokens(path: str = str(CORPUS_PATH)) -> torch.Tensor:
    """The file as a 1-D int64 tensor of byte values (the byte-level tokenizer: token = byte)."""
    data = Path(path).read_bytes()
    return torch.tensor(list(data), dtype=torch.int64)


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSource:
    """Micro-batches of ``micro_batch`` sequences of ``seq_len`` tokens and their next-token
    targets, for a vocabulary of ``vocab`` (bytes are reduced modulo ``vocab`` when it is < 256)."""

    seed: int
    micro_batch: int
    seq_len: int
    vocab: int
    dataset: str = "text"

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise InvalidInputError(f"must be one of {', '.join(DATASETS)}, got {self.dataset!r}",
                                    field="dataset")
        if self.dataset == "text" and self.seq_len + 1 > len(byte_tokens()):
            raise InvalidInputError(
                f"sequence length {self.seq_len} exceeds the bundled text ({len(byte_tokens())} bytes); "
                "use --data synthetic", field="seq_len")

    def _generator(self, step: int, global_mb: int) -> torch.Generator:
        return torch.Generator().manual_seed(((self.seed * 1_000_003 + step) * 65_537 + global_mb) % (2**63))

    def micro_batch_at(self, step: int, global_mb: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, targets)``, each ``(micro_batch, seq_len)`` int64, for one micro-batch."""
        gen = self._generator(step, global_mb)
        if self.dataset == "synthetic":
            seq = torch.randint(0, self.vocab, (self.micro_batch, self.seq_len + 1), generator=gen)
        else:
            text = byte_tokens()
            starts = torch.randint(0, len(text) - self.seq_len, (self.micro_batch,), generator=gen)
            seq = torch.stack([text[s: s + self.seq_len + 1] for s in starts.tolist()])
            if self.vocab < 256:
                seq = seq % self.vocab
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def global_batch(self, step: int, num_micro_batches: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All micro-batches of a step concatenated in global order (what the reference trains on)."""
        parts = [self.micro_batch_at(step, g) for g in range(num_micro_batches)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

"""The Python API end to end: build a config in code, register a custom model, train, resume.

Run: python examples/train_reference.py [OUTPUT_DIR]
"""

from __future__ import annotations

import sys

import torch
from torch import nn

import speedtronic


@speedtronic.register_model("tiny_mlp_lm")
def tiny_mlp_lm(vocab_size: int, d_model: int, **_: object) -> nn.Module:
    """A custom model: embedding + MLP + head, returning {"logits"} for the trainer's causal
    loss.
    """

    class TinyMLPLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab_size, d_model)
            self.mlp = nn.Sequential(
                nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
            )
            self.head = nn.Linear(d_model, vocab_size)

        def forward(self, input_ids: torch.Tensor, **_: object) -> dict[str, torch.Tensor]:
            x = self.embed(input_ids)
            return {"logits": self.head(x + self.mlp(x))}

    return TinyMLPLM()


def main(output_dir: str = "runs/example") -> None:
    config = speedtronic.SpeedtronicConfig.from_dict(
        {
            "name": "example",
            "device": "cpu",
            "max_steps": 6,
            "output_dir": output_dir,
            "model": {"name": "tiny_mlp_lm", "vocab_size": 64, "max_seq_len": 16, "d_model": 32},
            "data": {"num_tokens": 256, "micro_batch_size": 4, "target_batch_size": 8},
            "optimizer": "muon",
            "scheduler": {"warmup_steps": 1},  # the default 100 would outlast these 6 steps
            "precision": "fp32",
            "checkpoint": {"every_steps": 3},
        }
    )
    first = speedtronic.train_from_config(config, max_steps=3)
    print(f"first run: step {first.steps}, loss {first.final_loss:.3f}")
    resumed = speedtronic.train_from_config(config, resume=True)  # continues from step 3 to 6
    print(f"resumed run: step {resumed.steps}, loss {resumed.final_loss:.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:])

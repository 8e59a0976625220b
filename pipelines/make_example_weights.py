"""Regenerate the small example weight files in tsconv/pipeline/builtin/weights/ (deterministic; run from anywhere).

python pipelines/make_example_weights.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

HERE = Path(__file__).resolve().parents[1] / "tsconv" / "pipeline" / "builtin" / "weights"


def main() -> None:
    HERE.mkdir(exist_ok=True)
    rng = np.random.default_rng(20261129)
    # A dense stage for 64 input features (the demo store): 32 filters of 5 taps, zero-sum in time so
    # they respond to moves, not to price levels.
    w = rng.normal(size=(32, 64, 5)) / np.sqrt(64 * 5)
    w -= w.mean(axis=2, keepdims=True)
    np.save(HERE / "dense_32x64x5.npy", w.astype(np.float32), allow_pickle=False)
    np.save(HERE / "dense_32_bias.npy", (0.01 * rng.normal(size=32)).astype(np.float32), allow_pickle=False)
    # A projection head 32 -> 8, weights and bias in one safetensors file.
    save_file(
        {
            "weight": (rng.normal(size=(32, 8)) / np.sqrt(32)).astype(np.float32),
            "bias": np.zeros(8, dtype=np.float32),
        },
        str(HERE / "head_32x8.safetensors"),
    )


if __name__ == "__main__":
    main()

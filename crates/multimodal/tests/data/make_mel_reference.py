"""Writes mel_reference.json: Whisper-style log-mel values for a fixed test signal, computed
with librosa (filterbank, centred reflect-padded STFT) and numpy, the way Whisper's
`log_mel_spectrogram` computes them. Run once; the Rust tests compare against the file.

    python -m venv /tmp/ref && /tmp/ref/bin/pip install numpy librosa
    /tmp/ref/bin/python make_mel_reference.py
"""

import json

import librosa
import numpy as np

SR, N_FFT, HOP = 16000, 400, 160
n = np.arange(20800)
t = n / SR
x = (
    0.5 * np.sin(2 * np.pi * 440 * t)
    + 0.25 * np.sin(2 * np.pi * 3000 * t + 0.3)
    + 0.1 * np.sin(2 * np.pi * (100 * t + 800 * t * t))
).astype(np.float32)


def log_mel(samples, n_mels):
    filters = librosa.filters.mel(sr=SR, n_fft=N_FFT, n_mels=n_mels)
    stft = librosa.stft(
        samples.astype(np.float64),
        n_fft=N_FFT,
        hop_length=HOP,
        window="hann",
        center=True,
        pad_mode="reflect",
    )
    power = np.abs(stft[:, :-1]) ** 2
    spec = np.log10(np.clip(filters @ power, 1e-10, None))
    spec = np.maximum(spec, spec.max() - 8.0)
    return filters, (spec + 4.0) / 4.0


out = {"signal_len": len(x), "cases": []}
for n_mels, rows in ((80, [0, 10, 40, 79]), (128, [0, 64, 127])):
    filters, spec = log_mel(x, n_mels)
    frames = [0, 1, 2, 65, spec.shape[1] - 2, spec.shape[1] - 1]
    out["cases"].append(
        {
            "n_mels": n_mels,
            "frames": spec.shape[1],
            "filter_rows": {str(r): [float(v) for v in filters[r]] for r in rows},
            "spectrogram_frames": {
                str(f): [float(v) for v in spec[:, f]] for f in frames
            },
        }
    )
with open("mel_reference.json", "w") as f:
    json.dump(out, f, separators=(",", ":"))

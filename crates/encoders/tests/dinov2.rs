//! The real vision tower: shapes, determinism, batching. Needs ONNX Runtime and the model
//! (`scripts/test` fetches both; `SWITCHYARD_ORT_DYLIB`, `SWITCHYARD_DINOV2_ONNX`).

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use switchyard_encoders::{EncoderError, VisionEncoder};

fn path(var: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("set {var} (scripts/test fetches it)"))
}

fn square(side: usize, seed: usize) -> Vec<u8> {
    (0..side * side * 3)
        .map(|i| ((i / 3 % side) * 255 / side + seed * 40 + (i % 3) * 20) as u8)
        .collect()
}

#[test]
fn a_vision_tower_gives_patch_embeddings_that_follow_the_image_and_not_the_batch() {
    let mut encoder = VisionEncoder::load(
        &path("SWITCHYARD_ORT_DYLIB"),
        &path("SWITCHYARD_DINOV2_ONNX"),
        2,
    )
    .unwrap();
    let side = encoder.side();
    let (a, b) = (square(side, 1), square(side, 4));
    let one = encoder.encode(&[&a]).unwrap();
    // 16 × 16 patches and the class token, 384 wide.
    assert_eq!((one.batch, one.tokens, one.dim), (1, 257, 384));
    assert!(one.values.iter().all(|v| v.is_finite()));
    let again = encoder.encode(&[&a]).unwrap();
    assert_eq!(one.values, again.values);
    let pair = encoder.encode(&[&a, &b]).unwrap();
    assert_eq!(pair.batch, 2);
    let close = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(p, q)| (p - q).abs() < 1e-3);
    assert!(
        close(pair.item(0), one.item(0)),
        "batching changed an image's embeddings"
    );
    assert!(
        !close(pair.item(1), one.item(0)),
        "two images, one embedding"
    );
    let bad = encoder.encode(&[&a[..10]]);
    assert!(matches!(bad, Err(EncoderError::BadInput(_))), "{bad:?}");

    // Squares of another side are resized first: a flat colour stays that colour.
    let flat = |side: usize| -> Vec<u8> { [30u8, 140, 200].repeat(side * side) };
    let native = encoder.encode(&[&flat(side)]).unwrap();
    let two = [
        flat(336),
        a.iter().copied().cycle().take(336 * 336 * 3).collect(),
    ]
    .concat();
    let resized = encoder.encode_any(336, &two).unwrap();
    assert_eq!((resized.batch, resized.tokens), (2, 257));
    assert!(
        close(resized.item(0), native.item(0)),
        "a resized flat square changed"
    );
    let ragged = encoder.encode_any(336, &two[..two.len() - 3]);
    assert!(
        matches!(ragged, Err(EncoderError::BadInput(_))),
        "{ragged:?}"
    );

    // A second encoder in the process shares ONNX Runtime (it allows one environment).
    let mut second = VisionEncoder::load(
        &path("SWITCHYARD_ORT_DYLIB"),
        &path("SWITCHYARD_DINOV2_ONNX"),
        1,
    )
    .unwrap();
    assert!(close(second.encode(&[&a]).unwrap().item(0), one.item(0)));
}

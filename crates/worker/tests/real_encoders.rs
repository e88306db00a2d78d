//! Encoder workers with real encoders: DINOv2 ViT-S/14 on ONNX Runtime for images and
//! video frames, Whisper tiny.en on candle for audio. Needs the models `scripts/test`
//! fetches (`SWITCHYARD_ORT_DYLIB`, `SWITCHYARD_DINOV2_ONNX`, `SWITCHYARD_WHISPER_CT2`).

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use switchyard_core::protocol::{
    EngineError, GenerateOutput, GenerateRequest, MediaInput, Phase, Prompt,
};
use switchyard_core::{MediaSpan, Modality, RequestId};
use switchyard_worker::real_encoders::{Encoded, RealEncoders, item_embeddings};
use switchyard_worker::{EncoderConfig, EncoderModels, Engine, MockEncoder};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

fn path(var: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("set {var} (scripts/test fetches it)"))
}

fn models(batch_timeout: Duration) -> EncoderModels {
    EncoderModels {
        modalities: Vec::new(),
        vision: Some(path("SWITCHYARD_DINOV2_ONNX")),
        onnxruntime: Some(path("SWITCHYARD_ORT_DYLIB")),
        audio: Some(path("SWITCHYARD_WHISPER_CT2")),
        threads: 2,
        max_batch: 8,
        batch_timeout,
        ..EncoderModels::default()
    }
}

fn squares(side: u32, n: usize, seed: u8) -> MediaInput {
    let one: Vec<u8> = (0..side as usize * side as usize * 3)
        .map(|i| (i % 251) as u8 ^ seed)
        .collect();
    MediaInput::squares(side, &vec![one; n])
}

fn mel(bins: u32) -> MediaInput {
    let window: Vec<f32> = (0..bins as usize * 3000)
        .map(|i| (i % 97) as f32 / 48.0 - 1.0)
        .collect();
    MediaInput::mel(bins, 3000, &[window])
}

fn request(items: Vec<(Modality, MediaInput)>, with_inputs: bool) -> GenerateRequest {
    let mut prompt = Prompt::tokens(Vec::new());
    prompt.media = items
        .iter()
        .enumerate()
        .map(|(i, (modality, _))| MediaSpan {
            modality: *modality,
            media_hash: i as u64,
            offset: 0,
            length: 16,
        })
        .collect();
    GenerateRequest {
        phase: Phase::Encode,
        prompt,
        media_inputs: if with_inputs {
            items.into_iter().map(|(_, input)| input).collect()
        } else {
            Vec::new()
        },
        ..GenerateRequest::text(RequestId(1), Vec::new(), 0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_encoders_compute_embeddings_per_unit_and_batch_items_across_requests() {
    let real = RealEncoders::load(&models(Duration::from_millis(500)))
        .unwrap()
        .unwrap();
    assert!(
        real.takes(Modality::Image) && real.takes(Modality::Video) && real.takes(Modality::Audio)
    );
    // Two requests' images arriving together share one pass of the vision tower; squares
    // of another side than the tower's are resized.
    let (image, video) = (squares(336, 2, 1), squares(224, 3, 2));
    let (a, b) = tokio::join!(
        real.encode(Modality::Image, &image),
        real.encode(Modality::Video, &video),
    );
    let shape = |units: &[Encoded]| -> Vec<(usize, usize, usize)> {
        units
            .iter()
            .map(|u| (u.tokens, u.dim, u.values.len()))
            .collect()
    };
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(shape(&a), vec![(257, 384, 257 * 384); 2]);
    assert_eq!(shape(&b), vec![(257, 384, 257 * 384); 3]);
    assert!(a.iter().flat_map(|u| &u.values).all(|v| v.is_finite()));
    // Squares that differ give different embeddings; an item's units go out as one input.
    assert_ne!(a[0].values, b[0].values);
    let item = item_embeddings(&b).unwrap();
    assert_eq!(item.embedding_rows().unwrap().0, 3 * 257);
    assert_eq!(real.passes().0, 1);
    // One 30-second window: 1,500 embeddings.
    let audio = real.encode(Modality::Audio, &mel(80)).await.unwrap();
    assert_eq!(shape(&audio), vec![(1500, 384, 1500 * 384)]);
    // Inputs the models cannot take.
    assert!(matches!(
        real.encode(Modality::Audio, &mel(128)).await,
        Err(EngineError::Unsupported(m)) if m.contains("80 mel bins")
    ));
    assert!(matches!(
        real.encode(Modality::Image, &mel(80)).await,
        Err(EngineError::Unsupported(_))
    ));
    let ragged = MediaInput::Squares {
        side: 224,
        rgb: vec![0u8; 1000].into(),
    };
    assert!(matches!(
        real.encode(Modality::Image, &ragged).await,
        Err(EngineError::Invalid(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoder_worker_with_real_models_encodes_what_the_frontend_prepared() {
    let engine = MockEncoder::new(EncoderConfig {
        models: models(Duration::from_millis(5)),
        ..EncoderConfig::default()
    })
    .unwrap();
    let service = Box::new(engine)
        .start(&TaskTracker::new(), CancellationToken::new())
        .await
        .unwrap()
        .service;
    let items = vec![
        (Modality::Image, squares(336, 1, 3)),
        (Modality::Audio, mel(80)),
        (Modality::Video, squares(336, 4, 4)),
    ];
    let mut stream = service
        .generate(request(items.clone(), true))
        .await
        .unwrap();
    // The items' embeddings, one per item (an image's 257 rows; a video's 4 frames'), then
    // the end.
    let Some(Ok(GenerateOutput::Features { items: features })) = stream.next().await else {
        panic!("no embeddings");
    };
    let rows: Vec<usize> = features
        .iter()
        .map(|f| f.embedding_rows().unwrap().0)
        .collect();
    assert_eq!(rows, vec![257, 1500, 4 * 257]);
    assert!(matches!(
        stream.next().await,
        Some(Ok(GenerateOutput::Finished { .. }))
    ));
    // Without the prepared inputs there is nothing to encode: another encoder may take it.
    assert!(matches!(
        service.generate(request(items, false)).await,
        Err(EngineError::Unsupported(_))
    ));
    // A failure inside a model is the request's error, not the worker's end.
    let mut stream = service
        .generate(request(vec![(Modality::Audio, mel(128))], true))
        .await
        .unwrap();
    assert!(matches!(
        stream.next().await,
        Some(Err(EngineError::Unsupported(_)))
    ));
    let mut stream = service
        .generate(request(vec![(Modality::Image, squares(224, 1, 5))], true))
        .await
        .unwrap();
    assert!(matches!(
        stream.next().await,
        Some(Ok(GenerateOutput::Features { .. }))
    ));
    assert!(matches!(
        stream.next().await,
        Some(Ok(GenerateOutput::Finished { .. }))
    ));
}

#[test]
fn a_vision_model_without_onnx_runtime_is_a_clear_start_error() {
    let err = RealEncoders::load(&EncoderModels {
        vision: Some("/nonexistent/model.onnx".into()),
        ..EncoderModels::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("libonnxruntime"), "{err}");
    assert!(
        RealEncoders::load(&EncoderModels::default())
            .unwrap()
            .is_none()
    );
}

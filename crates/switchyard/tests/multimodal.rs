//! Images, audio and video in chat requests through `serve`: prepared off the async threads,
//! counted as encoder tokens, cached and routed by their content; bad media is a 400 naming
//! its part.

#![allow(clippy::unwrap_used)]

mod support;

use base64::Engine as _;
use serde_json::{Value, json};
use support::*;

const MODEL: &str = "switchyard-mock";

/// A chat request: text, then an image part (`url`, with `detail` when given).
fn with_image(text: &str, url: &str, detail: Option<&str>) -> Value {
    let mut image = json!({"url": url});
    if let Some(detail) = detail {
        image["detail"] = json!(detail);
    }
    json!({
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": image},
        ]}],
    })
}

/// The feature store's bytes, in every state, in Prometheus text.
fn store_bytes(metrics: &str) -> f64 {
    metric_value(metrics, "switchyard_feature_store_bytes", None)
}

/// The media, encoder and feature-store lines of Prometheus text (for failure messages).
fn media_lines(metrics: &str) -> String {
    metrics
        .lines()
        .filter(|l| {
            !l.starts_with('#')
                && (l.contains("feature_store") || l.contains("media") || l.contains("encoder"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `switchyard_media_encodes_total{outcome}` in Prometheus text.
fn encodes(metrics: &str, outcome: &str) -> f64 {
    metric_value(
        metrics,
        "switchyard_media_encodes_total",
        Some(&format!("outcome=\"{outcome}\"")),
    )
}

fn usage(body: &Value) -> (u64, u64) {
    (
        body["usage"]["prompt_tokens"].as_u64().unwrap(),
        body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_counts_its_patch_tokens_and_hits_the_cache_by_its_content() {
    let d = start(&[("WORKERS__COUNT", "2")]).await;
    let text = "Describe this picture in one short sentence, please:";
    let (s, _, plain) = post(&d, "/v1/chat/completions", &chat(MODEL, text, 4)).await;
    assert_eq!(s, 200, "{plain}");
    let (text_tokens, _) = usage(&plain);

    // One 336-pixel square of 14-pixel patches (the image is not larger, so `auto` does not
    // tile it): 576 tokens more than the text alone (the text around the image is
    // tokenized in two pieces, which may cost a token).
    let a = data_url(&png(320, 240, 1));
    let (s, headers, first) = post(&d, "/v1/chat/completions", &with_image(text, &a, None)).await;
    assert_eq!(s, 200, "{first}");
    let (tokens, cached) = usage(&first);
    assert!(
        (text_tokens + 576..=text_tokens + 578).contains(&tokens),
        "{tokens} prompt tokens with the image, {text_tokens} without"
    );
    assert!(
        cached < 576,
        "nothing of the image was cached yet: {cached}"
    );
    let worker = headers["x-switchyard-worker"].clone();

    // The same image again: the same worker, its blocks cached.
    let (_, headers, again) = post(&d, "/v1/chat/completions", &with_image(text, &a, None)).await;
    let (_, cached_again) = usage(&again);
    assert_eq!(headers["x-switchyard-worker"], worker);
    assert!(
        cached_again >= tokens / 16 * 16 - 16,
        "{cached_again} of {tokens} tokens cached the second time"
    );

    // Another image with the same text shares no block that holds image positions: at most
    // the blocks of the text before it.
    let b = data_url(&png(320, 240, 2));
    let (s, _, other) = post(&d, "/v1/chat/completions", &with_image(text, &b, None)).await;
    assert_eq!(s, 200, "{other}");
    let (other_tokens, other_cached) = usage(&other);
    assert_eq!(other_tokens, tokens);
    assert!(
        other_cached <= text_tokens,
        "{other_cached} tokens cached for a different image"
    );

    // `high` detail (and `auto`, for an image larger than a square) tiles it: 2 × 1
    // squares and an overview, 3 × 576 tokens.
    let wide = data_url(&png(672, 336, 3));
    let (s, _, tiled) = post(
        &d,
        "/v1/chat/completions",
        &with_image(text, &wide, Some("high")),
    )
    .await;
    assert_eq!(s, 200, "{tiled}");
    let (tiled_tokens, _) = usage(&tiled);
    assert!(
        (text_tokens + 3 * 576..=text_tokens + 3 * 576 + 2).contains(&tiled_tokens),
        "{tiled_tokens}"
    );
    let (_, _, low) = post(
        &d,
        "/v1/chat/completions",
        &with_image(text, &wide, Some("low")),
    )
    .await;
    assert_eq!(usage(&low).0, tokens);
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// An audio file from the multimodal crate's test data, base64.
fn audio_file(name: &str) -> String {
    let path = format!(
        "{}/../multimodal/tests/data/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    base64::engine::general_purpose::STANDARD.encode(std::fs::read(path).unwrap())
}

fn with_audio(text: &str, data: &str, format: &str) -> Value {
    json!({
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": text},
            {"type": "input_audio", "input_audio": {"data": data, "format": format}},
        ]}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audio_counts_its_window_tokens_and_hits_the_cache_by_its_content() {
    let d = start(&[("WORKERS__COUNT", "2")]).await;
    let text = "Transcribe this recording:";
    let (s, _, plain) = post(&d, "/v1/chat/completions", &chat(MODEL, text, 4)).await;
    assert_eq!(s, 200, "{plain}");
    let (text_tokens, _) = usage(&plain);

    // 1.5 s of audio is one padded 30 s Whisper window: 1,500 tokens.
    let mp3 = audio_file("tone.mp3");
    let (s, headers, first) =
        post(&d, "/v1/chat/completions", &with_audio(text, &mp3, "mp3")).await;
    assert_eq!(s, 200, "{first}");
    let (tokens, cached) = usage(&first);
    assert!(
        (text_tokens + 1_500..=text_tokens + 1_502).contains(&tokens),
        "{tokens} prompt tokens with the audio, {text_tokens} without"
    );
    assert!(cached < 1_500, "{cached}");
    let (_, again_headers, again) =
        post(&d, "/v1/chat/completions", &with_audio(text, &mp3, "mp3")).await;
    assert_eq!(
        again_headers["x-switchyard-worker"],
        headers["x-switchyard-worker"]
    );
    assert!(usage(&again).1 >= tokens / 16 * 16 - 16, "{again}");

    // The same tone encoded as FLAC decodes to other samples (MP3 is lossy): another item.
    let flac = audio_file("tone.flac");
    let (s, _, other) = post(&d, "/v1/chat/completions", &with_audio(text, &flac, "flac")).await;
    assert_eq!(s, 200, "{other}");
    assert!(usage(&other).1 <= text_tokens, "{other}");

    // Bad audio is a 400 naming the part.
    let not_audio = base64::engine::general_purpose::STANDARD.encode(b"just some text");
    for (data, format, says) in [
        (not_audio.as_str(), "wav", "not wav, mp3"),
        (mp3.as_str(), "aiff", "must be one of"),
        ("%%%", "wav", "base64"),
    ] {
        let (s, _, body) = post(&d, "/v1/chat/completions", &with_audio(text, data, format)).await;
        assert_eq!(s, 400, "{body}");
        assert_eq!(
            body["error"]["param"], "messages[0].content[1].input_audio",
            "{body}"
        );
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    let (s, _, body) = post(
        &d,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": [
            {"type": "input_audio"}]}]}),
    )
    .await;
    assert_eq!(s, 400, "{body}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// An animated GIF of `frames` 48×32 frames, 100 ms each, shaded by `seed`.
fn gif(frames: u8, seed: u8) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut encoder = image::codecs::gif::GifEncoder::new(&mut out);
        for i in 0..frames {
            let g = seed.wrapping_add(i.wrapping_mul(9));
            let frame = image::RgbaImage::from_pixel(48, 32, image::Rgba([g, 255 - g, g / 2, 255]));
            encoder
                .encode_frame(image::Frame::from_parts(
                    frame,
                    0,
                    0,
                    image::Delay::from_numer_denom_ms(100, 1),
                ))
                .unwrap();
        }
    }
    out
}

fn with_video(text: &str, url: &str, max_tokens: u32) -> Value {
    json!({
        "model": MODEL,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": text},
            {"type": "video_url", "video_url": {"url": url}},
        ]}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn video_frames_fit_the_room_left_in_the_context_and_hit_the_cache() {
    let d = start(&[
        ("WORKERS__COUNT", "2"),
        ("FRONTEND__CONTEXT_LENGTH", "4096"),
    ])
    .await;
    let text = "What happens in this clip?";
    let (s, _, plain) = post(&d, "/v1/chat/completions", &chat(MODEL, text, 4)).await;
    assert_eq!(s, 200, "{plain}");
    let (text_tokens, _) = usage(&plain);

    // 12 frames, all kept (up to 32 by default), 144 tokens each (24 × 24 patches pooled
    // 2 × 2).
    let clip = format!(
        "data:image/gif;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(gif(12, 10))
    );
    let (s, headers, first) = post(&d, "/v1/chat/completions", &with_video(text, &clip, 4)).await;
    assert_eq!(s, 200, "{first}");
    let (tokens, _) = usage(&first);
    assert!(
        (text_tokens + 12 * 144..=text_tokens + 12 * 144 + 2).contains(&tokens),
        "{tokens} prompt tokens with the video, {text_tokens} without"
    );
    let (_, again_headers, again) =
        post(&d, "/v1/chat/completions", &with_video(text, &clip, 4)).await;
    assert_eq!(
        again_headers["x-switchyard-worker"],
        headers["x-switchyard-worker"]
    );
    assert!(usage(&again).1 >= tokens / 16 * 16 - 16, "{again}");

    // Asking for 3,500 of the 4,096 tokens leaves room for 3 frames, so 3 are sampled.
    let (s, _, tight) = post(&d, "/v1/chat/completions", &with_video(text, &clip, 3_500)).await;
    assert_eq!(s, 200, "{tight}");
    let (tight_tokens, _) = usage(&tight);
    assert!(
        (text_tokens + 3 * 144..=text_tokens + 3 * 144 + 2).contains(&tight_tokens),
        "{tight_tokens}"
    );

    // No room for one frame; not a video; bad base64: 400s naming the part.
    let not_video = format!(
        "data:video/mp4;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(b"no video here")
    );
    for (body, says) in [
        (with_video(text, &clip, 4_050), "room for"),
        (with_video(text, &not_video, 4), "not a video"),
        (with_video(text, "data:video/mp4;base64,@@", 4), "base64"),
    ] {
        let (s, _, body) = post(&d, "/v1/chat/completions", &body).await;
        assert_eq!(s, 400, "{body}");
        assert_eq!(
            body["error"]["param"], "messages[0].content[1].video_url",
            "{body}"
        );
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mp4_video_is_read_with_the_h264_feature_and_refused_clearly_without() {
    let d = start(&[("WORKERS__COUNT", "1")]).await;
    let text = "What happens in this clip?";
    let (_, _, plain) = post(&d, "/v1/chat/completions", &chat(MODEL, text, 4)).await;
    let (text_tokens, _) = usage(&plain);
    let path = format!(
        "{}/../multimodal/tests/data/ramp-high-bframes.mp4",
        env!("CARGO_MANIFEST_DIR")
    );
    let clip = format!(
        "data:video/mp4;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(path).unwrap())
    );
    let (s, _, body) = post(&d, "/v1/chat/completions", &with_video(text, &clip, 4)).await;
    if cfg!(feature = "h264") {
        // 30 frames, all kept: 30 × 144 tokens.
        assert_eq!(s, 200, "{body}");
        let (tokens, _) = usage(&body);
        assert!(
            (text_tokens + 30 * 144..=text_tokens + 30 * 144 + 2).contains(&tokens),
            "{tokens}"
        );
    } else {
        assert_eq!(s, 400, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("`h264` feature"), "{message}");
    }
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_codecs_go_through_ffmpeg_when_one_is_configured() {
    let ffmpeg = switchyard_runtime::testing::ffmpeg();
    // What aiperf sends by default: WebM with VP9, 2 s at 4 frames a second.
    let dir = tempfile::tempdir().unwrap();
    let webm = dir.path().join("clip.webm");
    let made = std::process::Command::new(&ffmpeg)
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg("testsrc2=size=160x120:rate=4:duration=2")
        .args(["-c:v", "libvpx-vp9", "-f", "webm"])
        .arg(&webm)
        .status()
        .unwrap();
    assert!(made.success());
    let clip = format!(
        "data:video/webm;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(&webm).unwrap())
    );
    let ffmpeg_setting = ffmpeg.to_str().unwrap().to_owned();
    let with = start(&[
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__MULTIMODAL__FFMPEG", ffmpeg_setting.as_str()),
    ])
    .await;
    let without = start(&[("WORKERS__COUNT", "1")]).await;
    let text = "What happens in this clip?";
    let (_, _, plain) = post(&with, "/v1/chat/completions", &chat(MODEL, text, 4)).await;
    let (text_tokens, _) = usage(&plain);

    let (s, _, body) = post(&with, "/v1/chat/completions", &with_video(text, &clip, 4)).await;
    assert_eq!(s, 200, "{body}");
    let (tokens, _) = usage(&body);
    assert!(
        (text_tokens + 8 * 144..=text_tokens + 8 * 144 + 2).contains(&tokens),
        "{tokens} prompt tokens, {text_tokens} without the video"
    );
    // A damaged file is ffmpeg's 400, not a 500.
    let mut damaged = std::fs::read(&webm).unwrap();
    let half = damaged.len() / 2;
    damaged[64..half].fill(0x5a);
    let damaged = format!(
        "data:video/webm;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(damaged)
    );
    let (s, _, body) = post(
        &with,
        "/v1/chat/completions",
        &with_video(text, &damaged, 4),
    )
    .await;
    assert_eq!(s, 400, "{body}");
    assert_eq!(body["error"]["param"], "messages[0].content[1].video_url");

    let (s, _, body) = post(
        &without,
        "/v1/chat/completions",
        &with_video(text, &clip, 4),
    )
    .await;
    assert_eq!(s, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("not a video this server reads"),
        "{message}"
    );
    with.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
    without
        .shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// Serves `png` at `/cat.png` and a 404 elsewhere; returns the base URL.
async fn image_server(png: Vec<u8>) -> String {
    let app = axum::Router::new().route(
        "/cat.png",
        axum::routing::get(move || {
            let png = png.clone();
            async move { ([("content-type", "image/png")], png) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_is_fetched_read_from_the_allowed_directory_or_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cat.png"), png(64, 64, 5)).unwrap();
    // A link in the media directory to a file outside it.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.png"), png(64, 64, 5)).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.png"),
        dir.path().join("link.png"),
    )
    .unwrap();
    let d = start(&[
        ("WORKERS__COUNT", "1"),
        (
            "FRONTEND__MULTIMODAL__MEDIA_DIR",
            dir.path().to_str().unwrap(),
        ),
        ("FRONTEND__MULTIMODAL__IMAGE__MAX_BYTES", "100000"),
        // The test's image server is on loopback.
        ("FRONTEND__MULTIMODAL__FETCH_PRIVATE", "true"),
    ])
    .await;
    let part = "messages[0].content[1].image_url";
    let text = "What is this?";
    let server = image_server(png(64, 64, 5)).await;

    // Fetched over HTTP, and read from the allowed directory: the same pixels, the same
    // tokens as a data: URL.
    let (s, _, inline) = post(
        &d,
        "/v1/chat/completions",
        &with_image(text, &data_url(&png(64, 64, 5)), None),
    )
    .await;
    assert_eq!(s, 200, "{inline}");
    for url in [
        format!("{server}/cat.png"),
        format!("file://{}", dir.path().join("cat.png").display()),
    ] {
        let (s, _, body) = post(&d, "/v1/chat/completions", &with_image(text, &url, None)).await;
        assert_eq!(s, 200, "{url}: {body}");
        assert_eq!(usage(&body).0, usage(&inline).0, "{url}");
    }

    let refused = [
        (
            with_image(text, "data:image/png;base64,aGVsbG8=", None),
            "not an image",
        ),
        (
            with_image(text, &format!("{server}/missing.png"), None),
            "HTTP 404",
        ),
        (
            with_image(text, "file:///etc/passwd", None),
            "only read under",
        ),
        (
            with_image(
                text,
                &format!("file://{}", dir.path().join("link.png").display()),
                None,
            ),
            "no readable media file",
        ),
        (
            with_image(
                text,
                &format!("file://{}", dir.path().join("missing.png").display()),
                None,
            ),
            "no readable media file",
        ),
        (with_image(text, "gopher://x/y.png", None), "`gopher`"),
        (
            with_image(text, &data_url(&png(64, 64, 1)), Some("ultra")),
            "detail",
        ),
        (
            with_image(text, &data_url(&png(400, 400, 1)), None),
            "over the limit of 100000",
        ),
        (
            json!({"model": MODEL, "messages": [{"role": "user", "content": [
                {"type": "text", "text": text},
                {"type": "image_url"},
            ]}]}),
            "needs `image_url`",
        ),
    ];
    for (body, says) in refused {
        let (s, _, error) = post(&d, "/v1/chat/completions", &body).await;
        assert_eq!(s, 400, "{body}: {error}");
        assert_eq!(error["error"]["param"], part, "{error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message} (expected {says})");
    }
    let (s, _, error) = post(
        &d,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        ]}]}),
    )
    .await;
    assert_eq!(s, 400, "{error}");
    assert_eq!(
        error["error"]["param"],
        "messages[0].content[0].input_audio"
    );
    // Client text cannot pose as an image: the frontend's mark in it is replaced.
    let (s, _, body) = post(
        &d,
        "/v1/chat/completions",
        &chat(MODEL, "a \u{E000} mark", 4),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_frontends_encoders_add_their_time_before_the_first_token() {
    // One encoder taking 485 ms an image: long enough to see against the mock engine.
    let slow = start(&[
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__MULTIMODAL__ENCODERS", "1"),
        (
            "FRONTEND__MULTIMODAL__ENCODER_COST__IMAGE_BATCH_MS",
            "[[1, 485.0], [2, 600.0]]",
        ),
    ])
    .await;
    // None by default.
    let none = start(&[("WORKERS__COUNT", "1")]).await;
    let body = with_image("What is this?", &data_url(&png(64, 64, 9)), None);
    let timed = |d| {
        let body = body.clone();
        async move {
            let start = std::time::Instant::now();
            let (s, _, b) = post(d, "/v1/chat/completions", &body).await;
            assert_eq!(s, 200, "{b}");
            start.elapsed()
        }
    };
    let encoded = timed(&slow).await;
    let plain = timed(&none).await;
    assert!(
        encoded >= std::time::Duration::from_millis(480),
        "{encoded:?} with a ~485 ms encoder"
    );
    assert!(
        plain + std::time::Duration::from_millis(300) < encoded,
        "{plain:?} without encoders, {encoded:?} with"
    );
    slow.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
    none.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_media_urls_cannot_reach_the_servers_own_network() {
    let d = start(&[("WORKERS__COUNT", "1")]).await;
    let server = image_server(png(64, 64, 5)).await;
    for url in [
        format!("{server}/cat.png"),
        "http://localhost/cat.png".to_string(),
        "http://[::1]/cat.png".to_string(),
        "http://10.1.2.3/cat.png".to_string(),
        "http://169.254.169.254/latest/meta-data/".to_string(),
    ] {
        let (s, _, error) = post(&d, "/v1/chat/completions", &with_image("Hi", &url, None)).await;
        assert_eq!(s, 400, "{url}: {error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains("public address"), "{url}: {message}");
    }
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// A distributed deployment (etcd, NATS, processes): an encoder worker process encodes the
/// media of the frontend's requests; once it is gone from discovery, requests go on
/// without encoding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoder_worker_processes_encode_for_a_distributed_frontend() {
    use std::time::Duration;
    use support::cluster::*;
    let cluster = Cluster::start();
    // 300 ms an image: long enough to see against the mock engine.
    let slow = [(
        "SWITCHYARD_FRONTEND__MULTIMODAL__ENCODER_COST__IMAGE_BATCH_MS",
        "[[1, 300.0], [2, 350.0]]",
    )];
    let _llm = cluster.worker(1, "10");
    let mut encoder = cluster.worker_with_env(
        "encoder-2",
        &["--worker-id", "2", "--role", "encoder"],
        &slow,
    );
    let frontend = cluster.frontend_with("frontend", 0, &slow);
    let listing = frontend.url("/v1/internal/workers");
    eventually(Duration::from_secs(15), "the encoder listed", || {
        let listing = listing.clone();
        async move {
            let listed = get_json(&listing).await;
            let roles: Vec<String> = listed
                .as_array()
                .into_iter()
                .flatten()
                .map(|w| w["role"].as_str().unwrap_or("").to_owned())
                .collect();
            if roles.iter().any(|r| r == "encoder") && roles.len() == 2 {
                Ok(())
            } else {
                Err(format!("{roles:?}"))
            }
        }
    })
    .await;
    let body = with_image("What is this?", &data_url(&png(64, 64, 4)), None);
    let timed = || {
        let body = body.clone();
        let url = frontend.url("/v1/chat/completions");
        async move {
            let start = std::time::Instant::now();
            let response = client().post(&url).json(&body).send().await.unwrap();
            let status = response.status().as_u16();
            let text = response.text().await.unwrap();
            (status, start.elapsed(), text)
        }
    };
    let (status, took, text) = timed().await;
    assert_eq!(status, 200, "{text}");
    assert!(
        took >= Duration::from_millis(290),
        "{took:?} with a 300 ms encoder process"
    );
    // The encoder process dies: once its lease lapses, media is no longer encoded.
    encoder.kill9();
    eventually(
        Duration::from_secs(20),
        "requests without the encoder",
        || {
            let timed = timed();
            async move {
                let (status, took, text) = timed.await;
                if status == 200 && took < Duration::from_millis(250) {
                    Ok(())
                } else {
                    Err(format!("{status} in {took:?}: {text}"))
                }
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joint_routing_skips_encoding_media_whose_kv_a_worker_holds() {
    // A 400 ms encoder: the same image behind the same text a second time is found cached
    // on a worker, predicted far sooner than encoding again. Round robin would send it to
    // the other worker: skipping the encoder pins it to the one holding its KV.
    let d = start(&[
        ("WORKERS__COUNT", "2"),
        ("FRONTEND__ROUTER__POLICY", "round-robin"),
        ("FRONTEND__MULTIMODAL__ENCODERS", "1"),
        (
            "FRONTEND__MULTIMODAL__ENCODER_COST__IMAGE_BATCH_MS",
            "[[1, 400.0], [2, 450.0]]",
        ),
    ])
    .await;
    let mut body = with_image(
        "Describe this picture in one short sentence, please:",
        &data_url(&png(200, 150, 21)),
        None,
    );
    // Text after the image: it lies in blocks the worker reuses (an image reaching into
    // the prompt's last block needs its embeddings wherever it goes).
    body["messages"][0]["content"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "text", "text": "Answer in plain words, with no list, no heading and no emphasis at all, in the language of the question."}));
    let timed = || {
        let body = body.clone();
        let d = &d;
        async move {
            let start = std::time::Instant::now();
            let (s, h, b) = post(d, "/v1/chat/completions", &body).await;
            assert_eq!(s, 200, "{b}");
            let worker = h["x-switchyard-worker"].to_str().unwrap().to_owned();
            (start.elapsed(), usage(&b).1, worker)
        }
    };
    let (first, _, holder) = timed().await;
    assert!(first >= std::time::Duration::from_millis(390), "{first:?}");
    // The worker's KV events reach the frontend's index.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (second, cached, worker) = timed().await;
    assert!(
        second < std::time::Duration::from_millis(300),
        "{second:?}: encoded again"
    );
    assert_eq!(worker, holder, "not sent where the media's KV is");
    assert!(cached >= 576, "{cached} tokens cached");
    let text = scrape(&url(&d, "/metrics")).await;
    let count = |outcome: &str| encodes(&text, outcome);
    assert_eq!((count("encoded"), count("skipped")), (1.0, 1.0), "{text}");
    // The second request's reservation of the image, not encoded, left the store.
    assert_eq!(store_bytes(&text), 0.0, "{text}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_prefills_its_text_on_its_worker_while_its_media_encode() {
    // A 1.5 s encoder, and a long text before the image: sent ahead of its media, the
    // request's text is in its worker's KV cache while the image is still being encoded;
    // sent after them, the worker has nothing yet.
    for overlap in [true, false] {
        let d = start(&[
            ("WORKERS__COUNT", "1"),
            ("FRONTEND__MULTIMODAL__ENCODERS", "1"),
            (
                "FRONTEND__MULTIMODAL__OVERLAP",
                if overlap { "true" } else { "false" },
            ),
            (
                "FRONTEND__MULTIMODAL__ENCODER_COST__IMAGE_BATCH_MS",
                "[[1, 1500.0], [2, 1600.0]]",
            ),
        ])
        .await;
        let text = "Describe the picture that follows, in detail. ".repeat(60);
        let body = with_image(&text, &data_url(&png(200, 150, 33)), None);
        let started = std::time::Instant::now();
        let ((s, _, b), mid) = tokio::join!(post(&d, "/v1/chat/completions", &body), async {
            tokio::time::sleep(std::time::Duration::from_millis(800)).await;
            scrape(&url(&d, "/metrics")).await
        });
        assert_eq!(s, 200, "{b}");
        // The first token waits for the media either way.
        assert!(started.elapsed() >= std::time::Duration::from_millis(1450));
        let usage_mid = metric_value(&mid, "switchyard_engine_kv_usage", None);
        if overlap {
            assert!(
                usage_mid > 0.0,
                "overlapped: nothing computed while encoding\n{mid}"
            );
        } else {
            assert_eq!(
                usage_mid, 0.0,
                "sequential: computed before the media were ready"
            );
        }
        d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
            .await
            .unwrap();
    }
}

/// Encoder workers with real models (a build with `--features encoders`, the models from
/// `scripts/test`): the squares and log-mel windows the frontend prepares reach them and
/// are encoded; windows the model cannot take are refused by the model, not timed.
#[cfg(feature = "encoders")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_encoder_workers_encode_what_the_frontend_prepared() {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| panic!("set {name} (scripts/test fetches it)"))
    };
    let (vision, runtime, whisper) = (
        var("SWITCHYARD_DINOV2_ONNX"),
        var("SWITCHYARD_ORT_DYLIB"),
        var("SWITCHYARD_WHISPER_CT2"),
    );
    let models = [
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__MULTIMODAL__ENCODERS", "1"),
        ("WORKERS__ENCODER__VISION", vision.as_str()),
        ("WORKERS__ENCODER__ONNXRUNTIME", runtime.as_str()),
        ("WORKERS__ENCODER__AUDIO", whisper.as_str()),
        ("WORKERS__ENCODER__THREADS", "1"),
    ];
    let d = start(&models).await;
    let image = with_image("What is this?", &data_url(&png(64, 64, 21)), None);
    let (s, _, b) = post(&d, "/v1/chat/completions", &image).await;
    assert_eq!(s, 200, "{b}");
    let audio = with_audio("Transcribe.", &audio_file("tone.flac"), "flac");
    let (s, _, b) = post(&d, "/v1/chat/completions", &audio).await;
    assert_eq!(s, 200, "{b}");

    // Whisper tiny takes 80 mel bins: a frontend preparing 128 gets its audio refused by
    // the model (a mock encoder would only have timed it), its images still encoded.
    let mut wide = models.to_vec();
    wide.push(("FRONTEND__MULTIMODAL__AUDIO__N_MELS", "128"));
    let w = start(&wide).await;
    let (s, _, b) = post(&w, "/v1/chat/completions", &audio).await;
    assert_eq!(s, 503, "{b}");
    let message = b["error"]["message"].as_str().unwrap();
    assert!(message.contains("80 mel bins"), "{message}");
    let other = with_image("What is this?", &data_url(&png(64, 64, 22)), None);
    let (s, _, b) = post(&w, "/v1/chat/completions", &other).await;
    assert_eq!(s, 200, "{b}");
    for d in [d, w] {
        d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_that_cannot_be_encoded_in_time_fails_or_falls_back_to_the_text_by_configuration() {
    // One encoder taking 2 s an image, against a 200 ms encode timeout.
    let slow = [
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__MULTIMODAL__ENCODERS", "1"),
        (
            "FRONTEND__MULTIMODAL__ENCODER_COST__IMAGE_BATCH_MS",
            "[[1, 2000.0], [2, 2500.0]]",
        ),
        ("FRONTEND__MULTIMODAL__ENCODE_TIMEOUT", "200ms"),
    ];
    let failing = start(&slow).await;
    let body = with_image("What is this?", &data_url(&png(64, 64, 31)), None);
    let started = std::time::Instant::now();
    let (s, headers, b) = post(&failing, "/v1/chat/completions", &body).await;
    assert_eq!(s, 503, "{b}");
    assert!(started.elapsed() < std::time::Duration::from_millis(1_500));
    let message = b["error"]["message"].as_str().unwrap();
    assert!(message.contains("200ms"), "{message}");
    assert!(headers.get("x-switchyard-warning").is_none());

    let mut text_only = slow.to_vec();
    text_only.push(("FRONTEND__MULTIMODAL__ON_ENCODER_FAILURE", "text_only"));
    let falling_back = start(&text_only).await;
    let (s, headers, b) = post(&falling_back, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{b}");
    let warning = headers["x-switchyard-warning"].to_str().unwrap();
    assert!(warning.contains("text alone"), "{warning}");
    // The image's 576 placeholder positions are gone from the prompt.
    let (prompt_tokens, _) = usage(&b);
    let plain = json!({
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}]}],
    });
    let (s, _, plain) = post(&falling_back, "/v1/chat/completions", &plain).await;
    assert_eq!(s, 200, "{plain}");
    assert!(prompt_tokens < 576, "{prompt_tokens} prompt tokens");
    assert_eq!(prompt_tokens, usage(&plain).0);
    let text = scrape(&url(&falling_back, "/metrics")).await;
    let count = |outcome: &str| encodes(&text, outcome);
    assert_eq!((count("timeout"), count("text_only")), (1.0, 1.0), "{text}");
    // Neither left anything in the feature store.
    for d in [&failing, &falling_back] {
        let text = scrape(&url(d, "/metrics")).await;
        assert_eq!(store_bytes(&text), 0.0, "{text}");
    }
    for d in [failing, falling_back] {
        d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_sending_its_image_again_skips_the_encoder_when_features_are_kept() {
    let encoder = [
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__MULTIMODAL__ENCODERS", "1"),
    ];
    let mut keep = encoder.to_vec();
    keep.push((
        "FRONTEND__MULTIMODAL__FEATURE_STORE__AFTER_PREFILL",
        "keep_cpu",
    ));
    let image = data_url(&png(64, 64, 41));
    // Two turns: other text before the same image, so its KV is not what makes it cheap.
    let first = with_image("Describe this.", &image, None);
    let second = with_image("Now, in one word: what colour is it?", &image, None);
    for (overrides, kept) in [(keep, true), (encoder.to_vec(), false)] {
        let d = start(&overrides).await;
        for body in [&first, &second] {
            let (s, _, b) = post(&d, "/v1/chat/completions", body).await;
            assert_eq!(s, 200, "{b}");
        }
        let text = scrape(&url(&d, "/metrics")).await;
        let value = |name: &str, labels: Option<&str>| metric_value(&text, name, labels);
        let jobs = value("switchyard_encoder_jobs_total", None);
        let hits = value("switchyard_feature_store_hits_total", None);
        let kept_bytes = value(
            "switchyard_feature_store_bytes",
            Some("state=\"encoded_cpu\""),
        );
        if kept {
            // 576 tokens × 8,192 bytes, encoded once and kept.
            assert_eq!((jobs, hits), (1.0, 1.0), "{text}");
            assert_eq!(kept_bytes, 576.0 * 8192.0, "{text}");
        } else {
            // Discarded after the first turn: encoded again, nothing left behind.
            assert_eq!((jobs, hits), (2.0, 0.0), "{text}");
            assert_eq!(kept_bytes, 0.0, "{text}");
        }
        d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sending_the_same_image_at_once_share_one_encoding() {
    for overlap in ["true", "false"] {
        let d = start(&[
            ("WORKERS__COUNT", "1"),
            ("FRONTEND__MULTIMODAL__ENCODERS", "1"),
            ("FRONTEND__MULTIMODAL__OVERLAP", overlap),
            // 300 ms an image: the second request arrives while the first's is encoded.
            (
                "FRONTEND__MULTIMODAL__ENCODER_COST__IMAGE_BATCH_MS",
                "[[1, 300.0], [2, 320.0]]",
            ),
        ])
        .await;
        let image = data_url(&png(64, 64, 81));
        let send = |text: &str| {
            let body = with_image(text, &image, None);
            let client = client();
            let target = url(&d, "/v1/chat/completions");
            tokio::spawn(async move { client.post(target).json(&body).send().await })
        };
        let first = send("Describe this.");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let second = send("What colour is it?");
        for request in [first, second] {
            let response = request.await.unwrap().unwrap();
            assert_eq!(response.status(), 200, "overlap {overlap}");
            let body: Value = response.json().await.unwrap();
            // Both prompts carry the image's 576 positions.
            assert!(usage(&body).0 > 576, "{body}");
        }
        let text = scrape(&url(&d, "/metrics")).await;
        let value = |name: &str| metric_value(&text, name, None);
        assert_eq!(
            (
                value("switchyard_encoder_jobs_total"),
                value("switchyard_feature_store_hits_total")
            ),
            (1.0, 1.0),
            "overlap {overlap}: encoded once, the second request waited for it: {text}"
        );
        assert_eq!(
            (encodes(&text, "encoded"), encodes(&text, "waited")),
            (1.0, 1.0),
            "overlap {overlap}: {text}"
        );
        assert_eq!(store_bytes(&text), 0.0, "overlap {overlap}: {text}");
        d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_an_encoding_that_fails_tries_itself_and_leaves_nothing_stored() {
    use switchyard_worker::faults::Fault;
    for overlap in ["true", "false"] {
        let d = start(&[
            ("WORKERS__COUNT", "1"),
            ("FRONTEND__MULTIMODAL__ENCODERS", "1"),
            ("FRONTEND__MULTIMODAL__OVERLAP", overlap),
            ("FRONTEND__MULTIMODAL__ON_ENCODER_FAILURE", "text_only"),
            (
                "FRONTEND__MULTIMODAL__ENCODER_COST__IMAGE_BATCH_MS",
                "[[1, 400.0], [2, 450.0]]",
            ),
        ])
        .await;
        let encoder = d.workers[1].worker_id();
        let image = data_url(&png(64, 64, 91));
        let send = |text: &str| {
            let body = with_image(text, &image, None);
            let client = client();
            let target = url(&d, "/v1/chat/completions");
            tokio::spawn(async move { client.post(target).json(&body).send().await })
        };
        let first = send("Describe this.");
        while d.frontend.media.outstanding_ms(encoder) <= 0.0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        // The second request finds the image being encoded for the first and waits: no
        // job of its own goes to the encoder.
        let second = send("What colour is it?");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let jobs = |text: &str| metric_value(text, "switchyard_encoder_jobs_total", None);
        let before = scrape(&url(&d, "/metrics")).await;
        assert_eq!(jobs(&before), 1.0, "overlap {overlap}: {before}");
        // The only encoder dies in the middle of the job: the first request's encoding
        // fails, the second is told, tries itself, fails too; both answer from the text.
        inject(&d, encoder, Fault::Crash);
        for request in [first, second] {
            let response = request.await.unwrap().unwrap();
            assert_eq!(response.status(), 200, "overlap {overlap}");
            let warning = response.headers()["x-switchyard-warning"]
                .to_str()
                .unwrap()
                .to_owned();
            assert!(warning.contains("text alone"), "{warning}");
        }
        let text = scrape(&url(&d, "/metrics")).await;
        assert_eq!(store_bytes(&text), 0.0, "overlap {overlap}: {text}");
        assert_eq!(
            encodes(&text, "text_only"),
            2.0,
            "overlap {overlap}: {text}"
        );
        d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_encoders_and_bad_media_leave_nothing_in_the_feature_store() {
    use switchyard_worker::faults::Fault;
    // Every path checks the store is empty right after it, with the request sent ahead of
    // its media and after them.
    for overlap in ["true", "false"] {
        let d = start(&[
            ("WORKERS__COUNT", "1"),
            ("FRONTEND__MULTIMODAL__ENCODERS", "2"),
            ("FRONTEND__MULTIMODAL__OVERLAP", overlap),
            // 400 ms an image: long enough to kill an encoder in the middle of one.
            (
                "FRONTEND__MULTIMODAL__ENCODER_COST__IMAGE_BATCH_MS",
                "[[1, 400.0], [2, 500.0]]",
            ),
        ])
        .await;
        let encoders: Vec<_> = d.workers[1..].iter().map(|w| w.worker_id()).collect();
        assert_eq!(encoders.len(), 2);
        let image = |seed| with_image("What is this?", &data_url(&png(64, 64, seed)), None);
        let empty = |text: &str, path: &str| {
            assert_eq!(store_bytes(text), 0.0, "overlap {overlap}, {path}: {text}");
        };
        // Undecodable media: refused before anything is stored.
        let corrupt = with_image(
            "What is this?",
            "data:image/png;base64,iVBORw0KGgoAAAA",
            None,
        );
        let (s, _, b) = post(&d, "/v1/chat/completions", &corrupt).await;
        assert_eq!(s, 400, "{b}");
        empty(&scrape(&url(&d, "/metrics")).await, "corrupt");
        // An encoder killed in the middle of the job: the job goes to the other.
        let request = {
            let body = image(51);
            let client = client();
            let target = url(&d, "/v1/chat/completions");
            tokio::spawn(async move { client.post(target).json(&body).send().await })
        };
        let busy = loop {
            if let Some(&id) = encoders
                .iter()
                .find(|&&id| d.frontend.media.outstanding_ms(id) > 0.0)
            {
                break id;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        };
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        inject(&d, busy, Fault::Crash);
        let response = request.await.unwrap().unwrap();
        assert_eq!(response.status(), 200, "overlap {overlap}");
        let text = scrape(&url(&d, "/metrics")).await;
        empty(&text, "killed mid-job");
        // The killed job, then the other encoder's.
        assert_eq!(
            metric_value(&text, "switchyard_encoder_jobs_total", None),
            2.0,
            "{text}"
        );
        // Both: the request fails, saying why.
        let other = encoders.iter().copied().find(|&id| id != busy).unwrap();
        inject(&d, other, Fault::Crash);
        let (s, _, b) = post(&d, "/v1/chat/completions", &image(52)).await;
        assert_eq!(s, 503, "{b}");
        let message = b["error"]["message"].as_str().unwrap();
        assert!(message.contains("encoder"), "{message}");
        let text = scrape(&url(&d, "/metrics")).await;
        empty(&text, "no encoder left");
        let count = |outcome: &str| encodes(&text, outcome);
        assert_eq!((count("encoded"), count("failed")), (1.0, 1.0), "{text}");
        d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoder_error_falls_back_to_the_text_with_a_warning_and_leaves_nothing_stored() {
    use switchyard_worker::faults::Fault;
    for overlap in ["true", "false"] {
        let d = start(&[
            ("WORKERS__COUNT", "1"),
            ("FRONTEND__MULTIMODAL__ENCODERS", "1"),
            ("FRONTEND__MULTIMODAL__OVERLAP", overlap),
            ("FRONTEND__MULTIMODAL__ON_ENCODER_FAILURE", "text_only"),
        ])
        .await;
        // The encoder refuses every job: an error, not a timeout.
        inject(&d, d.workers[1].worker_id(), Fault::Refuse);
        let body = with_image("What is this?", &data_url(&png(64, 64, 71)), None);
        let (s, headers, b) = post(&d, "/v1/chat/completions", &body).await;
        assert_eq!(s, 200, "overlap {overlap}: {b}");
        let warning = headers["x-switchyard-warning"].to_str().unwrap();
        assert!(warning.contains("text alone"), "{warning}");
        // Answered from the text: the image's 576 positions are not in the prompt.
        assert!(usage(&b).0 < 576, "{b}");
        let text = scrape(&url(&d, "/metrics")).await;
        assert_eq!(store_bytes(&text), 0.0, "overlap {overlap}: {text}");
        assert_eq!(encodes(&text, "text_only"), 1.0, "{text}");
        d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_mixed_load_the_feature_store_keeps_its_budgets_and_every_request_completes() {
    // An image is 576 tokens × 8,192 bytes = 4.5 MiB: the CPU budget holds three, staging
    // one, and the engines run at a quarter of the model's speed, so encoded items wait for
    // staging while another is prefilled (and, kept after prefill, items are evicted for
    // new ones).
    for (overlap, after_prefill) in [("true", "keep_cpu"), ("false", "discard")] {
        let d = start(&[
            ("WORKERS__COUNT", "2"),
            ("WORKERS__MOCKER__SPEEDUP_RATIO", "0.25"),
            ("FRONTEND__MULTIMODAL__ENCODERS", "2"),
            ("FRONTEND__MULTIMODAL__OVERLAP", overlap),
            ("FRONTEND__MULTIMODAL__FEATURE_STORE__CPU_MIB", "14"),
            ("FRONTEND__MULTIMODAL__FEATURE_STORE__STAGING_MIB", "5"),
            (
                "FRONTEND__MULTIMODAL__FEATURE_STORE__AFTER_PREFILL",
                after_prefill,
            ),
        ])
        .await;
        let image = |seed: u8| with_image("Describe it.", &data_url(&png(64, 64, seed)), None);
        // Eight images (three sent twice) and six text requests, all at once.
        let mut bodies: Vec<Value> = [81u8, 82, 83, 84, 85, 81, 82, 83]
            .into_iter()
            .map(image)
            .collect();
        bodies.extend((0..6).map(|i| chat(MODEL, &format!("Plain question {i}"), 8)));
        let peaks = std::sync::Arc::new(parking_lot::Mutex::new((0f64, 0f64)));
        let stop = tokio_util::sync::CancellationToken::new();
        let watcher = {
            let (peaks, stop, metrics) = (peaks.clone(), stop.clone(), url(&d, "/metrics"));
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    let text = scrape(&metrics).await;
                    let state = |s: &str| {
                        metric_value(
                            &text,
                            "switchyard_feature_store_bytes",
                            Some(&format!("state=\"{s}\"")),
                        )
                    };
                    let (cpu, staging) = (store_bytes(&text), state("staged") + state("merged"));
                    {
                        let mut p = peaks.lock();
                        p.0 = p.0.max(cpu);
                        p.1 = p.1.max(staging);
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            })
        };
        let requests = bodies.into_iter().map(|body| {
            let client = client();
            let target = url(&d, "/v1/chat/completions");
            async move {
                let response = client.post(target).json(&body).send().await.unwrap();
                let status = response.status().as_u16();
                (status, response.text().await.unwrap())
            }
        });
        for (status, body) in futures::future::join_all(requests).await {
            assert_eq!(status, 200, "overlap {overlap}: {body}");
        }
        stop.cancel();
        watcher.await.unwrap();
        let (cpu_peak, staging_peak) = *peaks.lock();
        assert!(cpu_peak <= 14.0 * 1048576.0, "CPU peak {cpu_peak}");
        assert!(
            staging_peak <= 5.0 * 1048576.0,
            "staging peak {staging_peak}"
        );
        let text = scrape(&url(&d, "/metrics")).await;
        let media = media_lines(&text);
        // Staging one item at a time made requests wait for it.
        assert!(
            metric_value(
                &text,
                "switchyard_feature_store_waits_total",
                Some("memory=\"staging\"")
            ) >= 1.0,
            "{media}"
        );
        // Every image was encoded or found in the store: none waited out its time.
        for outcome in ["timeout", "text_only"] {
            assert_eq!(encodes(&text, outcome), 0.0, "{media}");
        }
        let left = store_bytes(&text);
        if after_prefill == "discard" {
            assert_eq!(left, 0.0, "{media}");
        } else {
            // Kept items only, within the budget, none staged any more.
            assert!(left > 0.0 && left <= 14.0 * 1048576.0, "{media}");
            assert!(
                metric_value(&text, "switchyard_feature_store_evictions_total", None) >= 1.0,
                "{media}"
            );
            for state in ["staged", "merged", "encoding"] {
                let label = format!("state=\"{state}\"");
                assert_eq!(
                    metric_value(&text, "switchyard_feature_store_bytes", Some(&label)),
                    0.0,
                    "{media}"
                );
            }
        }
        d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_an_encoder_has_no_memory_for_go_again_at_half_size() {
    // An encoder holding 300 tokens an item: an image of 576 (one 336-pixel square) is
    // encoded at half the resolution (144), whether the request goes ahead of its media or
    // waits for them; one holding 5 takes none, however small (3 halvings: 9 tokens).
    let image = with_image("What is this?", &data_url(&png(64, 64, 61)), None);
    let plain = json!({
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}]}],
    });
    for overlap in ["true", "false"] {
        let d = start(&[
            ("WORKERS__COUNT", "1"),
            ("FRONTEND__MULTIMODAL__ENCODERS", "1"),
            ("FRONTEND__MULTIMODAL__OVERLAP", overlap),
            ("WORKERS__ENCODER__MAX_ITEM_TOKENS", "300"),
        ])
        .await;
        let (s, headers, b) = post(&d, "/v1/chat/completions", &image).await;
        assert_eq!(s, 200, "{b}");
        let warning = headers["x-switchyard-warning"].to_str().unwrap();
        assert!(warning.contains("half size"), "{warning}");
        let (s, _, text) = post(&d, "/v1/chat/completions", &plain).await;
        assert_eq!(s, 200, "{text}");
        assert_eq!(usage(&b).0, usage(&text).0 + 144, "overlap {overlap}");
        let metrics = scrape(&url(&d, "/metrics")).await;
        let count = |outcome: &str| encodes(&metrics, outcome);
        assert_eq!(
            (count("encoded"), count("reduced")),
            (1.0, 1.0),
            "{metrics}"
        );
        // Two encoder runs: the image as sent, then halved.
        assert_eq!(
            metric_value(&metrics, "switchyard_encoder_jobs_total", None),
            2.0
        );
        assert_eq!(store_bytes(&metrics), 0.0, "{metrics}");
        d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
            .await
            .unwrap();
    }
    let d = start(&[
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__MULTIMODAL__ENCODERS", "1"),
        ("WORKERS__ENCODER__MAX_ITEM_TOKENS", "5"),
    ])
    .await;
    let (s, _, b) = post(&d, "/v1/chat/completions", &image).await;
    assert_eq!(s, 503, "{b}");
    let message = b["error"]["message"].as_str().unwrap();
    assert!(message.contains("out of memory"), "{message}");
    let metrics = scrape(&url(&d, "/metrics")).await;
    assert_eq!(
        metric_value(&metrics, "switchyard_encoder_jobs_total", None),
        4.0
    );
    assert_eq!(store_bytes(&metrics), 0.0, "{metrics}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

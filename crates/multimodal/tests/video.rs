//! Video preprocessing: frames picked by strategy and budget from GIF, MJPEG AVI and (with
//! the `h264` feature) MP4 files built here.

#![allow(clippy::unwrap_used)]

use std::io::Cursor;

use image::codecs::gif::GifEncoder;
use image::{Delay, Frame, ImageFormat, Rgb, RgbImage, RgbaImage};
use switchyard_multimodal::video::{FrameStrategy, VideoSettings, prepare_video};
use switchyard_multimodal::{ImageSettings, MediaError};

/// The grey level of frame `i` (distinct for up to 32 frames).
fn level(i: usize) -> u8 {
    (i * 8) as u8
}

/// An animated GIF of `n` 64×48 frames, 100 ms each; frame `i` is grey `shade(i)`.
fn gif(n: usize, shade: impl Fn(usize) -> u8) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut encoder = GifEncoder::new(&mut out);
        for i in 0..n {
            let g = shade(i);
            let frame = RgbaImage::from_pixel(64, 48, image::Rgba([g, g, g, 255]));
            encoder
                .encode_frame(Frame::from_parts(
                    frame,
                    0,
                    0,
                    Delay::from_numer_denom_ms(100, 1),
                ))
                .unwrap();
        }
    }
    out
}

/// A motion-JPEG AVI of `n` 64×48 frames at 25 fps; frame `i` is grey `level(i)`.
fn avi(n: usize) -> Vec<u8> {
    fn chunk(id: &[u8], data: &[u8]) -> Vec<u8> {
        let mut out = id.to_vec();
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
        if data.len() % 2 == 1 {
            out.push(0);
        }
        out
    }
    fn list(kind: &[u8], body: &[u8]) -> Vec<u8> {
        let mut data = kind.to_vec();
        data.extend_from_slice(body);
        chunk(b"LIST", &data)
    }
    let mut avih = 40_000u32.to_le_bytes().to_vec();
    avih.resize(56, 0);
    let mut movi = Vec::new();
    for i in 0..n {
        let g = level(i);
        let mut jpeg = Cursor::new(Vec::new());
        RgbImage::from_pixel(64, 48, Rgb([g, g, g]))
            .write_to(&mut jpeg, ImageFormat::Jpeg)
            .unwrap();
        movi.extend(chunk(b"00dc", &jpeg.into_inner()));
    }
    let mut body = b"AVI ".to_vec();
    body.extend(list(b"hdrl", &chunk(b"avih", &avih)));
    body.extend(list(b"movi", &movi));
    chunk(b"RIFF", &body)
}

/// The mean grey of a fitted square's picture (its middle row, away from letterboxing).
fn grey(square: &[u8], side: usize) -> f64 {
    let row = &square[side / 2 * side * 3..(side / 2 + 1) * side * 3];
    let middle = &row[side / 4 * 3..side * 3 / 4 * 3];
    middle.iter().map(|v| f64::from(*v)).sum::<f64>() / middle.len() as f64
}

fn close(times: &[f64], want: &[f64]) {
    assert_eq!(times.len(), want.len(), "{times:?}");
    for (t, w) in times.iter().zip(want) {
        assert!((t - w).abs() < 1e-9, "{times:?} against {want:?}");
    }
}

fn settings(strategy: FrameStrategy, max_frames: u32) -> VideoSettings {
    VideoSettings {
        strategy,
        max_frames,
        ..VideoSettings::default()
    }
}

#[test]
fn uniform_fps_and_keyframe_pick_the_expected_frames_of_a_gif() {
    let image = ImageSettings::default();
    let video = gif(20, level);
    let uniform = prepare_video(
        &video,
        &image,
        &settings(FrameStrategy::Uniform, 4),
        100_000,
        None,
    )
    .unwrap();
    assert_eq!(uniform.format, "gif");
    assert_eq!(
        (uniform.width, uniform.height, uniform.source_frames),
        (64, 48, 20)
    );
    assert!((uniform.seconds - 2.0).abs() < 1e-9);
    close(&uniform.times, &[0.2, 0.7, 1.2, 1.7]);
    assert_eq!(uniform.tokens, 4 * 144);
    for (square, i) in uniform.squares.iter().zip([2, 7, 12, 17]) {
        assert!((grey(square, 336) - f64::from(level(i))).abs() < 2.0);
    }

    // 2 frames a second of a 10 fps GIF: frames 0, 5, 10, 15.
    let fps = prepare_video(
        &video,
        &image,
        &settings(FrameStrategy::Fps, 32),
        100_000,
        None,
    )
    .unwrap();
    assert_eq!(fps.times.len(), 4);
    assert!((fps.times[1] - 0.5).abs() < 1e-9, "{:?}", fps.times);

    // Two scenes: the keyframes are the first frame of each.
    let scenes = gif(20, |i| if i < 10 { 30 } else { 200 });
    let keyframes = prepare_video(
        &scenes,
        &image,
        &settings(FrameStrategy::Keyframe, 32),
        100_000,
        None,
    )
    .unwrap();
    close(&keyframes.times, &[0.0, 1.0]);
    // Only one may be kept: the first (nothing before it to compare) stays.
    let one = prepare_video(
        &scenes,
        &image,
        &settings(FrameStrategy::Keyframe, 1),
        100_000,
        None,
    )
    .unwrap();
    assert_eq!(one.times, [0.0]);
}

#[test]
fn the_token_budget_and_the_requests_room_pick_the_frame_count() {
    let image = ImageSettings::default();
    let video = gif(20, level);
    let all = settings(FrameStrategy::Uniform, 32);
    assert_eq!(
        prepare_video(&video, &image, &all, 100_000, None)
            .unwrap()
            .tokens,
        20 * 144
    );
    // Room for 3 frames of 144 tokens.
    let tight = prepare_video(&video, &image, &all, 3 * 144 + 100, None).unwrap();
    assert_eq!(tight.squares.len(), 3);
    assert_eq!(tight.tokens, 3 * 144);
    // Two frames pooled in time take one frame's tokens.
    let pooled = VideoSettings {
        temporal_pool: 2,
        ..all
    };
    let p = prepare_video(&video, &image, &pooled, 3 * 144 + 100, None).unwrap();
    assert_eq!((p.squares.len(), p.tokens), (6, 3 * 144));
    let e = prepare_video(&video, &image, &all, 100, None).unwrap_err();
    assert!(e.to_string().contains("room for 100"), "{e}");
}

#[test]
fn motion_jpeg_avi_frames_are_found_and_timed() {
    let image = ImageSettings::default();
    let prepared = prepare_video(
        &avi(10),
        &image,
        &settings(FrameStrategy::Uniform, 2),
        100_000,
        None,
    )
    .unwrap();
    assert_eq!(prepared.format, "avi");
    assert_eq!(prepared.source_frames, 10);
    assert!((prepared.seconds - 0.4).abs() < 1e-9);
    assert_eq!(prepared.times.len(), 2);
    for (square, i) in prepared.squares.iter().zip([2, 7]) {
        let g = grey(square, 336);
        assert!((g - f64::from(level(i))).abs() < 4.0, "frame {i}: {g}");
    }
}

#[test]
fn the_hash_covers_the_kept_frames_and_settings() {
    let image = ImageSettings::default();
    let video = gif(20, level);
    let four = settings(FrameStrategy::Uniform, 4);
    let a = prepare_video(&video, &image, &four, 100_000, None).unwrap();
    assert_eq!(
        a.hash,
        prepare_video(&video, &image, &four, 100_000, None)
            .unwrap()
            .hash
    );
    let five = settings(FrameStrategy::Uniform, 5);
    assert_ne!(
        a.hash,
        prepare_video(&video, &image, &five, 100_000, None)
            .unwrap()
            .hash
    );
    let other = gif(20, |i| level(i) + 1);
    assert_ne!(
        a.hash,
        prepare_video(&other, &image, &four, 100_000, None)
            .unwrap()
            .hash
    );
}

#[test]
fn bad_video_is_a_client_error() {
    let image = ImageSettings::default();
    let all = VideoSettings::default();
    let e = prepare_video(b"plain text, not a video", &image, &all, 100_000, None).unwrap_err();
    assert!(matches!(e, MediaError::UnknownFormat(_)), "{e:?}");
    let mut truncated = gif(20, level);
    truncated.truncate(40);
    let e = prepare_video(&truncated, &image, &all, 100_000, None).unwrap_err();
    assert!(e.is_client_error(), "{e:?}");
    let short = VideoSettings {
        max_seconds: 1.0,
        ..all
    };
    let e = prepare_video(&gif(20, level), &image, &short, 100_000, None).unwrap_err();
    assert!(e.to_string().contains("up to 1 s"), "{e}");
    let mut no_frames = avi(0);
    no_frames.truncate(no_frames.len());
    let e = prepare_video(&no_frames, &image, &all, 100_000, None).unwrap_err();
    assert!(e.to_string().contains("no JPEG frames"), "{e}");
}

#[cfg(feature = "h264")]
mod h264 {
    use super::*;
    use openh264::encoder::{Encoder, EncoderConfig};
    use openh264::formats::{RgbSliceU8, YUVBuffer};

    /// An MP4 of `n` 64×48 H.264 frames at 25 fps; frame `i` is grey `level(i)`.
    fn mp4(n: usize) -> Vec<u8> {
        let mut encoder =
            Encoder::with_api_config(openh264::OpenH264API::from_source(), EncoderConfig::new())
                .unwrap();
        let (mut sps, mut pps) = (Vec::new(), Vec::new());
        let mut samples = Vec::new();
        for i in 0..n {
            let g = level(i);
            let rgb = vec![g; 64 * 48 * 3];
            let yuv = YUVBuffer::from_rgb8_source(RgbSliceU8::new(&rgb, (64, 48)));
            let stream = encoder.encode(&yuv).unwrap().to_vec();
            let mut sample = Vec::new();
            for unit in openh264::nal_units(&stream) {
                let start = unit.iter().position(|b| *b == 1).unwrap() + 1;
                let end = unit.iter().rposition(|b| *b != 0).unwrap() + 1;
                let nal = &unit[start..end];
                match nal[0] & 0x1f {
                    7 => sps = nal.to_vec(),
                    8 => pps = nal.to_vec(),
                    _ => {
                        sample.extend_from_slice(&(nal.len() as u32).to_be_bytes());
                        sample.extend_from_slice(nal);
                    }
                }
            }
            samples.push(sample);
        }
        let config = mp4::Mp4Config {
            major_brand: "isom".parse().unwrap(),
            minor_version: 512,
            compatible_brands: vec!["isom".parse().unwrap(), "avc1".parse().unwrap()],
            timescale: 1_000,
        };
        let mut writer = mp4::Mp4Writer::write_start(Cursor::new(Vec::new()), &config).unwrap();
        writer
            .add_track(&mp4::TrackConfig {
                track_type: mp4::TrackType::Video,
                timescale: 1_000,
                language: "und".into(),
                media_conf: mp4::MediaConfig::AvcConfig(mp4::AvcConfig {
                    width: 64,
                    height: 48,
                    seq_param_set: sps,
                    pic_param_set: pps,
                }),
            })
            .unwrap();
        for (i, sample) in samples.into_iter().enumerate() {
            writer
                .write_sample(
                    1,
                    &mp4::Mp4Sample {
                        start_time: i as u64 * 40,
                        duration: 40,
                        rendering_offset: 0,
                        is_sync: i == 0,
                        bytes: bytes::Bytes::from(sample),
                    },
                )
                .unwrap();
        }
        writer.write_end().unwrap();
        writer.into_writer().into_inner()
    }

    #[test]
    fn mp4_h264_frames_decode_in_display_order() {
        let image = ImageSettings::default();
        let video = mp4(30);
        let prepared = prepare_video(
            &video,
            &image,
            &settings(FrameStrategy::Uniform, 3),
            100_000,
            None,
        )
        .unwrap();
        assert_eq!(prepared.format, "mp4");
        assert_eq!((prepared.width, prepared.height), (64, 48));
        assert_eq!(prepared.source_frames, 30);
        assert!(
            (prepared.seconds - 1.2).abs() < 0.05,
            "{}",
            prepared.seconds
        );
        // Frames 5, 15 and 25.
        for (square, i) in prepared.squares.iter().zip([5, 15, 25]) {
            let g = grey(square, 336);
            assert!((g - f64::from(level(i))).abs() < 6.0, "frame {i}: {g}");
        }
        let mut cut = video.clone();
        cut.truncate(video.len() / 2);
        let e = prepare_video(&cut, &image, &VideoSettings::default(), 100_000, None).unwrap_err();
        assert!(e.is_client_error(), "{e:?}");
    }

    /// A file from ffmpeg with libx264, High profile, CABAC and two B-frames (the kind of
    /// MP4 clients send): `tests/data/ramp-high-bframes.mp4`, 30 frames at 10 fps whose
    /// luma is 8 × the frame number, made with
    /// `ffmpeg -f lavfi -i "color=black:size=64x48:rate=10:duration=3,format=yuv420p,geq=lum='N*8':cb=128:cr=128" -c:v libx264 -profile:v high -bf 2 -g 15 -crf 18`.
    #[test]
    fn b_frames_from_libx264_come_out_in_display_order() {
        let image = ImageSettings::default();
        let video = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/ramp-high-bframes.mp4"
        ))
        .unwrap();
        let prepared = prepare_video(
            &video,
            &image,
            &settings(FrameStrategy::Uniform, 6),
            100_000,
            None,
        )
        .unwrap();
        assert_eq!(prepared.source_frames, 30);
        assert!(
            (prepared.seconds - 3.0).abs() < 0.05,
            "{}",
            prepared.seconds
        );
        // Frames 2, 7, 12, 17, 22, 27; video-range luma to RGB: 1.164 × (Y − 16).
        for (square, i) in prepared.squares.iter().zip([2, 7, 12, 17, 22, 27]) {
            let want = (1.164 * (8.0 * f64::from(i) - 16.0)).clamp(0.0, 255.0);
            let g = grey(square, 336);
            assert!((g - want).abs() < 6.0, "frame {i}: {g}, not {want}");
        }
    }
}

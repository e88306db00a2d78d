//! Audio preprocessing against reference values and real encoded files.

#![allow(clippy::unwrap_used)]

use std::f64::consts::PI;

use switchyard_multimodal::MediaError;
use switchyard_multimodal::audio::{AudioSettings, LogMel, decode, mel_filters, prepare_audio};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");

/// The signal `make_mel_reference.py` uses.
fn reference_signal(len: usize) -> Vec<f32> {
    (0..len)
        .map(|n| {
            let t = n as f64 / 16_000.0;
            (0.5 * (2.0 * PI * 440.0 * t).sin()
                + 0.25 * (2.0 * PI * 3_000.0 * t + 0.3).sin()
                + 0.1 * (2.0 * PI * (100.0 * t + 800.0 * t * t)).sin()) as f32
        })
        .collect()
}

#[test]
fn log_mel_matches_the_reference_computed_with_librosa() {
    let text = std::fs::read_to_string(format!("{DATA}/mel_reference.json")).unwrap();
    let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
    let signal = reference_signal(reference["signal_len"].as_u64().unwrap() as usize);
    for case in reference["cases"].as_array().unwrap() {
        let n_mels = case["n_mels"].as_u64().unwrap() as usize;
        let filters = mel_filters(16_000, 400, n_mels);
        for (row, expected) in case["filter_rows"].as_object().unwrap() {
            let row: usize = row.parse().unwrap();
            for (bin, want) in expected.as_array().unwrap().iter().enumerate() {
                let got = filters[row * 201 + bin];
                let want = want.as_f64().unwrap() as f32;
                assert!(
                    (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                    "{n_mels} mels, filter {row} bin {bin}: {got} against {want}"
                );
            }
        }
        let mel = LogMel::new(16_000, n_mels);
        let spectrogram = mel.compute(&signal);
        let frames = case["frames"].as_u64().unwrap() as usize;
        assert_eq!(spectrogram.len(), n_mels * frames);
        let mut worst = 0.0f32;
        for (frame, expected) in case["spectrogram_frames"].as_object().unwrap() {
            let frame: usize = frame.parse().unwrap();
            for (band, want) in expected.as_array().unwrap().iter().enumerate() {
                let got = spectrogram[band * frames + frame];
                worst = worst.max((got - want.as_f64().unwrap() as f32).abs());
            }
        }
        // f32 FFT against librosa's f64: log-scaled values agree to about 1e-5.
        assert!(worst < 5e-5, "{n_mels} mels: off by {worst}");
    }
}

/// A 16-bit PCM WAV of `channels` channels at `rate` Hz: a 440 Hz sine.
fn wav(rate: u32, channels: u16, seconds: f64) -> Vec<u8> {
    let frames = (f64::from(rate) * seconds) as u32;
    let data_len = frames * u32::from(channels) * 2;
    let mut out = Vec::new();
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&channels.to_le_bytes());
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * u32::from(channels) * 2).to_le_bytes());
    out.extend_from_slice(&(channels * 2).to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for n in 0..frames {
        let v = (0.4 * (2.0 * PI * 440.0 * f64::from(n) / f64::from(rate)).sin() * 32_767.0) as i16;
        for c in 0..channels {
            // The second channel is silent, so mixing to mono halves the amplitude.
            let v = if c == 0 { v } else { 0 };
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// Zero crossings per second of `samples` at `rate`: twice the frequency of a sine.
fn crossings_per_second(samples: &[f32], rate: f64) -> f64 {
    let crossings = samples
        .windows(2)
        .filter(|w| (w[0] < 0.0) != (w[1] < 0.0))
        .count();
    crossings as f64 * rate / samples.len() as f64
}

#[test]
fn wav_is_mixed_to_mono_resampled_and_windowed() {
    let settings = AudioSettings::default();
    let mel = LogMel::new(settings.sample_rate, settings.n_mels as usize);
    let prepared = prepare_audio(&wav(44_100, 2, 2.0), "wav", &settings, &mel).unwrap();
    assert_eq!(prepared.format, "wav");
    assert_eq!((prepared.source_rate, prepared.channels), (44_100, 2));
    assert!(
        (prepared.seconds - 2.0).abs() < 0.01,
        "{}",
        prepared.seconds
    );
    // One padded 30 s window: 1,500 tokens, 80 × 3,000 values.
    assert_eq!(prepared.tokens, 1_500);
    assert_eq!(prepared.mels.len(), 1);
    assert_eq!(prepared.mels[0].len(), 80 * 3_000);

    let decoded = decode(&wav(44_100, 2, 2.0), "wav", 600.0).unwrap();
    let peak = decoded.samples.iter().fold(0.0f32, |m, s| m.max(s.abs()));
    assert!((peak - 0.2).abs() < 0.01, "mono mix peak {peak}");
    let resampled =
        switchyard_multimodal::audio::resample(&decoded.samples, 44_100, 16_000).unwrap();
    assert!(
        (resampled.len() as i64 - 32_000).abs() <= 2,
        "{}",
        resampled.len()
    );
    let hz = crossings_per_second(&resampled, 16_000.0) / 2.0;
    assert!((hz - 440.0).abs() < 2.0, "the tone moved to {hz} Hz");

    let proportional = AudioSettings {
        pad_chunks: false,
        ..settings
    };
    let short = prepare_audio(&wav(16_000, 1, 2.0), "wav", &proportional, &mel).unwrap();
    assert_eq!(short.tokens, 100);
    assert_eq!(short.mels[0].len(), 80 * 200);
}

#[test]
fn flac_ogg_and_mp3_decode_to_the_same_tone() {
    let settings = AudioSettings::default();
    let mel = LogMel::new(settings.sample_rate, settings.n_mels as usize);
    for format in ["flac", "ogg", "mp3"] {
        let bytes = std::fs::read(format!("{DATA}/tone.{format}")).unwrap();
        let prepared = prepare_audio(&bytes, format, &settings, &mel)
            .unwrap_or_else(|e| panic!("{format}: {e}"));
        assert_eq!(prepared.source_rate, 44_100, "{format}");
        assert_eq!(prepared.channels, 2, "{format}");
        // MP3 frames add encoder delay and padding; the others are exact.
        assert!(
            (prepared.seconds - 1.5).abs() < 0.1,
            "{format}: {} s",
            prepared.seconds
        );
        let decoded = decode(&bytes, format, 600.0).unwrap();
        let hz = crossings_per_second(&decoded.samples, 44_100.0) / 2.0;
        assert!((hz - 440.0).abs() < 5.0, "{format}: {hz} Hz");
    }
}

#[test]
fn the_hash_covers_samples_and_settings() {
    let settings = AudioSettings::default();
    let mel = LogMel::new(16_000, 80);
    let a = prepare_audio(&wav(16_000, 1, 1.0), "wav", &settings, &mel).unwrap();
    let again = prepare_audio(&wav(16_000, 1, 1.0), "wav", &settings, &mel).unwrap();
    assert_eq!(a.hash, again.hash);
    let longer = prepare_audio(&wav(16_000, 1, 1.5), "wav", &settings, &mel).unwrap();
    assert_ne!(a.hash, longer.hash);
    let other = AudioSettings {
        tokens_per_chunk: 750,
        ..settings
    };
    let b = prepare_audio(&wav(16_000, 1, 1.0), "wav", &other, &mel).unwrap();
    assert_ne!(a.hash, b.hash);
    assert_eq!(b.tokens, 750);
}

#[test]
fn bad_audio_is_a_client_error_naming_the_problem() {
    let settings = AudioSettings::default();
    let mel = LogMel::new(16_000, 80);
    let garbage = prepare_audio(b"not audio at all, just text", "wav", &settings, &mel);
    assert!(
        matches!(garbage, Err(MediaError::UnknownFormat(_))),
        "{garbage:?}"
    );

    let mut truncated = wav(16_000, 1, 1.0);
    truncated.truncate(30);
    let e = prepare_audio(&truncated, "wav", &settings, &mel).unwrap_err();
    assert!(e.is_client_error(), "{e:?}");

    let e = prepare_audio(&wav(16_000, 1, 1.0), "aiff", &settings, &mel).unwrap_err();
    assert!(e.to_string().contains("wav, mp3, flac, ogg"), "{e}");

    let short = AudioSettings {
        max_seconds: 0.5,
        ..settings
    };
    let e = prepare_audio(&wav(16_000, 1, 1.0), "wav", &short, &mel).unwrap_err();
    assert!(e.to_string().contains("longer than 0.5 s"), "{e}");

    let small = AudioSettings {
        max_bytes: 100,
        ..settings
    };
    let e = prepare_audio(&wav(16_000, 1, 1.0), "wav", &small, &mel).unwrap_err();
    assert!(matches!(e, MediaError::TooLarge { .. }), "{e:?}");
}

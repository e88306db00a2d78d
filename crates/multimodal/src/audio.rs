//! Audio to encoder tokens: decode (WAV, MP3, FLAC, Ogg Vorbis), mix to mono, resample to
//! the encoder's rate, compute Whisper's log-mel spectrogram per chunk, count the tokens and
//! hash the samples with the settings.

use std::io::Cursor;
use std::sync::Arc;

use audioadapter_buffers::direct::SequentialSlice;
use realfft::{RealFftPlanner, RealToComplex};
use rubato::{Fft, FixedSync, Resampler};
use serde::{Deserialize, Serialize};
use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use thiserror::Error;
use xxhash_rust::xxh3::Xxh3;

use crate::MediaError;

/// How audio becomes tokens for an audio encoder (defaults: Whisper's, 16 kHz, 80 mel bins,
/// 30 s windows of 1,500 tokens, each started window padded to a full one).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AudioSettings {
    /// The encoder's sample rate, in Hz.
    pub sample_rate: u32,
    /// Mel bins (Whisper: 80; large-v3: 128).
    pub n_mels: u32,
    /// The encoder's window, in seconds.
    pub chunk_seconds: u32,
    /// Tokens one full window becomes.
    pub tokens_per_chunk: u32,
    /// Pad the last window to a full one (Whisper: every window is 30 s); off: the last
    /// window's tokens are in proportion to its length.
    pub pad_chunks: bool,
    /// Longest audio accepted, in seconds.
    pub max_seconds: f64,
    /// Largest encoded audio accepted, in bytes.
    pub max_bytes: usize,
}

impl Default for AudioSettings {
    fn default() -> Self {
        AudioSettings {
            sample_rate: 16_000,
            n_mels: 80,
            chunk_seconds: 30,
            tokens_per_chunk: 1_500,
            pad_chunks: true,
            max_seconds: 600.0,
            max_bytes: 20 << 20,
        }
    }
}

/// Whisper's transform: a 400-sample FFT every 160 samples (25 ms every 10 ms at 16 kHz).
pub const N_FFT: usize = 400;
pub const HOP: usize = 160;

/// The first of the [`AudioSettings`] that cannot work.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum AudioSettingsError {
    #[error("sample_rate ({0}) must be 4000 to 48000 Hz")]
    SampleRate(u32),
    #[error("n_mels ({0}) must be 1 to 256")]
    NMels(u32),
    #[error("chunk_seconds ({0}) must be 1 to 600")]
    ChunkSeconds(u32),
    #[error("tokens_per_chunk must be positive")]
    TokensPerChunk,
    #[error("max_seconds ({0}) must be above 0 and at most 7200")]
    MaxSeconds(f64),
    #[error("max_bytes must be positive")]
    MaxBytes,
}

impl AudioSettings {
    /// Checks the settings, naming the first that cannot work.
    pub fn validate(&self) -> Result<(), AudioSettingsError> {
        if !(4_000..=48_000).contains(&self.sample_rate) {
            return Err(AudioSettingsError::SampleRate(self.sample_rate));
        }
        if !(1..=256).contains(&self.n_mels) {
            return Err(AudioSettingsError::NMels(self.n_mels));
        }
        if !(1..=600).contains(&self.chunk_seconds) {
            return Err(AudioSettingsError::ChunkSeconds(self.chunk_seconds));
        }
        if self.tokens_per_chunk == 0 {
            return Err(AudioSettingsError::TokensPerChunk);
        }
        if !(self.max_seconds.is_finite() && self.max_seconds > 0.0 && self.max_seconds <= 7_200.0)
        {
            return Err(AudioSettingsError::MaxSeconds(self.max_seconds));
        }
        if self.max_bytes == 0 {
            return Err(AudioSettingsError::MaxBytes);
        }
        Ok(())
    }

    /// Samples in one window at the encoder's rate.
    pub fn chunk_samples(&self) -> usize {
        self.sample_rate as usize * self.chunk_seconds as usize
    }

    /// Tokens for `samples` samples at the encoder's rate (at least one).
    pub fn tokens_for(&self, samples: usize) -> u32 {
        let chunk = self.chunk_samples();
        let full = samples / chunk;
        let rest = samples % chunk;
        let last = if rest == 0 {
            0
        } else if self.pad_chunks {
            u64::from(self.tokens_per_chunk)
        } else {
            (rest as u64 * u64::from(self.tokens_per_chunk)).div_ceil(chunk as u64)
        };
        let tokens = full as u64 * u64::from(self.tokens_per_chunk) + last;
        u32::try_from(tokens.max(1)).unwrap_or(u32::MAX)
    }
}

/// Audio ready for an audio encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedAudio {
    /// The container's name (`wav`, `mp3`, `flac`, `ogg`).
    pub format: &'static str,
    /// As decoded.
    pub source_rate: u32,
    pub channels: u32,
    pub seconds: f64,
    /// One log-mel spectrogram per window, `n_mels` rows of frames each (row-major).
    pub mels: Vec<Vec<f32>>,
    /// Placeholder tokens the audio takes in the prompt.
    pub tokens: u32,
    /// Content hash: the resampled samples and everything that shapes the tokens.
    pub hash: u64,
}

/// The formats a client may name (OpenAI's `input_audio.format` is `wav` or `mp3`).
pub const FORMATS: [&str; 4] = ["wav", "mp3", "flac", "ogg"];

/// Decodes and prepares audio in `format` (one of [`FORMATS`]; the bytes are probed, the
/// name is a hint). CPU-bound (a few to tens of milliseconds a minute of audio): call it off
/// the async threads.
pub fn prepare_audio(
    bytes: &[u8],
    format: &str,
    settings: &AudioSettings,
    mel: &LogMel,
) -> Result<PreparedAudio, MediaError> {
    if bytes.len() > settings.max_bytes {
        return Err(MediaError::TooLarge {
            bytes: bytes.len() as u64,
            limit: settings.max_bytes as u64,
        });
    }
    let Some(format) = FORMATS.iter().copied().find(|f| *f == format) else {
        return Err(MediaError::UnknownFormat(format!(
            "audio format must be one of {}, not `{}`",
            FORMATS.join(", "),
            crate::cap(format)
        )));
    };
    let decoded = decode(bytes, format, settings.max_seconds)?;
    let samples = resample(&decoded.samples, decoded.rate, settings.sample_rate)?;
    if samples.is_empty() {
        return Err(MediaError::Undecodable("the audio has no samples".into()));
    }
    let chunk = settings.chunk_samples();
    let mels = samples
        .chunks(chunk)
        .map(|window| {
            if settings.pad_chunks && window.len() < chunk {
                let mut padded = window.to_vec();
                padded.resize(chunk, 0.0);
                mel.compute(&padded)
            } else {
                mel.compute(window)
            }
        })
        .collect();
    let mut hasher = Xxh3::new();
    hasher.update(b"audio");
    hasher.update(&settings.sample_rate.to_le_bytes());
    hasher.update(&settings.n_mels.to_le_bytes());
    hasher.update(&settings.chunk_seconds.to_le_bytes());
    hasher.update(&settings.tokens_per_chunk.to_le_bytes());
    hasher.update(&[u8::from(settings.pad_chunks)]);
    for s in &samples {
        hasher.update(&s.to_le_bytes());
    }
    Ok(PreparedAudio {
        format,
        source_rate: decoded.rate,
        channels: decoded.channels,
        seconds: samples.len() as f64 / f64::from(settings.sample_rate),
        mels,
        tokens: settings.tokens_for(samples.len()),
        hash: hasher.digest(),
    })
}

/// Mono samples at the source's rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub samples: Vec<f32>,
    pub rate: u32,
    pub channels: u32,
}

/// Decodes the default audio track to mono (channels averaged), refusing audio longer than
/// `max_seconds` as soon as the decoder passes it.
pub fn decode(bytes: &[u8], hint: &str, max_seconds: f64) -> Result<Decoded, MediaError> {
    let undecodable = |e: SymphoniaError| MediaError::Undecodable(format!("the audio: {e}"));
    let stream = MediaSourceStream::new(Box::new(Cursor::new(bytes)), Default::default());
    let mut probe_hint = Hint::new();
    probe_hint.with_extension(hint);
    let mut reader = symphonia::default::get_probe()
        .probe(
            &probe_hint,
            stream,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .map_err(|e| match e {
            SymphoniaError::Unsupported(_) => MediaError::UnknownFormat(format!(
                "the audio is not {}, or is corrupt",
                FORMATS.join(", ")
            )),
            other => undecodable(other),
        })?;
    let track = reader
        .default_track(TrackType::Audio)
        .ok_or_else(|| MediaError::Undecodable("the file has no audio track".into()))?;
    let track_id = track.id;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .ok_or_else(|| MediaError::Undecodable("the audio track has no codec parameters".into()))?
        .clone();
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default())
        .map_err(|e| MediaError::UnknownFormat(format!("the audio's codec: {e}")))?;
    let mut mono = Vec::new();
    let mut rate = params.sample_rate.unwrap_or(0);
    let mut channels = 0u32;
    let mut interleaved: Vec<f32> = Vec::new();
    let mut corrupt = 0usize;
    loop {
        let packet = match reader.next_packet() {
            Ok(Some(packet)) => packet,
            Ok(None) => break,
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break;
            }
            Err(e) => return Err(undecodable(e)),
        };
        if packet.track_id != track_id {
            continue;
        }
        let buffer = match decoder.decode(&packet) {
            Ok(buffer) => buffer,
            // A damaged packet is skipped, as players do; a stream of them is refused.
            Err(SymphoniaError::DecodeError(_)) if corrupt < 16 => {
                corrupt += 1;
                continue;
            }
            Err(e) => return Err(undecodable(e)),
        };
        let spec = buffer.spec();
        rate = spec.rate();
        channels = spec.channels().count().max(1) as u32;
        if rate == 0 {
            return Err(MediaError::Undecodable(
                "the audio has a sample rate of 0".into(),
            ));
        }
        buffer.copy_to_vec_interleaved(&mut interleaved);
        let n = channels as usize;
        mono.extend(
            interleaved
                .chunks_exact(n)
                .map(|frame| frame.iter().sum::<f32>() / n as f32),
        );
        if mono.len() as f64 > max_seconds * f64::from(rate) {
            return Err(MediaError::BadSetting(format!(
                "the audio is longer than {max_seconds} s"
            )));
        }
    }
    if rate == 0 || mono.is_empty() {
        return Err(MediaError::Undecodable("the audio has no samples".into()));
    }
    Ok(Decoded {
        samples: mono,
        rate,
        channels,
    })
}

/// Resamples mono audio from `from` Hz to `to` Hz (band-limited, FFT-based).
pub fn resample(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>, MediaError> {
    if from == to || samples.is_empty() {
        return Ok(samples.to_vec());
    }
    let internal = |e: &dyn std::fmt::Display| MediaError::Internal(format!("resampling: {e}"));
    let mut resampler = Fft::<f32>::new(from as usize, to as usize, 1_024, 1, FixedSync::Input)
        .map_err(|e| internal(&e))?;
    let input = SequentialSlice::new(samples, 1, samples.len()).map_err(|e| internal(&e))?;
    let mut out = vec![0.0; resampler.process_all_needed_output_len(samples.len())];
    let frames = out.len();
    let mut output = SequentialSlice::new_mut(&mut out, 1, frames).map_err(|e| internal(&e))?;
    let (_, produced) = resampler
        .process_all_into_buffer(&input, &mut output, samples.len(), None)
        .map_err(|e| internal(&e))?;
    out.truncate(produced);
    Ok(out)
}

/// Whisper's log-mel spectrogram: periodic Hann window, reflect-padded centred STFT
/// ([`N_FFT`], [`HOP`]) without its last frame, power through a Slaney mel filterbank,
/// `log10` clamped at 1e-10 and to 8 below the maximum, then `(x + 4) / 4`.
#[derive(Clone)]
pub struct LogMel {
    n_mels: usize,
    window: Vec<f32>,
    /// Per mel band: the first FFT bin it weighs and its weights.
    bands: Vec<(usize, Vec<f32>)>,
    fft: Arc<dyn RealToComplex<f32>>,
}

impl std::fmt::Debug for LogMel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogMel")
            .field("n_mels", &self.n_mels)
            .finish_non_exhaustive()
    }
}

impl LogMel {
    pub fn new(sample_rate: u32, n_mels: usize) -> LogMel {
        let window = (0..N_FFT)
            .map(|n| {
                (0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / N_FFT as f64).cos()) as f32
            })
            .collect();
        let filters = mel_filters(sample_rate, N_FFT, n_mels);
        let bins = N_FFT / 2 + 1;
        let bands = filters
            .chunks(bins)
            .map(|row| {
                let first = row.iter().position(|w| *w != 0.0).unwrap_or(0);
                let last = row.iter().rposition(|w| *w != 0.0).map_or(first, |l| l + 1);
                (first, row[first..last].to_vec())
            })
            .collect();
        LogMel {
            n_mels,
            window,
            bands,
            fft: RealFftPlanner::<f32>::new().plan_fft_forward(N_FFT),
        }
    }

    pub fn n_mels(&self) -> usize {
        self.n_mels
    }

    /// Frames for `samples` samples.
    pub fn frames(samples: usize) -> usize {
        samples / HOP
    }

    /// The spectrogram of `samples`: `n_mels` rows of [`LogMel::frames`] values.
    pub fn compute(&self, samples: &[f32]) -> Vec<f32> {
        let frames = Self::frames(samples.len());
        let mut out = vec![0.0f32; self.n_mels * frames];
        if frames == 0 {
            return out;
        }
        let half = N_FFT / 2;
        // Reflection about the ends (numpy's `reflect`: the edge sample is not repeated);
        // a signal too short to reflect is extended with zeros.
        let n = samples.len() as isize;
        let at = |i: isize| -> f32 {
            let j = if i < 0 {
                -i
            } else if i >= n {
                2 * (n - 1) - i
            } else {
                i
            };
            if (0..n).contains(&j) {
                samples[j as usize]
            } else {
                0.0
            }
        };
        let mut input = self.fft.make_input_vec();
        let mut spectrum = self.fft.make_output_vec();
        let mut scratch = self.fft.make_scratch_vec();
        let mut power = vec![0.0f32; spectrum.len()];
        let mut max = f32::NEG_INFINITY;
        for frame in 0..frames {
            let start = (frame * HOP) as isize - half as isize;
            let inside = start >= 0 && start + N_FFT as isize <= n;
            for (k, x) in input.iter_mut().enumerate() {
                let sample = if inside {
                    samples[start as usize + k]
                } else {
                    at(start + k as isize)
                };
                *x = sample * self.window[k];
            }
            self.fft
                .process_with_scratch(&mut input, &mut spectrum, &mut scratch)
                .expect("buffers made by the plan");
            for (p, c) in power.iter_mut().zip(&spectrum) {
                *p = c.norm_sqr();
            }
            for (band, (first, weights)) in self.bands.iter().enumerate() {
                let energy: f32 = weights
                    .iter()
                    .zip(&power[*first..])
                    .map(|(w, p)| w * p)
                    .sum();
                let value = energy.max(1e-10).log10();
                max = max.max(value);
                out[band * frames + frame] = value;
            }
        }
        let floor = max - 8.0;
        for value in &mut out {
            *value = (value.max(floor) + 4.0) / 4.0;
        }
        out
    }
}

/// A Slaney-style mel filterbank (librosa's default, which Whisper's filters are):
/// `n_mels` rows of `n_fft / 2 + 1` weights, area-normalised.
pub fn mel_filters(sample_rate: u32, n_fft: usize, n_mels: usize) -> Vec<f32> {
    const F_SP: f64 = 200.0 / 3.0;
    const MIN_LOG_HZ: f64 = 1_000.0;
    const MIN_LOG_MEL: f64 = MIN_LOG_HZ / F_SP;
    let log_step = 6.4f64.ln() / 27.0;
    let hz_to_mel = |hz: f64| {
        if hz >= MIN_LOG_HZ {
            MIN_LOG_MEL + (hz / MIN_LOG_HZ).ln() / log_step
        } else {
            hz / F_SP
        }
    };
    let mel_to_hz = |mel: f64| {
        if mel >= MIN_LOG_MEL {
            MIN_LOG_HZ * (log_step * (mel - MIN_LOG_MEL)).exp()
        } else {
            F_SP * mel
        }
    };
    let nyquist = f64::from(sample_rate) / 2.0;
    let bins = n_fft / 2 + 1;
    let top = hz_to_mel(nyquist);
    let edges: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz(top * i as f64 / (n_mels + 1) as f64))
        .collect();
    let mut weights = vec![0.0f32; n_mels * bins];
    for m in 0..n_mels {
        let (low, centre, high) = (edges[m], edges[m + 1], edges[m + 2]);
        let norm = 2.0 / (high - low);
        for b in 0..bins {
            let hz = nyquist * b as f64 / (bins - 1) as f64;
            let rising = (hz - low) / (centre - low);
            let falling = (high - hz) / (high - centre);
            weights[m * bins + b] = (rising.min(falling).max(0.0) * norm) as f32;
        }
    }
    weights
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_follow_windows() {
        let s = AudioSettings::default();
        let chunk = s.chunk_samples();
        assert_eq!(s.tokens_for(1), 1_500);
        assert_eq!(s.tokens_for(chunk), 1_500);
        assert_eq!(s.tokens_for(chunk + 1), 3_000);
        let proportional = AudioSettings {
            pad_chunks: false,
            ..s
        };
        assert_eq!(proportional.tokens_for(chunk / 2), 750);
        assert_eq!(proportional.tokens_for(chunk + chunk / 10), 1_650);
        assert_eq!(proportional.tokens_for(1), 1);
    }

    #[test]
    fn settings_are_checked() {
        assert!(AudioSettings::default().validate().is_ok());
        let bad = AudioSettings {
            n_mels: 0,
            ..AudioSettings::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("n_mels"));
        let bad = AudioSettings {
            max_seconds: f64::NAN,
            ..AudioSettings::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("max_seconds")
        );
    }
}

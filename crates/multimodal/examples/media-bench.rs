//! Time to prepare audio and video files, one at a time on one thread: decode, resample and
//! log-mel for audio; container, frame choice, fit and hash for video.
//!
//!     cargo run --release -p switchyard-multimodal --features h264 --example media-bench -- \
//!         --repeat 20 --ffmpeg /usr/bin/ffmpeg clip.wav clip.mp3 clip.mp4 clip.webm

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use switchyard_multimodal::ImageSettings;
use switchyard_multimodal::audio::{AudioSettings, LogMel, prepare_audio};
use switchyard_multimodal::video::{VideoSettings, prepare_video};

#[derive(Debug, Parser)]
struct Args {
    /// Times each file is prepared.
    #[arg(long, default_value_t = 20)]
    repeat: usize,
    /// ffmpeg for video containers read nowhere else.
    #[arg(long)]
    ffmpeg: Option<PathBuf>,
    /// Audio (.wav, .mp3, .flac, .ogg) and video (anything else) files.
    files: Vec<PathBuf>,
}

fn main() {
    let args = Args::parse();
    let audio = AudioSettings::default();
    let mel = LogMel::new(audio.sample_rate, audio.n_mels as usize);
    let (image, video) = (ImageSettings::default(), VideoSettings::default());
    println!("| file | bytes | media seconds | tokens | ms p50 | ms max | media s per s |");
    println!("|---|---|---|---|---|---|---|");
    for file in &args.files {
        let bytes = std::fs::read(file).unwrap();
        let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("");
        let mut times = Vec::with_capacity(args.repeat);
        let mut seconds = 0.0;
        let mut tokens = 0;
        for _ in 0..args.repeat {
            let start = Instant::now();
            if ["wav", "mp3", "flac", "ogg"].contains(&ext) {
                let prepared = prepare_audio(&bytes, ext, &audio, &mel).unwrap();
                (seconds, tokens) = (prepared.seconds, prepared.tokens);
            } else {
                let prepared =
                    prepare_video(&bytes, &image, &video, u32::MAX, args.ffmpeg.as_deref())
                        .unwrap();
                (seconds, tokens) = (prepared.seconds, prepared.tokens);
            }
            times.push(start.elapsed().as_secs_f64() * 1_000.0);
        }
        times.sort_by(f64::total_cmp);
        let p50 = times[times.len() / 2];
        println!(
            "| {} | {} | {seconds:.1} | {tokens} | {p50:.1} | {:.1} | {:.0} |",
            file.file_name().unwrap().to_string_lossy(),
            bytes.len(),
            times[times.len() - 1],
            seconds / (p50 / 1_000.0)
        );
    }
}

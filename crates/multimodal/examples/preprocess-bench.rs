//! Throughput of image preprocessing (decode, fit or tile, hash) through the bounded pool.
//!
//!     cargo run --release -p switchyard-multimodal --example preprocess-bench -- \
//!         --width 1024 --height 768 --format jpeg --images 400 --threads 1,2

#![allow(clippy::unwrap_used)]

use std::io::Cursor;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use image::{DynamicImage, ImageFormat, RgbImage};
use switchyard_multimodal::{Detail, ImageSettings, PreprocessPool, prepare_image};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 1024)]
    width: u32,
    #[arg(long, default_value_t = 768)]
    height: u32,
    /// jpeg, png, webp or gif.
    #[arg(long, default_value = "jpeg")]
    format: String,
    /// low, high or auto.
    #[arg(long, default_value = "low")]
    detail: String,
    #[arg(long, default_value_t = 400)]
    images: usize,
    /// Pool sizes to compare, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
}

fn main() {
    let args = Args::parse();
    let format = ImageFormat::from_extension(&args.format).expect("an image format");
    let detail = Detail::parse(&args.detail).unwrap();
    // 16 distinct pictures (noise over a gradient, as a photo-like load for the codecs).
    let inputs: Vec<Arc<Vec<u8>>> = (0..16u32)
        .map(|seed| {
            let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
            let img = RgbImage::from_fn(args.width, args.height, |x, y| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                let noise = (state & 31) as u8;
                image::Rgb([
                    (x * 200 / args.width) as u8 + noise,
                    (y * 200 / args.height) as u8 + noise,
                    (seed * 15) as u8 + noise,
                ])
            });
            let mut out = Cursor::new(Vec::new());
            DynamicImage::ImageRgb8(img)
                .write_to(&mut out, format)
                .unwrap();
            Arc::new(out.into_inner())
        })
        .collect();
    let settings = ImageSettings::default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "{} {}×{} images ({} KiB each), detail {}, {} per run",
        args.format,
        args.width,
        args.height,
        inputs[0].len() / 1024,
        args.detail,
        args.images
    );
    println!("threads  images/s  ms/image p50  p99   tokens");
    for &threads in &args.threads {
        let pool = PreprocessPool::new(threads, args.images);
        let start = Instant::now();
        let (mut times, tokens) = runtime.block_on(async {
            let jobs: Vec<_> = (0..args.images)
                .map(|i| {
                    let (pool, bytes) = (pool.clone(), Arc::clone(&inputs[i % inputs.len()]));
                    tokio::spawn(async move {
                        pool.run(move || {
                            let t = Instant::now();
                            let prepared = prepare_image(&bytes, detail, &settings)?;
                            Ok((t.elapsed(), prepared.tokens))
                        })
                        .await
                        .unwrap()
                    })
                })
                .collect();
            let mut times: Vec<Duration> = Vec::new();
            let mut tokens = 0;
            for job in jobs {
                let (time, t) = job.await.unwrap();
                times.push(time);
                tokens = t;
            }
            (times, tokens)
        });
        let wall = start.elapsed().as_secs_f64();
        times.sort_unstable();
        let ms = |q: f64| times[((times.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
        println!(
            "{threads:>7}  {:>8.1}  {:>12.2}  {:>5.2}  {tokens:>5}",
            args.images as f64 / wall,
            ms(0.5),
            ms(0.99)
        );
    }
}

//! Which frames to keep: evenly spread, at a rate, or where the picture changes (grey
//! thumbnails compared).

use image::RgbImage;

/// `n` indices evenly spread over `0..total` (the middle of each of `n` equal spans), or all
/// of them if there are no more than `n`.
pub fn uniform(total: usize, n: usize) -> Vec<usize> {
    if total <= n {
        return (0..total).collect();
    }
    (0..n).map(|i| (2 * i + 1) * total / (2 * n)).collect()
}

/// The first frame at or after each multiple of `1 / fps` seconds.
pub fn at_fps(times: &[f64], fps: f64) -> Vec<usize> {
    let step = 1.0 / fps;
    let mut out = Vec::new();
    let mut next = 0.0;
    for (i, t) in times.iter().enumerate() {
        if *t + 1e-9 >= next {
            out.push(i);
            next = (((*t + 1e-9) / step).floor() + 1.0) * step;
        }
    }
    out
}

const THUMB: u32 = 64;

/// A 64 × 64 grey thumbnail.
pub(super) fn thumbnail(frame: &RgbImage) -> Vec<u8> {
    let small = image::imageops::thumbnail(frame, THUMB, THUMB);
    small
        .pixels()
        .map(|p| {
            ((u32::from(p[0]) * 299 + u32::from(p[1]) * 587 + u32::from(p[2]) * 114) / 1000) as u8
        })
        .collect()
}

pub(super) fn mean_difference(a: &[u8], b: &[u8]) -> f64 {
    let total: u64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| u64::from(x.abs_diff(*y)))
        .sum();
    total as f64 / (a.len().max(1) as f64 * 255.0)
}

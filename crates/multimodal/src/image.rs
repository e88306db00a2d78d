//! Images to patch tokens: decode (JPEG, PNG, WebP, GIF's first frame), fit to the vision
//! tower's square input, or tile a large image into a grid of such squares plus an
//! overview, count the patch tokens, and hash the content with the settings.

use std::io::Cursor;

use fast_image_resize::images::Image;
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::{ImageFormat, ImageReader, Limits};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use xxhash_rust::xxh3::Xxh3;

use crate::MediaError;

/// How images become tokens for a vision tower (defaults: ViT-L/14 at 336 px, as in
/// LLaVA-1.5: 576 tokens per square).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImageSettings {
    /// Side of the square the vision tower takes, in pixels.
    pub image_size: u32,
    /// Side of a patch, in pixels: a square gives (image_size / patch_size)² tokens.
    pub patch_size: u32,
    /// Most tiles a `high`-detail image is cut into (an overview square comes on top).
    pub max_tiles: u32,
    /// Largest decoded side accepted, in pixels, and largest area (guards against
    /// decompression bombs: a decoded pixel takes up to 4 bytes while it is converted).
    pub max_side: u32,
    pub max_pixels: u64,
    /// Largest encoded image accepted, in bytes.
    pub max_bytes: usize,
}

impl Default for ImageSettings {
    fn default() -> Self {
        ImageSettings {
            image_size: 336,
            patch_size: 14,
            max_tiles: 6,
            max_side: 8_192,
            max_pixels: 16 << 20,
            max_bytes: 20 << 20,
        }
    }
}

/// The first of the [`ImageSettings`] that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ImageSettingsError {
    #[error(
        "image_size ({image_size}) must be at least patch_size ({patch_size}), which must be positive"
    )]
    PatchSize { image_size: u32, patch_size: u32 },
    #[error("image_size ({image_size}) must be a multiple of patch_size ({patch_size})")]
    NotAMultiple { image_size: u32, patch_size: u32 },
    #[error("image_size ({0}) is above 4096")]
    ImageSize(u32),
    #[error("max_tiles ({0}) must be 1 to 64")]
    MaxTiles(u32),
    #[error("max_side, max_pixels and max_bytes must be positive")]
    ZeroLimit,
}

impl ImageSettings {
    /// Checks the settings, naming the first that cannot work.
    pub fn validate(&self) -> Result<(), ImageSettingsError> {
        if self.patch_size == 0 || self.image_size < self.patch_size {
            return Err(ImageSettingsError::PatchSize {
                image_size: self.image_size,
                patch_size: self.patch_size,
            });
        }
        if !self.image_size.is_multiple_of(self.patch_size) {
            return Err(ImageSettingsError::NotAMultiple {
                image_size: self.image_size,
                patch_size: self.patch_size,
            });
        }
        if self.image_size > 4_096 {
            return Err(ImageSettingsError::ImageSize(self.image_size));
        }
        if self.max_tiles == 0 || self.max_tiles > 64 {
            return Err(ImageSettingsError::MaxTiles(self.max_tiles));
        }
        if self.max_side == 0 || self.max_bytes == 0 || self.max_pixels == 0 {
            return Err(ImageSettingsError::ZeroLimit);
        }
        Ok(())
    }

    /// Refuses a picture (an image, a video's frames) over the side and area limits.
    pub fn check_pixels(&self, width: u32, height: u32) -> Result<(), MediaError> {
        if width > self.max_side
            || height > self.max_side
            || u64::from(width) * u64::from(height) > self.max_pixels
        {
            return Err(MediaError::TooManyPixels {
                width,
                height,
                max_side: self.max_side,
                max_pixels: self.max_pixels,
            });
        }
        Ok(())
    }

    /// Patch tokens of one square.
    pub fn tokens_per_square(&self) -> u32 {
        let side = self.image_size / self.patch_size;
        side * side
    }
}

/// OpenAI's `detail`: `low` is one square, `high` tiles the image, `auto` tiles only images
/// larger than one square.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Detail {
    Low,
    High,
    #[default]
    Auto,
}

impl Detail {
    pub fn parse(value: &str) -> Result<Detail, MediaError> {
        match value {
            "low" => Ok(Detail::Low),
            "high" => Ok(Detail::High),
            "auto" => Ok(Detail::Auto),
            other => Err(MediaError::BadSetting(format!(
                "detail must be `low`, `high` or `auto`, not `{}`",
                crate::cap(other)
            ))),
        }
    }
}

/// An image ready for a vision tower.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedImage {
    /// As decoded.
    pub width: u32,
    pub height: u32,
    pub format: &'static str,
    /// Tiles across and down (1 × 1 for one square, then there is no overview).
    pub grid: (u32, u32),
    /// RGB squares of `image_size` pixels a side, row by row; with a grid of more than one
    /// tile, the overview of the whole image last.
    pub squares: Vec<Vec<u8>>,
    /// Placeholder tokens the image takes in the prompt.
    pub tokens: u32,
    /// Content hash: the decoded pixels and everything that shapes the tokens.
    pub hash: u64,
}

/// Decodes and prepares an image. CPU-bound (milliseconds to tens of milliseconds): call it
/// off the async threads, e.g. through [`crate::PreprocessPool`].
pub fn prepare_image(
    bytes: &[u8],
    detail: Detail,
    settings: &ImageSettings,
) -> Result<PreparedImage, MediaError> {
    if bytes.len() > settings.max_bytes {
        return Err(MediaError::TooLarge {
            bytes: bytes.len() as u64,
            limit: settings.max_bytes as u64,
        });
    }
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| MediaError::Undecodable(e.to_string()))?;
    let format = match reader.format() {
        Some(ImageFormat::Jpeg) => "jpeg",
        Some(ImageFormat::Png) => "png",
        Some(ImageFormat::WebP) => "webp",
        Some(ImageFormat::Gif) => "gif",
        Some(other) => {
            return Err(MediaError::UnknownFormat(format!(
                "{other:?} images are not supported; send JPEG, PNG, WebP or GIF"
            )));
        }
        None => {
            return Err(MediaError::UnknownFormat(
                "not an image this server reads (JPEG, PNG, WebP or GIF)".into(),
            ));
        }
    };
    let (width, height) = reader
        .into_dimensions()
        .map_err(|e| MediaError::Undecodable(format!("cannot read the {format} header: {e}")))?;
    if width == 0 || height == 0 {
        return Err(MediaError::Undecodable(format!(
            "the {format} image is empty"
        )));
    }
    settings.check_pixels(width, height)?;
    reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| MediaError::Undecodable(e.to_string()))?;
    let mut limits = Limits::default();
    limits.max_image_width = Some(settings.max_side);
    limits.max_image_height = Some(settings.max_side);
    // The decoded image at 4 bytes a pixel, and room for the decoder's own buffers.
    limits.max_alloc = Some(
        settings
            .max_pixels
            .saturating_mul(4)
            .saturating_add(64 << 20),
    );
    reader.limits(limits);
    let rgb = reader
        .decode()
        .map_err(|e| MediaError::Undecodable(format!("cannot decode the {format} image: {e}")))?
        .into_rgb8();
    let (width, height) = rgb.dimensions();
    let mut pixels = rgb.into_raw();

    let side = settings.image_size;
    let tiled = match detail {
        Detail::Low => false,
        Detail::High => true,
        Detail::Auto => width > side || height > side,
    };
    let grid = if tiled {
        best_grid(width, height, side, settings.max_tiles)
    } else {
        (1, 1)
    };
    let mut resizer = Resizer::new();
    let mut squares = Vec::with_capacity((grid.0 * grid.1 + 1) as usize);
    if grid == (1, 1) {
        squares.push(fit(&mut resizer, &mut pixels, width, height, side, side)?);
    } else {
        let (cols, rows) = grid;
        let canvas = fit(
            &mut resizer,
            &mut pixels,
            width,
            height,
            cols * side,
            rows * side,
        )?;
        let row_bytes = (cols * side * 3) as usize;
        for row in 0..rows {
            for col in 0..cols {
                let mut square = Vec::with_capacity((side * side * 3) as usize);
                for y in 0..side {
                    let start = (row * side + y) as usize * row_bytes + (col * side * 3) as usize;
                    square.extend_from_slice(&canvas[start..start + (side * 3) as usize]);
                }
                squares.push(square);
            }
        }
        squares.push(fit(&mut resizer, &mut pixels, width, height, side, side)?);
    }
    let tokens = settings.tokens_per_square() * squares.len() as u32;

    let mut hasher = Xxh3::new();
    hasher.update(b"image/1");
    for value in [
        settings.image_size,
        settings.patch_size,
        grid.0,
        grid.1,
        width,
        height,
    ] {
        hasher.update(&value.to_le_bytes());
    }
    hasher.update(&pixels);
    Ok(PreparedImage {
        width,
        height,
        format,
        grid,
        squares,
        tokens,
        hash: hasher.digest(),
    })
}

/// The grid of `side`-pixel tiles, at most `max_tiles` of them, that shows the image at the
/// highest resolution, then wastes the least area (LLaVA-NeXT's choice of resolution).
pub fn best_grid(width: u32, height: u32, side: u32, max_tiles: u32) -> (u32, u32) {
    let (w, h) = (f64::from(width), f64::from(height));
    let mut best = (1, 1);
    let mut best_key = (f64::MIN, f64::MIN);
    for cols in 1..=max_tiles {
        for rows in 1..=max_tiles / cols {
            let (gw, gh) = (f64::from(cols * side), f64::from(rows * side));
            let scale = (gw / w).min(gh / h);
            let effective = (w * scale * h * scale).min(w * h);
            let waste = gw * gh - effective;
            let key = (effective, -waste);
            if key > best_key {
                best_key = key;
                best = (cols, rows);
            }
        }
    }
    best
}

/// Squares (`side` pixels a side, RGB, one after another) at half their resolution: what an
/// encoder that ran out of memory is given again. None when a square would be smaller
/// than `min_side`, or `rgb` is not whole squares.
pub fn halve_squares(side: u32, rgb: &[u8], min_side: u32) -> Option<(u32, Vec<u8>)> {
    let half = side / 2;
    let size = (side as usize) * (side as usize) * 3;
    if half < min_side.max(1) || size == 0 || !rgb.len().is_multiple_of(size) {
        return None;
    }
    let mut resizer = Resizer::new();
    let mut out = Vec::with_capacity(rgb.len() / 4);
    for square in rgb.chunks_exact(size) {
        let mut pixels = square.to_vec();
        out.extend(fit(&mut resizer, &mut pixels, side, side, half, half).ok()?);
    }
    Some((half, out))
}

/// The hash of an item made smaller (see [`halve_squares`]) from the item hashed `hash`,
/// `times` halvings on: another item, which never shares the original's cached KV.
pub fn reduced_hash(hash: u64, times: u32) -> u64 {
    let mut hasher = Xxh3::new();
    hasher.update(b"reduced/1");
    hasher.update(&hash.to_le_bytes());
    hasher.update(&times.to_le_bytes());
    hasher.digest()
}

/// The image resized to fit `to_w` × `to_h` with its aspect kept, centred on black.
pub(crate) fn fit(
    resizer: &mut Resizer,
    pixels: &mut [u8],
    width: u32,
    height: u32,
    to_w: u32,
    to_h: u32,
) -> Result<Vec<u8>, MediaError> {
    let scale = (f64::from(to_w) / f64::from(width)).min(f64::from(to_h) / f64::from(height));
    let fit_w = ((f64::from(width) * scale).round() as u32).clamp(1, to_w);
    let fit_h = ((f64::from(height) * scale).round() as u32).clamp(1, to_h);
    let source = Image::from_slice_u8(width, height, pixels, PixelType::U8x3)
        .map_err(|e| MediaError::Undecodable(e.to_string()))?;
    let mut resized = Image::new(fit_w, fit_h, PixelType::U8x3);
    resizer
        .resize(
            &source,
            &mut resized,
            &ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::CatmullRom)),
        )
        .map_err(|e| MediaError::Undecodable(e.to_string()))?;
    if (fit_w, fit_h) == (to_w, to_h) {
        return Ok(resized.into_vec());
    }
    let mut canvas = vec![0u8; (to_w * to_h * 3) as usize];
    let (left, top) = ((to_w - fit_w) / 2, (to_h - fit_h) / 2);
    let src_row = (fit_w * 3) as usize;
    for (y, row) in resized.buffer().chunks_exact(src_row).enumerate() {
        let start = ((top as usize + y) * to_w as usize + left as usize) * 3;
        canvas[start..start + src_row].copy_from_slice(row);
    }
    Ok(canvas)
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{DynamicImage, RgbImage};
    use proptest::prelude::*;

    /// A gradient image with a mark depending on `seed`, encoded as `format`.
    pub(crate) fn encoded(width: u32, height: u32, seed: u8, format: ImageFormat) -> Vec<u8> {
        let img = RgbImage::from_fn(width, height, |x, y| {
            image::Rgb([
                (x * 255 / width.max(1)) as u8,
                (y * 255 / height.max(1)) as u8,
                seed.wrapping_mul(37).wrapping_add((x ^ y) as u8),
            ])
        });
        let mut out = Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(img)
            .write_to(&mut out, format)
            .unwrap();
        out.into_inner()
    }

    #[test]
    fn every_supported_format_decodes_to_one_square_at_low_detail() {
        let settings = ImageSettings::default();
        for (format, name) in [
            (ImageFormat::Jpeg, "jpeg"),
            (ImageFormat::Png, "png"),
            (ImageFormat::WebP, "webp"),
            (ImageFormat::Gif, "gif"),
        ] {
            let prepared =
                prepare_image(&encoded(640, 480, 1, format), Detail::Low, &settings).unwrap();
            assert_eq!(prepared.format, name);
            assert_eq!((prepared.width, prepared.height), (640, 480));
            assert_eq!(prepared.grid, (1, 1));
            assert_eq!(prepared.tokens, 576);
            assert_eq!(prepared.squares.len(), 1);
            assert_eq!(prepared.squares[0].len(), 336 * 336 * 3);
        }
    }

    #[test]
    fn a_wide_image_keeps_its_aspect_on_a_black_band() {
        let settings = ImageSettings::default();
        let prepared = prepare_image(
            &encoded(672, 336, 1, ImageFormat::Png),
            Detail::Low,
            &settings,
        )
        .unwrap();
        let square = &prepared.squares[0];
        let pixel = |x: usize, y: usize| &square[(y * 336 + x) * 3..(y * 336 + x) * 3 + 3];
        // 672×336 fits as 336×168 from row 84: black above and below, picture between.
        assert_eq!(pixel(100, 10), [0, 0, 0]);
        assert_eq!(pixel(100, 330), [0, 0, 0]);
        assert_ne!(pixel(300, 168), [0, 0, 0]);
    }

    #[test]
    fn high_detail_tiles_a_large_image_and_adds_an_overview() {
        let settings = ImageSettings::default();
        let bytes = encoded(1344, 672, 1, ImageFormat::Png);
        let high = prepare_image(&bytes, Detail::High, &settings).unwrap();
        // 1344×672 is exactly 4 × 2 squares of 336, but 8 > 6 tiles: 3 × 2 shows it best.
        assert_eq!(high.grid, (3, 2));
        assert_eq!(high.squares.len(), 7);
        assert_eq!(high.tokens, 7 * 576);
        // `auto` tiles what is larger than a square, and not what is not.
        assert_eq!(
            prepare_image(&bytes, Detail::Auto, &settings).unwrap().grid,
            (3, 2)
        );
        let small = encoded(300, 200, 1, ImageFormat::Png);
        let auto = prepare_image(&small, Detail::Auto, &settings).unwrap();
        assert_eq!((auto.grid, auto.tokens), ((1, 1), 576));
        let settings = ImageSettings {
            max_tiles: 8,
            ..settings
        };
        assert_eq!(
            prepare_image(&bytes, Detail::High, &settings).unwrap().grid,
            (4, 2)
        );
    }

    #[test]
    fn halved_squares_keep_the_picture_at_a_quarter_of_the_pixels() {
        // Two 8-pixel squares: the left half red and the right blue, then all green.
        let mut rgb = Vec::new();
        for _ in 0..8 {
            for x in 0..8 {
                rgb.extend_from_slice(if x < 4 { &[255, 0, 0] } else { &[0, 0, 255] });
            }
        }
        for _ in 0..64 {
            rgb.extend_from_slice(&[0, 255, 0]);
        }
        let (side, half) = halve_squares(8, &rgb, 2).unwrap();
        assert_eq!((side, half.len()), (4, 2 * 4 * 4 * 3));
        let pixel = |square: usize, x: usize, y: usize| {
            let at = square * 48 + (y * 4 + x) * 3;
            [half[at], half[at + 1], half[at + 2]]
        };
        assert_eq!(pixel(0, 0, 0), [255, 0, 0]);
        assert_eq!(pixel(0, 3, 3), [0, 0, 255]);
        assert_eq!(pixel(1, 2, 1), [0, 255, 0]);
        // Not below the smallest side, nor from broken input.
        assert!(halve_squares(4, &half[..48], 3).is_none());
        assert!(halve_squares(8, &rgb[..100], 2).is_none());
        assert_ne!(reduced_hash(5, 1), reduced_hash(5, 2));
        assert_ne!(reduced_hash(5, 1), reduced_hash(6, 1));
    }

    #[test]
    fn the_hash_follows_the_pixels_and_the_settings() {
        let settings = ImageSettings::default();
        let a = encoded(400, 300, 1, ImageFormat::Png);
        let b = encoded(400, 300, 2, ImageFormat::Png);
        let hash = |bytes: &[u8], detail, settings: &ImageSettings| {
            prepare_image(bytes, detail, settings).unwrap().hash
        };
        assert_eq!(
            hash(&a, Detail::Low, &settings),
            hash(&a, Detail::Low, &settings)
        );
        // The same pixels in another container: the same item.
        let a_webp = {
            let img = image::load_from_memory(&a).unwrap();
            let mut out = Cursor::new(Vec::new());
            img.write_to(&mut out, ImageFormat::WebP).unwrap();
            out.into_inner()
        };
        assert_eq!(
            hash(&a, Detail::Low, &settings),
            hash(&a_webp, Detail::Low, &settings)
        );
        assert_ne!(
            hash(&a, Detail::Low, &settings),
            hash(&b, Detail::Low, &settings)
        );
        // Other tokens for the same picture: another item.
        assert_ne!(
            hash(&a, Detail::Low, &settings),
            hash(&a, Detail::High, &settings)
        );
        let bigger = ImageSettings {
            image_size: 448,
            ..settings
        };
        assert_ne!(
            hash(&a, Detail::Low, &settings),
            hash(&a, Detail::Low, &bigger)
        );
    }

    #[test]
    fn bad_images_are_named_errors() {
        let settings = ImageSettings::default();
        let err = |bytes: &[u8]| prepare_image(bytes, Detail::Auto, &settings).unwrap_err();
        assert!(matches!(err(b"hello, world"), MediaError::UnknownFormat(_)));
        // A BMP header: known, not read here.
        let bmp = [b"BM".as_slice(), &[0; 60]].concat();
        assert!(
            err(&bmp)
                .to_string()
                .contains("Bmp images are not supported")
        );
        let mut truncated = encoded(64, 64, 1, ImageFormat::Png);
        truncated.truncate(truncated.len() / 2);
        assert!(matches!(err(&truncated), MediaError::Undecodable(_)));
        let small = ImageSettings {
            max_side: 100,
            ..settings
        };
        assert!(matches!(
            prepare_image(&encoded(101, 10, 1, ImageFormat::Png), Detail::Low, &small),
            Err(MediaError::TooManyPixels { width: 101, .. })
        ));
        let small_area = ImageSettings {
            max_pixels: 10_000,
            ..settings
        };
        assert!(matches!(
            prepare_image(
                &encoded(200, 60, 1, ImageFormat::Png),
                Detail::Low,
                &small_area
            ),
            Err(MediaError::TooManyPixels { height: 60, .. })
        ));
        let tight = ImageSettings {
            max_bytes: 100,
            ..settings
        };
        assert!(matches!(
            prepare_image(&encoded(64, 64, 1, ImageFormat::Png), Detail::Low, &tight),
            Err(MediaError::TooLarge { .. })
        ));
    }

    #[test]
    fn settings_that_cannot_work_are_named() {
        let ok = ImageSettings::default();
        assert!(ok.validate().is_ok());
        let bad = [
            ImageSettings {
                patch_size: 0,
                ..ok
            },
            ImageSettings {
                image_size: 340,
                ..ok
            },
            ImageSettings { max_tiles: 0, ..ok },
            ImageSettings {
                image_size: 8_192,
                ..ok
            },
        ];
        for settings in bad {
            assert!(settings.validate().is_err(), "{settings:?}");
        }
    }

    proptest! {
        /// The chosen grid is within the budget and no other grid in it shows more of the
        /// image, checked against a naive search.
        #[test]
        fn the_grid_is_the_best_in_the_budget(
            width in 1u32..5_000, height in 1u32..5_000, max_tiles in 1u32..10,
        ) {
            let side = 336;
            let (cols, rows) = best_grid(width, height, side, max_tiles);
            prop_assert!(cols >= 1 && rows >= 1 && cols * rows <= max_tiles);
            let shown = |c: u32, r: u32| {
                let (w, h) = (f64::from(width), f64::from(height));
                let s = (f64::from(c * side) / w).min(f64::from(r * side) / h);
                (w * s * h * s).min(w * h)
            };
            let chosen = shown(cols, rows);
            for c in 1..=max_tiles {
                for r in 1..=max_tiles {
                    if c * r <= max_tiles {
                        prop_assert!(shown(c, r) <= chosen + 1e-6);
                        if (shown(c, r) - chosen).abs() <= 1e-6 {
                            prop_assert!(c * r >= cols * rows, "{c}x{r} shows as much with fewer tiles than {cols}x{rows}");
                        }
                    }
                }
            }
        }
    }
}

//! Media for a text trace: each request gets an image, a video or an audio clip with the
//! configured shares, its placeholder tokens inserted after the first trace block (the
//! shared system prompt), drawn from a pool of distinct items so some recur.

use std::num::{ParseFloatError, ParseIntError};
use std::str::FromStr;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use switchyard_core::Modality;
use switchyard_core::trace::{MediaRecord, MooncakeRecord};

/// Which share of requests carries which media, and how large each item is.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaMix {
    /// (modality, share of requests), shares summing to at most 1; the rest is text only.
    pub shares: Vec<(Modality, f64)>,
    /// Distinct items per modality: a request draws one uniformly, so with fewer items
    /// than requests some recur (and may hit the cache).
    pub pool: u64,
    pub image_tokens: u64,
    /// Frames per video, at `video_frame_tokens` each (30 × 144 = 4,320).
    pub video_frames: u64,
    pub video_frame_tokens: u64,
    /// Tokens per audio clip (Whisper: 1,500 per 30 s window).
    pub audio_tokens: u64,
    /// Where the item goes: after this many prompt tokens (or at the end of a shorter
    /// prompt).
    pub offset: u64,
}

impl Default for MediaMix {
    fn default() -> Self {
        MediaMix {
            shares: Vec::new(),
            pool: 100_000,
            image_tokens: 576,
            video_frames: 30,
            video_frame_tokens: 144,
            audio_tokens: 1_500,
            offset: 512,
        }
    }
}

/// Why a `--media-mix` text is not a mix ([`MediaMix::from_str`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MediaMixError {
    #[error("`{part}`: expected MODALITY=SHARE, e.g. image=0.1")]
    NoShare { part: String },
    #[error("`{part}`: the offset must be a token count")]
    Offset {
        part: String,
        #[source]
        source: ParseIntError,
    },
    #[error("unknown modality `{0}`: expected image, video or audio")]
    UnknownModality(String),
    #[error("`{part}`: the share must be a number in [0, 1]")]
    ShareNotANumber {
        part: String,
        #[source]
        source: ParseFloatError,
    },
    #[error("`{part}`: the share must be in [0, 1]")]
    ShareOutOfRange { part: String },
    #[error("`{0}` is given twice")]
    Twice(String),
    #[error("the shares add up to {0}, more than 1")]
    OverOne(f64),
}

impl FromStr for MediaMix {
    type Err = MediaMixError;

    /// `image=0.1,video=0.1,audio=0.05`, optionally with `offset=TOKENS` (where the item
    /// goes in the prompt; 512 by default).
    fn from_str(s: &str) -> Result<Self, MediaMixError> {
        let mut shares = Vec::new();
        let mut offset = MediaMix::default().offset;
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, share) = part.split_once('=').ok_or_else(|| MediaMixError::NoShare {
                part: part.to_owned(),
            })?;
            let modality = match name.trim() {
                "offset" => {
                    offset = share
                        .trim()
                        .parse()
                        .map_err(|source| MediaMixError::Offset {
                            part: part.to_owned(),
                            source,
                        })?;
                    continue;
                }
                "image" => Modality::Image,
                "video" => Modality::Video,
                "audio" => Modality::Audio,
                other => {
                    return Err(MediaMixError::UnknownModality(other.to_owned()));
                }
            };
            let share: f64 =
                share
                    .trim()
                    .parse()
                    .map_err(|source| MediaMixError::ShareNotANumber {
                        part: part.to_owned(),
                        source,
                    })?;
            if !(0.0..=1.0).contains(&share) {
                return Err(MediaMixError::ShareOutOfRange {
                    part: part.to_owned(),
                });
            }
            if shares.iter().any(|&(m, _)| m == modality) {
                return Err(MediaMixError::Twice(name.to_owned()));
            }
            shares.push((modality, share));
        }
        let total: f64 = shares.iter().map(|(_, s)| s).sum();
        if total > 1.0 + 1e-9 {
            return Err(MediaMixError::OverOne(total));
        }
        Ok(MediaMix {
            shares,
            offset,
            ..MediaMix::default()
        })
    }
}

impl MediaMix {
    fn tokens(&self, modality: Modality) -> u64 {
        match modality {
            Modality::Image => self.image_tokens,
            Modality::Video => self.video_frames * self.video_frame_tokens,
            Modality::Audio => self.audio_tokens,
        }
    }

    /// Gives each record its media (replacing any), deterministically from `seed`. A
    /// request's prompt grows by the item's tokens (the simulator lays the text around
    /// it). The draw is keyed by the trace blocks before the insertion point and the one
    /// after it (the first block a conversation has of its own, past a shared system
    /// prompt), so the turns of one conversation carry the same item at the same place, as
    /// a chat keeps its image in the history; a request without hash ids draws on its own.
    pub fn apply(&self, records: &mut [MooncakeRecord], seed: u64, block_size: u32) {
        let mut own = SmallRng::seed_from_u64(seed ^ 0x006d_6564_6961);
        let block = u64::from(block_size.max(1));
        for record in records {
            record.media.clear();
            let offset = self.offset.min(record.input_length);
            let keyed = (offset / block + 1) as usize;
            let mut rng = if record.hash_ids.is_empty() {
                SmallRng::seed_from_u64(own.random())
            } else {
                let ids = &record.hash_ids[..keyed.min(record.hash_ids.len())];
                let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
                SmallRng::seed_from_u64(xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, seed))
            };
            let draw: f64 = rng.random();
            let item: u64 = rng.random_range(0..self.pool.max(1));
            let mut cumulative = 0.0;
            let chosen = self.shares.iter().find(|&&(_, share)| {
                cumulative += share;
                draw < cumulative
            });
            let Some(&(modality, _)) = chosen else {
                continue;
            };
            let tokens = self.tokens(modality);
            record.input_length += tokens;
            record.media.push(MediaRecord {
                modality,
                offset,
                tokens,
                // One numbering per modality: item 7 of the images is not item 7 of the
                // videos.
                hash: xxhash_rust::xxh3::xxh3_64_with_seed(
                    &item.to_le_bytes(),
                    modality as u64 + 1,
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(n: u64) -> Vec<MooncakeRecord> {
        (0..n)
            .map(|i| MooncakeRecord {
                timestamp: i * 100,
                input_length: 300 + i % 1_000,
                output_length: 10,
                hash_ids: vec![i, i + 1],
                media: Vec::new(),
                ..MooncakeRecord::default()
            })
            .collect()
    }

    #[test]
    fn shares_sizes_and_reuse_follow_the_mix() {
        let mut mix: MediaMix = "image=0.3, video=0.1".parse().unwrap();
        mix.pool = 50;
        let mut rows = records(10_000);
        let before: Vec<u64> = rows.iter().map(|r| r.input_length).collect();
        mix.apply(&mut rows, 1, 512);
        let count = |m: Modality| {
            rows.iter()
                .filter(|r| r.media.first().is_some_and(|x| x.modality == m))
                .count()
        };
        let (images, videos) = (count(Modality::Image), count(Modality::Video));
        assert!((2_800..3_200).contains(&images), "{images} images");
        assert!((900..1_100).contains(&videos), "{videos} videos");
        assert_eq!(count(Modality::Audio), 0);
        for (row, len) in rows.iter().zip(before) {
            match row.media.as_slice() {
                [] => assert_eq!(row.input_length, len),
                [m] => {
                    assert_eq!(row.input_length, len + m.tokens);
                    assert_eq!(m.offset, len.min(512));
                    let expected = if m.modality == Modality::Image {
                        576
                    } else {
                        4_320
                    };
                    assert_eq!(m.tokens, expected);
                }
                more => panic!("{} items", more.len()),
            }
        }
        // 50 distinct images: they recur.
        let mut hashes: Vec<u64> = rows
            .iter()
            .flat_map(|r| &r.media)
            .filter(|m| m.modality == Modality::Image)
            .map(|m| m.hash)
            .collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), 50);
        // The same seed, the same media.
        let mut again = records(10_000);
        mix.apply(&mut again, 1, 512);
        assert_eq!(again, rows);
    }

    #[test]
    fn the_turns_of_a_conversation_keep_their_item() {
        let mix: MediaMix = "image=0.5".parse().unwrap();
        // Two conversations of three turns each: the turns share their first blocks.
        let mut rows: Vec<MooncakeRecord> = (0..60)
            .map(|i| MooncakeRecord {
                timestamp: i,
                input_length: 2_000,
                output_length: 10,
                hash_ids: vec![i / 3 * 10, i / 3 * 10 + 1, 1_000 + i],
                media: Vec::new(),
                ..MooncakeRecord::default()
            })
            .collect();
        mix.apply(&mut rows, 3, 512);
        for turns in rows.chunks(3) {
            assert_eq!(turns[0].media, turns[1].media);
            assert_eq!(turns[0].media, turns[2].media);
        }
        assert!(rows.iter().any(|r| r.media.is_empty()));
        assert!(rows.iter().any(|r| !r.media.is_empty()));
    }

    #[test]
    fn bad_mixes_are_named() {
        for (text, says) in [
            ("image", "MODALITY=SHARE"),
            ("smell=0.1", "unknown modality `smell`"),
            ("image=x", "a number"),
            ("image=1.5", "[0, 1]"),
            ("image=0.6,video=0.6", "more than 1"),
            ("image=0.1,image=0.2", "twice"),
            ("video=1,offset=-3", "token count"),
        ] {
            let err = text.parse::<MediaMix>().unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
        assert!("".parse::<MediaMix>().unwrap().shares.is_empty());
        let placed: MediaMix = "video=1,offset=4096".parse().unwrap();
        assert_eq!((placed.offset, placed.shares.len()), (4_096, 1));
    }
}

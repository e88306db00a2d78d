//! Where a media item's bytes come from: a `data:` URL carried in the request, an
//! `http(s)` URL to fetch, or a file under an allow-listed directory.

use std::path::{Component, Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::MediaError;

/// A media reference as a request gives it (an `image_url`'s or `video_url`'s `url`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaRef {
    /// The bytes themselves, from a `data:` URL, with the media type it declared.
    Data {
        media_type: Option<String>,
        bytes: Vec<u8>,
    },
    /// To fetch (with a timeout and a size limit).
    Http(String),
    /// A file, already checked to lie under the allowed directory.
    File(PathBuf),
}

/// Reads a media URL. `data:` URLs are decoded here (base64 or percent-free plain text),
/// refusing more than `max_bytes`; `file:` URLs are accepted only under `files_root`.
pub fn parse_url(
    url: &str,
    max_bytes: usize,
    files_root: Option<&Path>,
) -> Result<MediaRef, MediaError> {
    if let Some(rest) = strip_prefix_ignore_case(url, "data:") {
        let (header, payload) = rest.split_once(',').ok_or_else(|| {
            MediaError::BadUrl("a data: URL needs a comma before its data".into())
        })?;
        let mut params = header.split(';');
        let media_type = params
            .next()
            .filter(|t| !t.is_empty())
            .map(str::to_ascii_lowercase);
        let base64 = params.any(|p| p.eq_ignore_ascii_case("base64"));
        if !base64 {
            return Err(MediaError::BadUrl(
                "only base64 data: URLs are accepted (`data:TYPE;base64,...`)".into(),
            ));
        }
        let bytes = decode_base64(payload, max_bytes, "the data: URL")?;
        return Ok(MediaRef::Data { media_type, bytes });
    }
    if strip_prefix_ignore_case(url, "http://").is_some()
        || strip_prefix_ignore_case(url, "https://").is_some()
    {
        return Ok(MediaRef::Http(url.to_owned()));
    }
    if let Some(path) = strip_prefix_ignore_case(url, "file://") {
        let Some(root) = files_root else {
            return Err(MediaError::BadUrl(
                "file: URLs are not allowed on this server".into(),
            ));
        };
        return Ok(MediaRef::File(allowed_path(Path::new(path), root)?));
    }
    let scheme = url.split_once(':').map_or("", |(s, _)| s);
    Err(MediaError::BadUrl(
        if scheme.is_empty() || scheme.len() > 16 {
            "expected a data:, http(s): or file: URL".into()
        } else {
            format!("URLs of scheme `{scheme}` are not supported; use data:, http(s): or file:")
        },
    ))
}

/// Decodes standard base64 (an `input_audio`'s `data`, a `data:` URL's payload), refusing
/// more than `max_bytes` before decoding anything, and empty data; errors name it `what`.
pub fn decode_base64(payload: &str, max_bytes: usize, what: &str) -> Result<Vec<u8>, MediaError> {
    // Four base64 characters carry three bytes.
    let payload = payload.trim();
    let padding = payload.bytes().rev().take(2).filter(|&b| b == b'=').count();
    let decoded_len = (payload.len() / 4 * 3).saturating_sub(padding);
    if decoded_len > max_bytes {
        return Err(MediaError::TooLarge {
            bytes: decoded_len as u64,
            limit: max_bytes as u64,
        });
    }
    let bytes = STANDARD
        .decode(payload)
        .map_err(|e| MediaError::BadUrl(format!("{what} is not valid base64: {e}")))?;
    if bytes.len() > max_bytes {
        return Err(MediaError::TooLarge {
            bytes: bytes.len() as u64,
            limit: max_bytes as u64,
        });
    }
    if bytes.is_empty() {
        return Err(MediaError::BadUrl(
            "the data is empty: no data was sent".into(),
        ));
    }
    Ok(bytes)
}

/// `path` if it is absolute and lies under `root` without `..` (checked on the text, so
/// a path that does not exist yet cannot escape either).
fn allowed_path(path: &Path, root: &Path) -> Result<PathBuf, MediaError> {
    let refuse = || MediaError::BadUrl(format!("files are only read under {}", root.display()));
    if !path.is_absolute()
        || path
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        || !path.starts_with(root)
    {
        return Err(refuse());
    }
    Ok(path.to_path_buf())
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(bytes: &[u8]) -> String {
        format!("data:image/png;base64,{}", STANDARD.encode(bytes))
    }

    #[test]
    fn data_urls_decode_with_their_type() {
        let parsed = parse_url(&data(b"\x89PNG..."), 1024, None).unwrap();
        assert_eq!(
            parsed,
            MediaRef::Data {
                media_type: Some("image/png".into()),
                bytes: b"\x89PNG...".to_vec()
            }
        );
        let upper = data(b"abc").replace("data:image/png", "DATA:Image/PNG");
        assert!(matches!(
            parse_url(&upper, 1024, None),
            Ok(MediaRef::Data { media_type: Some(t), .. }) if t == "image/png"
        ));
    }

    #[test]
    fn bad_data_urls_say_what_is_wrong() {
        let err = |url: &str| parse_url(url, 16, None).unwrap_err().to_string();
        assert!(err("data:image/png;base64").contains("comma"));
        assert!(err("data:image/png,rawdata").contains("base64"));
        assert!(err("data:image/png;base64,@@@@").contains("not valid base64"));
        assert!(err("data:image/png;base64,").contains("no data"));
        assert!(
            err(&data(&[7; 64])).contains("64 bytes"),
            "{}",
            err(&data(&[7; 64]))
        );
        // Refused before decoding: a huge payload is never decoded.
        let huge = format!("data:image/png;base64,{}", "A".repeat(4_000_000));
        assert!(matches!(
            parse_url(&huge, 1024, None),
            Err(MediaError::TooLarge { .. })
        ));
    }

    #[test]
    fn other_schemes() {
        assert_eq!(
            parse_url("https://example.com/cat.jpg", 16, None).unwrap(),
            MediaRef::Http("https://example.com/cat.jpg".into())
        );
        let root = Path::new("/srv/media");
        assert_eq!(
            parse_url("file:///srv/media/a/cat.jpg", 16, Some(root)).unwrap(),
            MediaRef::File("/srv/media/a/cat.jpg".into())
        );
        for escape in [
            "file:///srv/media/../etc/passwd",
            "file:///etc/passwd",
            "file://relative/cat.jpg",
            "file:///srv/mediaX/cat.jpg",
        ] {
            assert!(
                parse_url(escape, 16, Some(root)).is_err(),
                "{escape} was accepted"
            );
        }
        assert!(
            parse_url("file:///srv/media/cat.jpg", 16, None)
                .unwrap_err()
                .to_string()
                .contains("not allowed")
        );
        assert!(
            parse_url("ftp://x/y.png", 16, None)
                .unwrap_err()
                .to_string()
                .contains("`ftp`")
        );
        assert!(parse_url("cat.jpg", 16, None).is_err());
    }
}

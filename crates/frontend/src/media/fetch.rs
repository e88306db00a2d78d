//! Reading a media URL's bytes: `data:` URLs decoded, `file://` URLs read under
//! `media_dir`, `http(s)` URLs fetched. Fetches reach public addresses only (unless
//! `fetch_private`): literal addresses, redirects and resolved host names are all checked.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use switchyard_multimodal::{MediaError, MediaRef, parse_url};

use super::MediaStage;

impl MediaStage {
    /// A media URL's bytes: decoded, fetched or read, at most `limit` of them.
    pub(super) async fn bytes(&self, url: &str, limit: usize) -> Result<Vec<u8>, MediaError> {
        match parse_url(url, limit, self.config.media_dir.as_deref())? {
            MediaRef::Data { bytes, .. } => Ok(bytes),
            MediaRef::Http(url) => self.fetch(&url, limit).await,
            MediaRef::File(path) => {
                let root = self.config.media_dir.as_deref().unwrap_or(Path::new("/"));
                read_file(path, root, limit).await
            }
        }
    }

    async fn fetch(&self, url: &str, limit: usize) -> Result<Vec<u8>, MediaError> {
        if !self.config.fetch_urls {
            return Err(MediaError::BadUrl(
                "this server does not fetch media URLs; send the media as a data: URL".into(),
            ));
        }
        let failed = |e: reqwest::Error| {
            MediaError::BadUrl(if e.is_timeout() {
                format!(
                    "fetching the media timed out after {:?}",
                    self.config.fetch_timeout
                )
            } else {
                format!("cannot fetch the media: {}", without_url(&e))
            })
        };
        let Some(client) = &self.client else {
            return Err(MediaError::BadUrl(
                "this server cannot fetch media URLs; send the media as a data: URL".into(),
            ));
        };
        if !self.config.fetch_private && !public_host(url) {
            return Err(MediaError::BadUrl(
                "media URLs must name a public address".into(),
            ));
        }
        let _permit = self.fetches.try_acquire().map_err(|_| MediaError::Busy)?;
        let mut response = client.get(url).send().await.map_err(failed)?;
        if !response.status().is_success() {
            return Err(MediaError::BadUrl(format!(
                "fetching the media answered HTTP {}",
                response.status().as_u16()
            )));
        }
        let too_large = |bytes: u64| MediaError::TooLarge {
            bytes,
            limit: limit as u64,
        };
        if let Some(length) = response.content_length()
            && length > limit as u64
        {
            return Err(too_large(length));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(failed)? {
            if body.len() + chunk.len() > limit {
                return Err(too_large((body.len() + chunk.len()) as u64));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// A reqwest error's message without the URL (which may be long, and is the client's own).
fn without_url(e: &reqwest::Error) -> String {
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut last = None;
    while let Some(s) = source {
        last = Some(s.to_string());
        source = s.source();
    }
    last.unwrap_or_else(|| "the request failed".into())
}

async fn read_file(path: PathBuf, root: &Path, limit: usize) -> Result<Vec<u8>, MediaError> {
    // Resolved, so a link under the directory cannot lead out of it; one message for every
    // refusal, so the server's files are not probed through it.
    let refused = || MediaError::BadUrl(format!("no readable media file at {}", path.display()));
    let (Ok(real), Ok(real_root)) = (
        tokio::fs::canonicalize(&path).await,
        tokio::fs::canonicalize(root).await,
    ) else {
        return Err(refused());
    };
    if !real.starts_with(&real_root) {
        return Err(refused());
    }
    let meta = tokio::fs::metadata(&real).await.map_err(|_| refused())?;
    if !meta.is_file() {
        return Err(refused());
    }
    if meta.len() > limit as u64 {
        return Err(MediaError::TooLarge {
            bytes: meta.len(),
            limit: limit as u64,
        });
    }
    tokio::fs::read(&real).await.map_err(|_| refused())
}

/// Redirects: at most 5, and (unless private addresses are allowed) never to a literal
/// non-public address (host names go through [`PublicOnly`]).
pub(super) fn redirects(private: bool) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= 5 {
            attempt.error("too many redirects")
        } else if !private && !public_host(attempt.url().as_str()) {
            attempt.error("a redirect to a non-public address")
        } else {
            attempt.follow()
        }
    })
}

/// Whether a URL's host is a name (checked when resolved) or a public IP address.
fn public_host(url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(url) else {
        return false;
    };
    match url.host() {
        Some(url::Host::Ipv4(ip)) => public_ip(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => public_ip(IpAddr::V6(ip)),
        Some(url::Host::Domain(name)) => !name.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// Not loopback, private, link-local, shared, documentation, unspecified or multicast.
pub fn public_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_documentation()
                || v4.is_multicast()
                || a == 0
                || (a == 100 && (64..128).contains(&b)))
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return public_ip(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80)
        }
    }
}

/// A resolver that keeps only public addresses, so a host name cannot lead a fetch into
/// the server's own network.
#[derive(Debug)]
pub(super) struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|a| public_ip(a.ip()))
                .collect();
            if addrs.is_empty() {
                return Err(format!("{host} has no public address").into());
            }
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

//! The request plane's frame decoder alone, without HTTP (needs the proposed hooks in
//! crates/runtime/src/net/http.rs, see README.md; build with `--features frame-hook`):
//!
//!     #[doc(hidden)]
//!     pub fn decode_frame(buffer: &mut BytesMut)
//!         -> Option<Result<Result<GenerateOutput, EngineError>, EngineError>>;
//!     #[doc(hidden)]
//!     pub fn encode_frame(item: &Result<GenerateOutput, EngineError>) -> Bytes;
//!
//! `decode_frame` is `Decoder::next_frame` taking the buffer as an argument and returning
//! public types (`Ok(Ok(output))`, `Ok(Err(error frame))`, `Err(the stream must end)`).
//!
//! Properties: `None` leaves the buffer alone; a frame is never longer than
//! `MAX_FRAME_BYTES` and a header announcing one is an error at once; feeding the bytes in
//! chunks gives the same frames as all at once; every decoded item re-encodes to a frame that
//! decodes to it.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use switchyard_core::EngineError;
use switchyard_core::protocol::GenerateOutput;
use switchyard_fuzz::{same, samples, seed};
use switchyard_runtime::net::http::{MAX_FRAME_BYTES, decode_frame, encode_frame};

type Item = Result<Result<GenerateOutput, EngineError>, EngineError>;

/// Decodes what `buffer` holds, checking each step; stops at the first error.
fn drain(buffer: &mut BytesMut, out: &mut Vec<Item>) -> bool {
    loop {
        let before = buffer.len();
        let header = (before >= 4).then(|| {
            u32::from_be_bytes([buffer[0], buffer[1], buffer[2], buffer[3]]) as usize
        });
        match decode_frame(buffer) {
            None => {
                assert_eq!(buffer.len(), before, "no frame, but bytes were consumed");
                assert!(
                    header.is_none_or(|len| len <= MAX_FRAME_BYTES && before < 4 + len),
                    "a whole (or oversized) frame was left undecoded"
                );
                return true;
            }
            Some(Err(e)) => {
                out.push(Err(e));
                return false;
            }
            Some(Ok(item)) => {
                let len = header.expect("a frame has a header");
                assert!(len <= MAX_FRAME_BYTES, "a {len}-byte frame was accepted");
                assert_eq!(before - buffer.len(), 4 + len, "consumed other than one frame");
                let again = encode_frame(&item);
                let mut copy = BytesMut::from(&again[..]);
                match decode_frame(&mut copy) {
                    Some(Ok(back)) => assert!(same(&back, &item), "{item:?} re-decodes as {back:?}"),
                    other => panic!("{item:?} re-encodes to a frame that decodes as {other:?}"),
                }
                assert!(copy.is_empty());
                out.push(Ok(item));
            }
        }
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let items: Vec<Result<GenerateOutput, EngineError>> = samples::outputs()
        .into_iter()
        .map(Ok)
        .chain(samples::errors().into_iter().map(Err))
        .collect();
    let stream = |items: &[Result<GenerateOutput, EngineError>]| -> Vec<u8> {
        items.iter().flat_map(|item| encode_frame(item).to_vec()).collect()
    };
    let mut out = Vec::new();
    for chunk in [0u8, 1, 7] {
        out.push([vec![chunk], stream(&items[..4])].concat());
    }
    out.push([vec![0], stream(&items)].concat());
    out.push([vec![0], (MAX_FRAME_BYTES as u32 + 1).to_be_bytes().to_vec()].concat());
    out
}

fuzz_target!(init: seed(seeds()), |data: &[u8]| {
    let Some((&chunk, body)) = data.split_first() else {
        return;
    };
    let mut whole = BytesMut::from(body);
    let mut want = Vec::new();
    drain(&mut whole, &mut want);

    let mut buffer = BytesMut::new();
    let mut got = Vec::new();
    for piece in body.chunks(usize::from(chunk).max(1)) {
        buffer.extend_from_slice(piece);
        if !drain(&mut buffer, &mut got) {
            break;
        }
    }
    assert!(
        got.len() == want.len() && got.iter().zip(&want).all(|(g, w)| match (g, w) {
            (Ok(a), Ok(b)) => same(a, b),
            (Err(_), Err(_)) => true,
            _ => false,
        }),
        "chunked decoding differs\n got: {got:?}\nwant: {want:?}"
    );
});

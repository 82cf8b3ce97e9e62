//! The RESP request parser on arbitrary bytes, fed in two pieces split where the input says: never
//! panics, never returns an empty command or more arguments than allowed, never holds more than
//! one partial request, and parses the same commands however the input is split.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use onekv_resp::protocol::{ParserLimits, RequestParser};

const LIMITS: ParserLimits =
    ParserLimits { max_args: 16, max_bulk_bytes: 256, max_inline_bytes: 512, max_request_bytes: 1024 };

/// Every command parsed, and whether parsing stopped at a protocol error.
fn parse(pieces: &[&[u8]]) -> (Vec<Vec<Vec<u8>>>, bool) {
    let mut parser = RequestParser::new(LIMITS);
    let mut buffer = BytesMut::new();
    let mut commands = Vec::new();
    for piece in pieces {
        buffer.extend_from_slice(piece);
        loop {
            match parser.parse(&mut buffer) {
                Ok(Some(command)) => {
                    assert!(!command.is_empty() && command.len() <= LIMITS.max_args);
                    assert!(
                        command.iter().map(Vec::len).sum::<usize>()
                            <= LIMITS.max_request_bytes.max(LIMITS.max_inline_bytes)
                    );
                    commands.push(command);
                }
                Ok(None) => break,
                Err(_) => return (commands, true),
            }
        }
        // What is left is at most one partial element: a bulk string with its CRLF, an inline
        // line, or a header line (the parser keeps the arguments it already has, not their bytes).
        assert!(buffer.len() <= (LIMITS.max_bulk_bytes + 2).max(LIMITS.max_inline_bytes) + 64);
    }
    (commands, false)
}

fuzz_target!(|input: &[u8]| {
    let Some((&split, data)) = input.split_first() else { return };
    let split = usize::from(split).min(data.len());
    let whole = parse(&[data]);
    let pieces = parse(&[&data[..split], &data[split..]]);
    assert_eq!(whole, pieces);
});

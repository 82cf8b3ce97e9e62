//! The RESP wire format: an incremental request parser with hard size limits, and the reply
//! encoder (RESP2 and RESP3).
//!
//! Owns: turning bytes from a client into commands (argument vectors) and replies into bytes.
//! Requests come in Redis's two forms: multibulk (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`, what every
//! client library sends) and inline (`GET k\n`, what a person types into telnet; quoting follows
//! Redis's `sdssplitargs`). Does not own what a command means (`commands`, `exec`) or the socket
//! (`server`).
//!
//! The parser keeps its progress between calls, so a request arriving one byte at a time costs no
//! more than one arriving whole, and every length it reads is checked against [`ParserLimits`]
//! before anything is allocated. A violation is a [`ProtocolError`]; like Redis, the server answers
//! it with `-ERR Protocol error: ...` and closes the connection, because the stream can no longer be
//! framed.

use bytes::{Buf as _, BytesMut};

/// The longest `*N` or `$N` line accepted (digits and sign; Redis allows 1024*1024*1024 bulk
/// lengths, which need 10 digits).
const MAX_LENGTH_LINE: usize = 32;

/// Bounds on one request, checked while it is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParserLimits {
    /// Most arguments in one command, the command name included.
    pub max_args: usize,
    /// Longest single argument of a multibulk request, in bytes.
    pub max_bulk_bytes: usize,
    /// Longest inline request line, in bytes (Redis: 64 KiB).
    pub max_inline_bytes: usize,
    /// Most argument bytes in one multibulk request, all arguments together.
    pub max_request_bytes: usize,
}

impl Default for ParserLimits {
    fn default() -> Self {
        ParserLimits {
            max_args: 4096,
            max_bulk_bytes: (1 << 20) + (64 << 10),
            max_inline_bytes: 64 << 10,
            max_request_bytes: 8 << 20,
        }
    }
}

/// A request that cannot be parsed: the connection cannot be framed any more and is closed.
/// Displays as Redis words it, `Protocol error: ...`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

fn protocol_error(message: impl Into<String>) -> ProtocolError {
    ProtocolError(message.into())
}

/// Where the parser is inside the current request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between requests.
    Idle,
    /// Inside a multibulk request, expecting a `$N` line; `remaining` arguments to go.
    Header { remaining: usize },
    /// Inside a multibulk request, expecting `len` bytes and CRLF.
    Payload { remaining: usize, len: usize },
}

/// An incremental request parser (requests are the same in RESP2 and RESP3). Feed it the
/// connection's input buffer; it consumes complete pieces and keeps partial state, so input may be
/// split at any byte.
#[derive(Debug)]
pub struct RequestParser {
    limits: ParserLimits,
    state: State,
    args: Vec<Vec<u8>>,
    request_bytes: usize,
    /// How much of the buffer is known to hold no newline (an inline request still arriving), so
    /// a long line arriving in pieces is scanned once.
    inline_scanned: usize,
}

impl RequestParser {
    /// A parser enforcing `limits`.
    pub fn new(limits: ParserLimits) -> RequestParser {
        RequestParser { limits, state: State::Idle, args: Vec::new(), request_bytes: 0, inline_scanned: 0 }
    }

    /// Whether the parser is between requests (no partial request consumed from the input).
    pub fn is_idle(&self) -> bool {
        self.state == State::Idle
    }

    /// The next complete command from `input`, consuming its bytes; `Ok(None)` when more input is
    /// needed (what was parsed so far is kept). Empty requests (`*0`, blank inline lines) are
    /// skipped, as Redis does. The returned vector is never empty.
    pub fn parse(&mut self, input: &mut BytesMut) -> Result<Option<Vec<Vec<u8>>>, ProtocolError> {
        loop {
            match self.state {
                State::Idle => {
                    let Some(&first) = input.first() else { return Ok(None) };
                    if first == b'*' {
                        let Some(count) = self.length_line(input, "multibulk")? else { return Ok(None) };
                        if count <= 0 {
                            continue;
                        }
                        let count = usize::try_from(count).unwrap_or(usize::MAX);
                        if count > self.limits.max_args {
                            return Err(protocol_error(format!(
                                "invalid multibulk length ({count} arguments; at most {} allowed)",
                                self.limits.max_args
                            )));
                        }
                        // Capacity from the wire is capped: a count is a claim, not an allocation.
                        self.args = Vec::with_capacity(count.min(64));
                        self.request_bytes = 0;
                        self.state = State::Header { remaining: count };
                    } else {
                        match self.inline(input)? {
                            None => return Ok(None),
                            Some(args) if args.is_empty() => continue,
                            Some(args) => return Ok(Some(args)),
                        }
                    }
                }
                State::Header { remaining } => {
                    if remaining == 0 {
                        self.state = State::Idle;
                        return Ok(Some(std::mem::take(&mut self.args)));
                    }
                    let Some(&first) = input.first() else { return Ok(None) };
                    if first != b'$' {
                        return Err(protocol_error(format!("expected '$', got '{}'", char::from(first))));
                    }
                    let Some(len) = self.length_line(input, "bulk")? else { return Ok(None) };
                    let len = usize::try_from(len)
                        .ok()
                        .filter(|&len| len <= self.limits.max_bulk_bytes)
                        .ok_or_else(|| {
                            protocol_error(format!(
                                "invalid bulk length ({len}; at most {} bytes allowed)",
                                self.limits.max_bulk_bytes
                            ))
                        })?;
                    self.request_bytes = self.request_bytes.saturating_add(len);
                    if self.request_bytes > self.limits.max_request_bytes {
                        return Err(protocol_error(format!(
                            "request too large (more than {} bytes of arguments)",
                            self.limits.max_request_bytes
                        )));
                    }
                    self.state = State::Payload { remaining, len };
                }
                State::Payload { remaining, len } => {
                    if input.len() < len + 2 {
                        // The length was checked against the limit, so this reservation is bounded.
                        input.reserve(len + 2 - input.len());
                        return Ok(None);
                    }
                    if &input[len..len + 2] != b"\r\n" {
                        return Err(protocol_error("expected CRLF after a bulk argument"));
                    }
                    let arg = input.split_to(len).to_vec();
                    input.advance(2);
                    self.args.push(arg);
                    self.state = State::Header { remaining: remaining - 1 };
                }
            }
        }
    }

    /// Reads a `*N` / `$N` line (the marker byte is `input[0]`) and returns N, consuming the line;
    /// `None` if the line is not complete yet.
    fn length_line(&mut self, input: &mut BytesMut, what: &str) -> Result<Option<i64>, ProtocolError> {
        let window = &input[..input.len().min(MAX_LENGTH_LINE + 2)];
        let Some(cr) = window.iter().position(|&byte| byte == b'\r') else {
            // Only a full window without CR is too long: its CR may still come as the window's
            // last byte, so the answer does not depend on how the bytes were split into reads.
            if window.len() == MAX_LENGTH_LINE + 2 {
                return Err(protocol_error(format!("too big {what} count string")));
            }
            return Ok(None);
        };
        let Some(&after) = input.get(cr + 1) else { return Ok(None) };
        if after != b'\n' {
            return Err(protocol_error(format!("expected LF after the {what} length")));
        }
        let number =
            parse_length(&input[1..cr]).ok_or_else(|| protocol_error(format!("invalid {what} length")))?;
        input.advance(cr + 2);
        Ok(Some(number))
    }

    /// Reads one inline request line (ended by `\n`, an optional `\r` before it), splitting it into
    /// arguments; `None` if the line is not complete yet.
    fn inline(&mut self, input: &mut BytesMut) -> Result<Option<Vec<Vec<u8>>>, ProtocolError> {
        let from = self.inline_scanned.min(input.len());
        let Some(offset) = input[from..].iter().position(|&byte| byte == b'\n') else {
            self.inline_scanned = input.len();
            if input.len() > self.limits.max_inline_bytes {
                return Err(protocol_error("too big inline request"));
            }
            return Ok(None);
        };
        let newline = from + offset;
        self.inline_scanned = 0;
        if newline > self.limits.max_inline_bytes {
            return Err(protocol_error("too big inline request"));
        }
        let mut line = &input[..newline];
        if let [rest @ .., b'\r'] = line {
            line = rest;
        }
        let args = split_args(line).ok_or_else(|| protocol_error("unbalanced quotes in request"))?;
        if args.len() > self.limits.max_args {
            return Err(protocol_error(format!(
                "too many arguments in an inline request (at most {})",
                self.limits.max_args
            )));
        }
        input.advance(newline + 1);
        Ok(Some(args))
    }
}

/// A `*N` or `$N` number as Redis's `string2ll` reads it: an optional `-`, digits, no leading
/// zeros (except `0` itself), no `+`, no spaces, within `i64`.
fn parse_length(digits: &[u8]) -> Option<i64> {
    let (negative, body) = match digits {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, digits),
    };
    if body.is_empty() || !body.iter().all(u8::is_ascii_digit) || (body.len() > 1 && body[0] == b'0') {
        return None;
    }
    let text = std::str::from_utf8(body).ok()?;
    let value: i64 = text.parse().ok()?;
    Some(if negative { -value } else { value })
}

/// Splits an inline request into arguments the way Redis's `sdssplitargs` does: spaces separate
/// arguments; `"..."` understands `\n \r \t \b \a \\ \"` and `\xHH`; `'...'` understands `\'`; a
/// closing quote must be followed by a space or the end; a NUL byte ends the line. `None` on
/// unbalanced quotes.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    // Redis splits a C string: a NUL byte ends the line.
    let line = line.split(|&byte| byte == 0).next().unwrap_or_default();
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while i < line.len() && is_space(line[i]) {
            i += 1;
        }
        if i >= line.len() {
            return Some(args);
        }
        let mut current = Vec::new();
        let mut in_double = false;
        let mut in_single = false;
        loop {
            let byte = line.get(i).copied();
            if in_double {
                match byte? {
                    b'\\'
                        if line.get(i + 1) == Some(&b'x')
                            && line.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
                            && line.get(i + 3).is_some_and(u8::is_ascii_hexdigit) =>
                    {
                        current.push(hex(line[i + 2]) * 16 + hex(line[i + 3]));
                        i += 4;
                        continue;
                    }
                    b'\\' if i + 1 < line.len() => {
                        current.push(match line[i + 1] {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 0x08,
                            b'a' => 0x07,
                            other => other,
                        });
                        i += 2;
                        continue;
                    }
                    b'"' => {
                        // The closing quote must end the argument.
                        if line.get(i + 1).is_some_and(|&next| !is_space(next)) {
                            return None;
                        }
                        i += 1;
                        break;
                    }
                    other => current.push(other),
                }
            } else if in_single {
                match byte? {
                    b'\\' if line.get(i + 1) == Some(&b'\'') => {
                        current.push(b'\'');
                        i += 2;
                        continue;
                    }
                    b'\'' => {
                        if line.get(i + 1).is_some_and(|&next| !is_space(next)) {
                            return None;
                        }
                        i += 1;
                        break;
                    }
                    other => current.push(other),
                }
            } else {
                match byte {
                    None | Some(b' ' | b'\n' | b'\r' | b'\t') => break,
                    Some(b'"') => in_double = true,
                    Some(b'\'') => in_single = true,
                    Some(other) => current.push(other),
                }
            }
            i += 1;
        }
        args.push(current);
    }
}

/// C's `isspace` in the "C" locale.
fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

fn hex(digit: u8) -> u8 {
    match digit {
        b'0'..=b'9' => digit - b'0',
        b'a'..=b'f' => digit - b'a' + 10,
        _ => digit - b'A' + 10,
    }
}

/// The reply encoding a connection has chosen with `HELLO`: RESP2 until it asks for RESP3.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Protocol {
    /// RESP2, every connection's protocol at first.
    #[default]
    Resp2,
    /// RESP3 (`HELLO 3`): typed nulls, maps and verbatim strings.
    Resp3,
}

impl Protocol {
    /// The version number `HELLO` and `CLIENT INFO` report.
    pub fn version(self) -> i64 {
        match self {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        }
    }
}

/// One reply, encoded for the connection's [`Protocol`]. The RESP3-only shapes have a RESP2 form,
/// the one Redis uses: a map is a flat array of keys and values, a null is `$-1` or `*-1`, a
/// verbatim string a bulk string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+text`: a status such as `OK` or `PONG`.
    Simple(String),
    /// `-CODE message`: the text must start with an error code such as `ERR`.
    Error(String),
    /// `:n`.
    Integer(i64),
    /// `$len` and the bytes.
    Bulk(Vec<u8>),
    /// The null bulk string (an absent key): `$-1` in RESP2, `_` in RESP3.
    Nil,
    /// `*n` and the elements.
    Array(Vec<Reply>),
    /// The null array: `*-1` in RESP2, `_` in RESP3.
    NilArray,
    /// A map: `%n` and the pairs in RESP3, a flat array of `2n` elements in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// Plain text: `=len` and `txt:` before it in RESP3, a bulk string in RESP2.
    Verbatim(String),
    /// A floating-point number (a sorted set's score), already written as Redis 7.0 writes it
    /// ([`format_double`]; made by [`Reply::double`]): `,` and the text in RESP3, a bulk string in
    /// RESP2.
    Double(String),
    /// Pairs that are not a map (they may repeat): an array of two-element arrays in RESP3, a flat
    /// array of `2n` elements in RESP2 (`HRANDFIELD ... WITHVALUES`).
    Pairs(Vec<(Reply, Reply)>),
}

impl Reply {
    /// `+OK`.
    pub fn ok() -> Reply {
        Reply::Simple("OK".into())
    }

    /// `-ERR message`.
    pub fn err(message: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {message}"))
    }

    /// A bulk string of `text`.
    pub fn text(text: impl Into<String>) -> Reply {
        Reply::Bulk(text.into().into_bytes())
    }

    /// A double reply of `value`.
    pub fn double(value: f64) -> Reply {
        Reply::Double(format_double(value))
    }

    /// `Bulk` for `Some`, `Nil` for `None`.
    pub fn optional(value: Option<Vec<u8>>) -> Reply {
        value.map_or(Reply::Nil, Reply::Bulk)
    }

    /// A map whose keys are texts.
    pub fn map<'a>(pairs: impl IntoIterator<Item = (&'a str, Reply)>) -> Reply {
        Reply::Map(pairs.into_iter().map(|(key, value)| (Reply::text(key), value)).collect())
    }

    /// Whether this is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// Appends the wire form of the reply in `protocol` to `out`.
    pub fn encode(&self, out: &mut Vec<u8>, protocol: Protocol) {
        let resp3 = protocol == Protocol::Resp3;
        match self {
            Reply::Simple(text) => line(out, b'+', text),
            Reply::Error(text) => line(out, b'-', text),
            Reply::Integer(n) => header(out, b':', &n.to_string()),
            Reply::Bulk(bytes) => {
                header(out, b'$', &bytes.len().to_string());
                out.extend_from_slice(bytes);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Nil | Reply::NilArray if resp3 => out.extend_from_slice(b"_\r\n"),
            Reply::Nil => out.extend_from_slice(b"$-1\r\n"),
            Reply::NilArray => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(items) => {
                header(out, b'*', &items.len().to_string());
                for item in items {
                    item.encode(out, protocol);
                }
            }
            Reply::Map(pairs) | Reply::Pairs(pairs) => {
                let map = matches!(self, Reply::Map(_));
                match (resp3, map) {
                    (true, true) => header(out, b'%', &pairs.len().to_string()),
                    (true, false) => header(out, b'*', &pairs.len().to_string()),
                    (false, _) => header(out, b'*', &(2 * pairs.len()).to_string()),
                }
                for (first, second) in pairs {
                    if resp3 && !map {
                        header(out, b'*', "2");
                    }
                    first.encode(out, protocol);
                    second.encode(out, protocol);
                }
            }
            Reply::Double(text) => {
                if resp3 {
                    line(out, b',', text);
                } else {
                    header(out, b'$', &text.len().to_string());
                    out.extend_from_slice(text.as_bytes());
                    out.extend_from_slice(b"\r\n");
                }
            }
            Reply::Verbatim(text) if resp3 => {
                header(out, b'=', &(text.len() + 4).to_string());
                out.extend_from_slice(b"txt:");
                out.extend_from_slice(text.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Reply::Verbatim(text) => {
                header(out, b'$', &text.len().to_string());
                out.extend_from_slice(text.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
        }
    }

    /// The wire form of the reply in `protocol`.
    pub fn to_bytes(&self, protocol: Protocol) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out, protocol);
        out
    }
}

/// A double as Redis 7.0 writes it: C's `%.17g` (17 significant digits, the shorter of fixed and
/// exponent notation, trailing zeros dropped), `inf` and `-inf` for the infinities.
pub fn format_double(value: f64) -> String {
    if value.is_infinite() {
        return if value > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if value.is_nan() {
        return "nan".into();
    }
    if value == 0.0 {
        return if value.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    let scientific = format!("{value:.16e}");
    let (mantissa, exponent) = scientific.split_once('e').expect("exponent notation");
    let exponent: i32 = exponent.parse().expect("an exponent");
    let trim = |text: &str| -> String {
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            text.to_string()
        }
    };
    if !(-4..17).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exponent.unsigned_abs())
    } else {
        trim(&format!("{value:.*}", (16 - exponent) as usize))
    }
}

/// A type marker, a number and CRLF: `*3\r\n`, `:7\r\n`, ...
fn header(out: &mut Vec<u8>, marker: u8, number: &str) {
    out.push(marker);
    out.extend_from_slice(number.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// A status or error line: CR and LF would end it early, so they become spaces (as Redis does).
fn line(out: &mut Vec<u8>, marker: u8, text: &str) {
    out.push(marker);
    out.extend(text.bytes().map(|byte| if byte == b'\r' || byte == b'\n' { b' ' } else { byte }));
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|item| item.as_bytes().to_vec()).collect()
    }

    /// Every command in `input`, fed in one piece.
    fn parse_all(input: &[u8], limits: ParserLimits) -> Result<Vec<Vec<Vec<u8>>>, ProtocolError> {
        let mut parser = RequestParser::new(limits);
        let mut buffer = BytesMut::from(input);
        let mut commands = Vec::new();
        while let Some(command) = parser.parse(&mut buffer)? {
            commands.push(command);
        }
        Ok(commands)
    }

    /// Every command in `input`, fed in the given pieces, parsing after each.
    fn parse_pieces(pieces: &[&[u8]]) -> Result<Vec<Vec<Vec<u8>>>, ProtocolError> {
        let mut parser = RequestParser::new(ParserLimits::default());
        let mut buffer = BytesMut::new();
        let mut commands = Vec::new();
        for piece in pieces {
            buffer.extend_from_slice(piece);
            while let Some(command) = parser.parse(&mut buffer)? {
                commands.push(command);
            }
        }
        Ok(commands)
    }

    const PIPELINE: &[u8] = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nv\r\nal\r\nGET k\r\n*0\r\n\r\n\
        *2\r\n$4\r\nECHO\r\n$0\r\n\r\nset \"a b\" 'c\\'d' \"\\x41\\n\"\n*-1\r\n*1\r\n$4\r\nPING\r\n";

    fn pipeline_commands() -> Vec<Vec<Vec<u8>>> {
        vec![
            vec![b"SET".to_vec(), b"k".to_vec(), b"v\r\nal".to_vec()],
            args(&["GET", "k"]),
            vec![b"ECHO".to_vec(), Vec::new()],
            vec![b"set".to_vec(), b"a b".to_vec(), b"c'd".to_vec(), b"A\n".to_vec()],
            args(&["PING"]),
        ]
    }

    #[test]
    fn multibulk_inline_and_empty_requests() {
        assert_eq!(parse_all(PIPELINE, ParserLimits::default()).unwrap(), pipeline_commands());
    }

    #[test]
    fn a_pipeline_split_at_every_byte_boundary_parses_the_same() {
        for split in 0..=PIPELINE.len() {
            let (head, tail) = PIPELINE.split_at(split);
            assert_eq!(parse_pieces(&[head, tail]).unwrap(), pipeline_commands(), "split at {split}");
        }
        for first in 0..=PIPELINE.len() {
            for second in first..=PIPELINE.len() {
                let pieces = [&PIPELINE[..first], &PIPELINE[first..second], &PIPELINE[second..]];
                assert_eq!(parse_pieces(&pieces).unwrap(), pipeline_commands(), "{first}/{second}");
            }
        }
        let bytes: Vec<&[u8]> = PIPELINE.chunks(1).collect();
        assert_eq!(parse_pieces(&bytes).unwrap(), pipeline_commands());
    }

    #[test]
    fn a_length_line_is_judged_alike_however_it_is_split() {
        // A line whose CR is the last byte the window allows (found by the resp_parse fuzz target:
        // fed without its last byte, the line was "too big", fed whole it was incomplete).
        let mut line = b"*".to_vec();
        line.extend(std::iter::repeat_n(b'1', MAX_LENGTH_LINE));
        line.push(b'\r');
        for split in 0..=line.len() {
            let (head, tail) = line.split_at(split);
            assert!(parse_pieces(&[head, tail]).unwrap().is_empty(), "split at {split}: waits for LF");
        }
        line.push(b'\n');
        let error = parse_pieces(&[&line[..MAX_LENGTH_LINE + 1], &line[MAX_LENGTH_LINE + 1..]]).unwrap_err();
        assert!(error.0.contains("invalid multibulk length"), "{error}");
        line.insert(1, b'1');
        for split in 0..=line.len() {
            let (head, tail) = line.split_at(split);
            let error = parse_pieces(&[head, tail]).unwrap_err();
            assert!(error.0.contains("too big multibulk count string"), "split at {split}: {error}");
        }
    }

    #[test]
    fn incomplete_input_waits_and_keeps_the_rest() {
        let mut parser = RequestParser::new(ParserLimits::default());
        let mut buffer = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$1\r\n"[..]);
        assert_eq!(parser.parse(&mut buffer).unwrap(), None);
        assert!(!parser.is_idle());
        buffer.extend_from_slice(b"k\r\nPI");
        assert_eq!(parser.parse(&mut buffer).unwrap(), Some(args(&["GET", "k"])));
        assert!(parser.is_idle());
        assert_eq!(parser.parse(&mut buffer).unwrap(), None);
        assert_eq!(&buffer[..], b"PI");
        buffer.extend_from_slice(b"NG\n");
        assert_eq!(parser.parse(&mut buffer).unwrap(), Some(args(&["PING"])));
        assert!(buffer.is_empty());
    }

    #[test]
    fn inline_quoting_follows_redis() {
        let cases: &[(&str, &[&str])] = &[
            ("  get   k  ", &["get", "k"]),
            ("set k \"\"", &["set", "k", ""]),
            ("echo \"a\\tb\\\\c\\\"\"", &["echo", "a\tb\\c\""]),
            ("echo a\"b c\"", &["echo", "ab c"]),
            ("echo '\\n'", &["echo", "\\n"]),
            ("", &[]),
            ("get k\0ignored", &["get", "k"]),
        ];
        for (line, expected) in cases {
            assert_eq!(split_args(line.as_bytes()), Some(args(expected)), "{line}");
        }
        for unbalanced in ["echo \"abc", "echo 'abc", "echo \"a\"b", "echo 'a'b"] {
            assert_eq!(split_args(unbalanced.as_bytes()), None, "{unbalanced}");
        }
    }

    #[test]
    fn malformed_input_is_a_protocol_error() {
        let cases: &[(&[u8], &str)] = &[
            (b"*x\r\n", "invalid multibulk length"),
            (b"*+1\r\n", "invalid multibulk length"),
            (b"*01\r\n", "invalid multibulk length"),
            (b"*1\r\nGET\r\n", "expected '$', got 'G'"),
            (b"*1\r\n$-1\r\n", "invalid bulk length"),
            (b"*1\r\n$ 3\r\n", "invalid bulk length"),
            (b"*1\r\n$3\r\nGETX\r\n", "expected CRLF"),
            (b"*1\r\n$3\rX", "expected LF"),
            (b"*1111111111111111111111111111111111111111", "too big multibulk count string"),
            (b"GET \"k\n", "unbalanced quotes"),
        ];
        for (input, message) in cases {
            let error = parse_all(input, ParserLimits::default()).unwrap_err();
            assert!(error.to_string().starts_with("Protocol error: "), "{error}");
            assert!(error.0.contains(message), "{:?}: {error}", String::from_utf8_lossy(input));
        }
    }

    #[test]
    fn size_limits_are_enforced_before_allocation() {
        let limits =
            ParserLimits { max_args: 3, max_bulk_bytes: 10, max_inline_bytes: 16, max_request_bytes: 15 };
        assert!(parse_all(b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n", limits).is_ok());
        let too_many = parse_all(b"*4\r\n", limits).unwrap_err();
        assert!(too_many.0.contains("at most 3"), "{too_many}");
        let huge = parse_all(b"*1\r\n$9999999999\r\n", limits).unwrap_err();
        assert!(huge.0.contains("invalid bulk length"), "{huge}");
        let bulk = parse_all(b"*1\r\n$11\r\n", limits).unwrap_err();
        assert!(bulk.0.contains("at most 10 bytes"), "{bulk}");
        let request = parse_all(b"*2\r\n$10\r\n0123456789\r\n$6\r\n", limits).unwrap_err();
        assert!(request.0.contains("request too large"), "{request}");
        // An inline line is refused once it is longer than the limit, even without its newline.
        let inline = parse_all(&[b'a'; 17], limits).unwrap_err();
        assert!(inline.0.contains("too big inline request"), "{inline}");
        assert_eq!(parse_all(&[b'a'; 16], limits).unwrap(), Vec::<Vec<Vec<u8>>>::new());
        let args_inline = parse_all(b"a b c d\n", limits).unwrap_err();
        assert!(args_inline.0.contains("too many arguments"), "{args_inline}");
        // A huge declared count allocates nothing up front.
        let limits = ParserLimits { max_args: usize::MAX, ..limits };
        let mut parser = RequestParser::new(limits);
        let mut buffer = BytesMut::from(&b"*9223372036854775807\r\n"[..]);
        assert_eq!(parser.parse(&mut buffer).unwrap(), None);
        assert!(parser.args.capacity() <= 64);
    }

    #[test]
    fn replies_encode_as_redis_does() {
        let reply = Reply::Array(vec![
            Reply::ok(),
            Reply::err("bad\r\nthing"),
            Reply::Integer(-3),
            Reply::Bulk(b"a\r\nb".to_vec()),
            Reply::Nil,
            Reply::NilArray,
            Reply::Array(Vec::new()),
        ]);
        assert_eq!(
            reply.to_bytes(Protocol::Resp2),
            b"*7\r\n+OK\r\n-ERR bad  thing\r\n:-3\r\n$4\r\na\r\nb\r\n$-1\r\n*-1\r\n*0\r\n".to_vec()
        );
        // RESP3 changes only the nulls here.
        assert_eq!(
            reply.to_bytes(Protocol::Resp3),
            b"*7\r\n+OK\r\n-ERR bad  thing\r\n:-3\r\n$4\r\na\r\nb\r\n_\r\n_\r\n*0\r\n".to_vec()
        );
    }

    #[test]
    fn resp3_types_have_their_resp2_forms() {
        let map = Reply::map([("a", Reply::Integer(1)), ("b", Reply::Nil)]);
        assert_eq!(map.to_bytes(Protocol::Resp3), b"%2\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n_\r\n".to_vec());
        assert_eq!(map.to_bytes(Protocol::Resp2), b"*4\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n$-1\r\n".to_vec());
        assert_eq!(Reply::Map(Vec::new()).to_bytes(Protocol::Resp3), b"%0\r\n".to_vec());
        assert_eq!(Reply::Map(Vec::new()).to_bytes(Protocol::Resp2), b"*0\r\n".to_vec());
        for (value, text) in [
            (1.0, "1"),
            (1.5, "1.5"),
            (0.1, "0.10000000000000001"),
            (-2.5e-7, "-2.4999999999999999e-07"),
            // The 20th smallest subnormal (Redis's ZSCAN regression test for issue #2175).
            (f64::from_bits(20), "9.8813129168249309e-323"),
            (1e17, "1e+17"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (0.0, "0"),
        ] {
            assert_eq!(format_double(value), text, "{value}");
        }
        assert_eq!(Reply::double(1.5).to_bytes(Protocol::Resp2), b"$3\r\n1.5\r\n".to_vec());
        assert_eq!(Reply::double(1.5).to_bytes(Protocol::Resp3), b",1.5\r\n".to_vec());
        let pairs =
            Reply::Pairs(vec![(Reply::text("f"), Reply::text("v")), (Reply::text("f"), Reply::text("v"))]);
        assert_eq!(
            pairs.to_bytes(Protocol::Resp3),
            b"*2\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n".to_vec()
        );
        assert_eq!(
            pairs.to_bytes(Protocol::Resp2),
            b"*4\r\n$1\r\nf\r\n$1\r\nv\r\n$1\r\nf\r\n$1\r\nv\r\n".to_vec()
        );
        // Nested: a map inside an array inside a map.
        let nested = Reply::map([("m", Reply::Array(vec![Reply::map([("k", Reply::NilArray)])]))]);
        assert_eq!(
            nested.to_bytes(Protocol::Resp3),
            b"%1\r\n$1\r\nm\r\n*1\r\n%1\r\n$1\r\nk\r\n_\r\n".to_vec()
        );
        assert_eq!(
            nested.to_bytes(Protocol::Resp2),
            b"*2\r\n$1\r\nm\r\n*1\r\n*2\r\n$1\r\nk\r\n*-1\r\n".to_vec()
        );
        let verbatim = Reply::Verbatim("id=1 resp=3\n".into());
        assert_eq!(verbatim.to_bytes(Protocol::Resp3), b"=16\r\ntxt:id=1 resp=3\n\r\n".to_vec());
        assert_eq!(verbatim.to_bytes(Protocol::Resp2), b"$12\r\nid=1 resp=3\n\r\n".to_vec());
        assert_eq!(Protocol::default(), Protocol::Resp2);
        assert_eq!((Protocol::Resp2.version(), Protocol::Resp3.version()), (2, 3));
    }

    proptest::proptest! {
        /// Arbitrary bytes never panic the parser, and whatever it accepts it consumed.
        #[test]
        fn arbitrary_input_never_panics(input in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let limits = ParserLimits { max_args: 8, max_bulk_bytes: 64, max_inline_bytes: 64, max_request_bytes: 128 };
            let mut parser = RequestParser::new(limits);
            let mut buffer = BytesMut::from(&input[..]);
            while let Ok(Some(command)) = parser.parse(&mut buffer) {
                proptest::prop_assert!(!command.is_empty() && command.len() <= 8);
            }
        }

        /// Any list of commands, encoded as multibulk, parses back to itself whatever the split.
        #[test]
        fn multibulk_round_trips(
            commands in proptest::collection::vec(
                proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20), 1..5),
                1..5,
            ),
            split in 0usize..400,
        ) {
            let mut wire = Vec::new();
            for command in &commands {
                let reply = Reply::Array(command.iter().cloned().map(Reply::Bulk).collect());
                reply.encode(&mut wire, Protocol::Resp2);
            }
            let split = split.min(wire.len());
            let parsed = parse_pieces(&[&wire[..split], &wire[split..]]).unwrap();
            proptest::prop_assert_eq!(parsed, commands);
        }
    }
}

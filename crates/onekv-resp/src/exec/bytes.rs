//! Pure operations on string values, with Redis's index conventions: ranges (GETRANGE,
//! SETRANGE), bits (GETBIT, SETBIT, BITCOUNT, BITPOS), float increments (INCRBYFLOAT), the longest
//! common subsequence (LCS) and OBJECT ENCODING's classification.
//!
//! Owns: the arithmetic of these commands, shared by a command that runs alone and one inside a
//! transaction. Does no I/O and parses no command (the callers in `strings` and `reads` do).

use super::parse_integer;

/// `start..end` (end exclusive) of a value of `len` bytes (or bits) for GETRANGE's and BITCOUNT's
/// inclusive `start` and `end`, negative counting from the end; `None` when the range is empty.
pub(super) fn inclusive_range(len: usize, start: i64, end: i64) -> Option<(usize, usize)> {
    if start < 0 && end < 0 && start > end {
        return None;
    }
    clamped_range(len, start, end)
}

/// [`inclusive_range`] without its first rule (two negative offsets in reverse order select
/// nothing), as BITPOS converts its range: both are clamped to the value instead.
fn clamped_range(len: usize, start: i64, end: i64) -> Option<(usize, usize)> {
    let len = i64::try_from(len).unwrap_or(i64::MAX);
    let start = if start < 0 { len.saturating_add(start) } else { start }.max(0);
    let mut end = if end < 0 { len.saturating_add(end) } else { end }.max(0);
    if end >= len {
        end = len - 1;
    }
    if start > end || len == 0 {
        return None;
    }
    // Both are within 0..len here.
    Some((start as usize, end as usize + 1))
}

/// GETRANGE: the bytes of `value` from `start` to `end`, inclusive.
pub(super) fn get_range(value: &[u8], start: i64, end: i64) -> Vec<u8> {
    inclusive_range(value.len(), start, end).map_or_else(Vec::new, |(start, end)| value[start..end].to_vec())
}

/// SETRANGE: `value` with `patch` written at `offset` (zero-padded), or `None` when nothing
/// changes (an empty patch). The caller checks the resulting length.
pub(super) fn set_range(value: Option<&[u8]>, offset: usize, patch: &[u8]) -> Option<Vec<u8>> {
    if patch.is_empty() {
        return None;
    }
    let mut value = value.unwrap_or_default().to_vec();
    let end = offset + patch.len();
    if value.len() < end {
        value.resize(end, 0);
    }
    value[offset..end].copy_from_slice(patch);
    Some(value)
}

/// GETBIT: the bit at `offset` (bit 0 is the most significant bit of the first byte).
pub(super) fn get_bit(value: &[u8], offset: usize) -> u8 {
    value.get(offset / 8).map_or(0, |byte| (byte >> (7 - offset % 8)) & 1)
}

/// SETBIT: `value` with the bit at `offset` set to `bit`, zero-padded as needed, and the bit's
/// previous value.
pub(super) fn set_bit(value: Option<&[u8]>, offset: usize, bit: bool) -> (Vec<u8>, u8) {
    let mut value = value.unwrap_or_default().to_vec();
    let byte = offset / 8;
    if value.len() <= byte {
        value.resize(byte + 1, 0);
    }
    let mask = 1u8 << (7 - offset % 8);
    let old = u8::from(value[byte] & mask != 0);
    if bit {
        value[byte] |= mask;
    } else {
        value[byte] &= !mask;
    }
    (value, old)
}

/// A BITCOUNT/BITPOS range: inclusive `start` and `end`, in bytes or (with BIT) in bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BitRange {
    pub(super) start: i64,
    pub(super) end: i64,
    pub(super) in_bits: bool,
}

/// The bits of `value` a range selects: the bytes they lie in, with the bits outside the range
/// forced to `outside` (0 or 1) in the first and last byte. `None`: an empty range.
fn selected_bytes(
    value: &[u8],
    range: Option<BitRange>,
    outside: bool,
    convert: fn(usize, i64, i64) -> Option<(usize, usize)>,
) -> Option<(usize, Vec<u8>)> {
    let Some(range) = range else { return Some((0, value.to_vec())) };
    let units = if range.in_bits { value.len() * 8 } else { value.len() };
    let (start, end) = convert(units, range.start, range.end)?;
    if !range.in_bits {
        return Some((start, value[start..end].to_vec()));
    }
    let last = end - 1;
    let (first_byte, last_byte) = (start / 8, last / 8);
    let mut bytes = value[first_byte..=last_byte].to_vec();
    // Bits before `start` in the first byte and after `last` in the last byte.
    let head = !(0xFFu8 >> (start % 8));
    let tail = (0xFFu16 >> (last % 8 + 1)) as u8;
    let (first, end_index) = (0, bytes.len() - 1);
    for (index, mask) in [(first, head), (end_index, tail)] {
        if outside {
            bytes[index] |= mask;
        } else {
            bytes[index] &= !mask;
        }
    }
    Some((first_byte, bytes))
}

/// BITCOUNT: the set bits in the range (the whole value without one).
pub(super) fn bit_count(value: &[u8], range: Option<BitRange>) -> u64 {
    selected_bytes(value, range, false, inclusive_range)
        .map_or(0, |(_, bytes)| bytes.iter().map(|byte| u64::from(byte.count_ones())).sum())
}

/// BITPOS: the first bit equal to `bit` in the range, as a bit offset into the value; -1 if none.
/// Looking for a 0 without an explicit end finds the first bit past the value when every bit in
/// range is 1 (the value is treated as padded with zeros), as Redis does.
pub(super) fn bit_position(value: &[u8], bit: bool, range: Option<BitRange>, end_given: bool) -> i64 {
    // An empty value is an empty range, even for a 0 bit (Redis: start 0 > end -1).
    if value.is_empty() {
        return -1;
    }
    let Some((first_byte, bytes)) = selected_bytes(value, range, !bit, clamped_range) else { return -1 };
    let found = bytes.iter().enumerate().find_map(|(index, &byte)| {
        let byte = if bit { byte } else { !byte };
        (byte != 0).then(|| index * 8 + byte.leading_zeros() as usize)
    });
    match found {
        Some(position) => (first_byte * 8 + position) as i64,
        None if !bit && !end_given => ((first_byte + bytes.len()) * 8) as i64,
        None => -1,
    }
}

/// A float as INCRBYFLOAT accepts it: decimal or exponent notation or `inf`, no spaces, not NaN
/// (an infinite increment parses, and then fails as a result that is not finite, as in Redis).
pub(super) fn parse_float(text: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(text).ok()?;
    if text.is_empty() || text.len() > 5 * 1024 || text.bytes().any(|byte| byte.is_ascii_whitespace()) {
        return None;
    }
    text.parse::<f64>().ok().filter(|value| !value.is_nan())
}

/// Why INCRBYFLOAT cannot add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FloatError {
    /// The current value or the increment is not a float.
    NotAFloat,
    /// The sum would be infinite (or NaN).
    NotFinite,
}

/// Digits after the point INCRBYFLOAT keeps: Redis prints its `long double` sum with `%.17Lf` and
/// trims the trailing zeros.
const FLOAT_DECIMALS: u32 = 17;

/// INCRBYFLOAT: `current` (absent: 0) plus `increment`, as the text Redis stores. The sum is exact
/// in decimal when both fit a 96-bit decimal (any ordinary number: `0.1 + 0.2` is `0.3`, as with
/// Redis's `long double`), else computed in 64-bit floating point; either way rounded to 17 digits
/// after the point, trailing zeros trimmed, never in exponent notation and never `-0`.
pub(super) fn add_floats(current: Option<&[u8]>, increment: &[u8]) -> Result<Vec<u8>, FloatError> {
    let current = current.unwrap_or(b"0");
    let (old, by) = (parse_float(current), parse_float(increment));
    let (Some(old), Some(by)) = (old, by) else { return Err(FloatError::NotAFloat) };
    if let (Some(old), Some(by)) = (parse_decimal(current), parse_decimal(increment))
        && let Some(sum) = old.checked_add(by)
    {
        let sum = sum
            .round_dp_with_strategy(FLOAT_DECIMALS, rust_decimal::RoundingStrategy::MidpointNearestEven)
            .normalize();
        let text = if sum.is_zero() { "0".to_string() } else { sum.to_string() };
        return Ok(text.into_bytes());
    }
    let sum = old + by;
    if !sum.is_finite() {
        return Err(FloatError::NotFinite);
    }
    Ok(format_float(sum).into_bytes())
}

/// A float's text as an exact decimal, if it is one that fits (`None`: use floating point).
fn parse_decimal(text: &[u8]) -> Option<rust_decimal::Decimal> {
    let text = std::str::from_utf8(text).ok()?;
    if text.contains(['e', 'E']) {
        rust_decimal::Decimal::from_scientific(text).ok()
    } else {
        // Exact: more digits than a 96-bit decimal holds is an error, not a rounding.
        rust_decimal::Decimal::from_str_exact(text).ok()
    }
}

/// A double as `%.17f` prints it with the trailing zeros (and point) trimmed, never `-0`.
pub(super) fn format_float(value: f64) -> String {
    let text = format!("{value:.17}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" || text.is_empty() { "0".to_string() } else { text.to_string() }
}

/// Integers below this are shared objects in Redis, and OBJECT REFCOUNT reports them as such.
const SHARED_INTEGERS: i64 = 10_000;

/// OBJECT REFCOUNT of a value: Redis's shared-object count (`i32::MAX`) for the small integers it
/// shares, 1 otherwise.
pub(super) fn reference_count(value: &[u8]) -> i64 {
    match parse_integer(value) {
        Some(integer) if (0..SHARED_INTEGERS).contains(&integer) => i64::from(i32::MAX),
        _ => 1,
    }
}

/// OBJECT ENCODING of a string value, by Redis's rules for a value as SET stores it: `int` for an
/// integer of at most 20 characters, `embstr` up to 44 bytes, `raw` above.
pub(super) fn encoding(value: &[u8]) -> &'static str {
    if value.len() <= 20 && parse_integer(value).is_some() {
        "int"
    } else if value.len() <= 44 {
        "embstr"
    } else {
        "raw"
    }
}

/// A contiguous run of a longest common subsequence: where it lies in each string (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LcsMatch {
    pub(super) a: (usize, usize),
    pub(super) b: (usize, usize),
}

impl LcsMatch {
    pub(super) fn len(&self) -> usize {
        self.a.1 - self.a.0 + 1
    }
}

/// The longest common subsequence of `a` and `b`, and its contiguous runs from the last to the
/// first, as Redis's LCS reports them. The table is `(a.len() + 1) * (b.len() + 1)` cells of four
/// bytes; the caller bounds it.
pub(super) fn longest_common_subsequence(a: &[u8], b: &[u8]) -> (Vec<u8>, Vec<LcsMatch>) {
    let width = b.len() + 1;
    let mut table = vec![0u32; (a.len() + 1) * width];
    let cell = |i: usize, j: usize| i * width + j;
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            table[cell(i, j)] = if a[i - 1] == b[j - 1] {
                table[cell(i - 1, j - 1)] + 1
            } else {
                table[cell(i - 1, j)].max(table[cell(i, j - 1)])
            };
        }
    }
    let mut common = Vec::with_capacity(table[cell(a.len(), b.len())] as usize);
    let mut matches = Vec::new();
    let mut open: Option<LcsMatch> = None;
    let (mut i, mut j) = (a.len(), b.len());
    while i > 0 && j > 0 {
        let mut close = false;
        if a[i - 1] == b[j - 1] {
            common.push(a[i - 1]);
            match &mut open {
                None => open = Some(LcsMatch { a: (i - 1, i - 1), b: (j - 1, j - 1) }),
                // The walk goes backwards, so a match right before the open run extends it.
                Some(run) if run.a.0 == i && run.b.0 == j => {
                    run.a.0 -= 1;
                    run.b.0 -= 1;
                }
                Some(_) => close = true,
            }
            if open.is_some_and(|run| run.a.0 == 0 || run.b.0 == 0) {
                close = true;
            }
            i -= 1;
            j -= 1;
        } else {
            if table[cell(i - 1, j)] > table[cell(i, j - 1)] {
                i -= 1;
            } else {
                j -= 1;
            }
            close = open.is_some();
        }
        if close && let Some(run) = open.take() {
            matches.push(run);
        }
    }
    common.reverse();
    (common, matches)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_redis() {
        let value = b"Hello World";
        assert_eq!(get_range(value, 0, 3), b"Hell");
        assert_eq!(get_range(value, -3, -1), b"rld");
        assert_eq!(get_range(value, 0, -1), value);
        assert_eq!(get_range(value, 5, 3), b"");
        assert_eq!(get_range(value, -1, -5), b"");
        assert_eq!(get_range(value, 0, 100), value);
        assert_eq!(get_range(value, -100, 1), b"He");
        assert_eq!(get_range(b"", 0, -1), b"");
        assert_eq!(get_range(value, i64::MIN, i64::MAX), value);
    }

    #[test]
    fn set_range_pads_and_overwrites() {
        assert_eq!(set_range(None, 3, b"ab"), Some(b"\0\0\0ab".to_vec()));
        assert_eq!(set_range(Some(b"Hello World"), 6, b"Redis"), Some(b"Hello Redis".to_vec()));
        assert_eq!(set_range(Some(b"abc"), 1, b"XYZ"), Some(b"aXYZ".to_vec()));
        assert_eq!(set_range(Some(b"abc"), 10, b""), None);
    }

    #[test]
    fn bits_are_big_endian_within_bytes() {
        let (value, old) = set_bit(None, 7, true);
        assert_eq!((value.as_slice(), old), (&[0x01u8][..], 0));
        let (value, old) = set_bit(Some(&value), 7, true);
        assert_eq!((value.as_slice(), old), (&[0x01u8][..], 1));
        let (value, _) = set_bit(Some(&value), 8, true);
        assert_eq!(value, [0x01, 0x80]);
        assert_eq!(get_bit(&value, 7), 1);
        assert_eq!(get_bit(&value, 8), 1);
        assert_eq!(get_bit(&value, 0), 0);
        assert_eq!(get_bit(&value, 1000), 0);
    }

    #[test]
    fn bit_count_and_position_match_redis_examples() {
        let foobar = b"foobar";
        let bytes = |start, end| Some(BitRange { start, end, in_bits: false });
        let bits = |start, end| Some(BitRange { start, end, in_bits: true });
        assert_eq!(bit_count(foobar, None), 26);
        assert_eq!(bit_count(foobar, bytes(0, 0)), 4);
        assert_eq!(bit_count(foobar, bytes(1, 1)), 6);
        assert_eq!(bit_count(foobar, bits(5, 30)), 17);
        assert_eq!(bit_count(foobar, bytes(5, 2)), 0);
        let value = [0xFFu8, 0xF0, 0x00];
        assert_eq!(bit_position(&value, false, None, false), 12);
        assert_eq!(bit_position(&[0x00, 0xFF, 0xF0], true, bytes(0, -1), true), 8);
        assert_eq!(bit_position(&[0x00, 0xFF, 0xF0], true, bytes(2, -1), true), 16);
        assert_eq!(bit_position(&[0x00, 0xFF, 0xF0], true, bits(7, 15), true), 8);
        assert_eq!(bit_position(&[0x00, 0x00, 0x00], true, None, false), -1);
        // All ones: a 0 is found just past the value unless the end was given.
        assert_eq!(bit_position(&[0xFF, 0xFF], false, None, false), 16);
        assert_eq!(bit_position(&[0xFF, 0xFF], false, bytes(0, -1), true), -1);
        assert_eq!(bit_position(&[0xFF, 0xFF], false, bits(3, 5), true), -1);
        assert_eq!(bit_position(&[0xFF, 0xFB], false, bits(3, 13), true), 13);
        assert_eq!(bit_position(&[0xFF, 0xFB], false, bits(3, 12), true), -1);
        // Unlike BITCOUNT, two negative offsets in reverse order are clamped, not empty.
        assert_eq!(bit_count(&[0xFF], bytes(-1, -5)), 0);
        assert_eq!(bit_position(&[0x01, 0x00], true, bytes(-100, -200), true), 7);
        assert_eq!(bit_position(b"", false, None, false), -1);
    }

    #[test]
    fn floats_parse_and_print_like_incrbyfloat() {
        assert_eq!(parse_float(b"1.5"), Some(1.5));
        assert_eq!(parse_float(b"-1e3"), Some(-1000.0));
        assert_eq!(parse_float(b"+inf"), Some(f64::INFINITY));
        for bad in [&b""[..], b" 1", b"1 ", b"nan", b"1\x002", b"abc"] {
            assert_eq!(parse_float(bad), None, "{bad:?}");
        }
        let add = |current: Option<&str>, by: &str| {
            add_floats(current.map(str::as_bytes), by.as_bytes()).map(|sum| String::from_utf8(sum).unwrap())
        };
        assert_eq!(add(Some("10.5"), "0.1"), Ok("10.6".into()));
        assert_eq!(add(Some("0.1"), "0.2"), Ok("0.3".into()));
        assert_eq!(add(Some("3.3000000000000003"), "0"), Ok("3.3000000000000003".into()));
        assert_eq!(add(None, "1.1"), Ok("1.1".into()));
        assert_eq!(add(Some("2.2"), "1.1"), Ok("3.3".into()));
        assert_eq!(add(Some("17179869184"), "1.5"), Ok("17179869185.5".into()));
        assert_eq!(add(Some("1"), "-1.1"), Ok("-0.1".into()));
        assert_eq!(add(None, "1e-20"), Ok("0".into()), "17 digits after the point, as %.17Lf");
        assert_eq!(add(Some("5.0e3"), "+1"), Ok("5001".into()));
        assert_eq!(add(Some("0.0244"), "-0.0244"), Ok("0".into()));
        // Beyond a 96-bit decimal: floating point, printed in full (as %.17Lf would).
        let huge = add(Some("1e300"), "1e300").unwrap();
        assert!(huge.starts_with("2000000000000000") && huge.len() == 301 && !huge.contains('.'), "{huge}");
        assert_eq!(add(None, "inf"), Err(FloatError::NotFinite));
        assert_eq!(add(Some("1.7976931348623157e308"), "1.7976931348623157e308"), Err(FloatError::NotFinite));
        assert_eq!(add(Some("abc"), "1"), Err(FloatError::NotAFloat));
        assert_eq!(add(None, "1 "), Err(FloatError::NotAFloat));
        // More digits than a 96-bit decimal holds: floating point, not a silently rounded decimal.
        assert_eq!(add(Some("0.1234567890123456789012345678901234"), "0"), Ok("0.12345678901234568".into()));
        assert_eq!(format_float(-0.0), "0");
        assert_eq!(format_float(1e21), "1000000000000000000000");
        assert_eq!(format_float(0.5), "0.5");
    }

    #[test]
    fn encodings() {
        assert_eq!(encoding(b"12345"), "int");
        assert_eq!(encoding(b"-1"), "int");
        assert_eq!(encoding(b"012"), "embstr");
        assert_eq!(encoding(&[b'a'; 44]), "embstr");
        assert_eq!(encoding(&[b'a'; 45]), "raw");
    }

    #[test]
    fn lcs_matches_redis_example() {
        // LCS's documented example: ohmytext / mynewtext.
        let (common, matches) = longest_common_subsequence(b"ohmytext", b"mynewtext");
        assert_eq!(common, b"mytext");
        assert_eq!(
            matches,
            [LcsMatch { a: (4, 7), b: (5, 8) }, LcsMatch { a: (2, 3), b: (0, 1) }],
            "runs from the last to the first"
        );
        assert_eq!(matches[0].len(), 4);
        assert_eq!(longest_common_subsequence(b"", b"abc"), (Vec::new(), Vec::new()));
        assert_eq!(longest_common_subsequence(b"abc", b"xyz").0, b"");
    }
}

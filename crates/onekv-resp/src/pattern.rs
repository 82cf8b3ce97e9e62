//! Redis glob patterns (`*`, `?`, `[abc]`, `[^a-z]`, `\` escapes), as SCAN's MATCH and CONFIG
//! GET use them.
//!
//! Owns: parsing a pattern and matching it without backtracking blow-up (Redis's recursive matcher
//! can take exponential time on patterns like `a*a*a*...b`), and the literal prefix a scan can be
//! narrowed to. Does not own where patterns come from (`exec`).

/// One element of a glob pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(u8),
    AnyByte,
    AnyRun,
    /// A byte class as a 256-bit set (negation already applied): one lookup per byte, however
    /// many ranges the pattern listed.
    Class([u64; 4]),
}

fn class_contains(set: &[u64; 4], byte: u8) -> bool {
    set[usize::from(byte >> 6)] & (1 << (byte & 63)) != 0
}

/// A Redis glob pattern (`*`, `?`, `[abc]`, `[^a-z]`, `\` escapes), matched without backtracking
/// blow-up: the cost is at most pattern length × key length, and nothing for a key shorter than
/// the bytes the pattern needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    tokens: Vec<Token>,
    /// Tokens that each consume exactly one byte: a shorter text cannot match.
    fixed: usize,
}

impl Pattern {
    /// Parses a pattern; every byte string is a pattern (a `[` without `]` runs to the end, as in
    /// Redis).
    pub fn parse(pattern: &[u8]) -> Pattern {
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < pattern.len() {
            match pattern[i] {
                b'*' => {
                    if tokens.last() != Some(&Token::AnyRun) {
                        tokens.push(Token::AnyRun);
                    }
                }
                b'?' => tokens.push(Token::AnyByte),
                b'\\' if i + 1 < pattern.len() => {
                    i += 1;
                    tokens.push(Token::Literal(pattern[i]));
                }
                b'[' => {
                    i += 1;
                    let negated = pattern.get(i) == Some(&b'^');
                    if negated {
                        i += 1;
                    }
                    let mut set = [0u64; 4];
                    let mut add = |low: u8, high: u8| {
                        for byte in low..=high {
                            set[usize::from(byte >> 6)] |= 1 << (byte & 63);
                        }
                    };
                    while i < pattern.len() && pattern[i] != b']' {
                        if pattern[i] == b'\\' && i + 1 < pattern.len() {
                            i += 1;
                            add(pattern[i], pattern[i]);
                        } else if i + 2 < pattern.len() && pattern[i + 1] == b'-' {
                            let (a, b) = (pattern[i], pattern[i + 2]);
                            add(a.min(b), a.max(b));
                            i += 2;
                        } else {
                            add(pattern[i], pattern[i]);
                        }
                        i += 1;
                    }
                    if negated {
                        set = set.map(|word| !word);
                    }
                    tokens.push(Token::Class(set));
                }
                byte => tokens.push(Token::Literal(byte)),
            }
            i += 1;
        }
        let fixed = tokens.iter().filter(|token| **token != Token::AnyRun).count();
        Pattern { tokens, fixed }
    }

    /// The bytes every match starts with.
    pub fn literal_prefix(&self) -> Vec<u8> {
        self.tokens
            .iter()
            .map_while(|token| match token {
                Token::Literal(byte) => Some(*byte),
                _ => None,
            })
            .collect()
    }

    /// Whether `text` matches the whole pattern.
    pub fn matches(&self, text: &[u8]) -> bool {
        if text.len() < self.fixed {
            return false;
        }
        let tokens = &self.tokens;
        let (mut t, mut s) = (0, 0);
        // The last `*` seen and the text position it was tried at, to resume from on a mismatch.
        let mut star: Option<(usize, usize)> = None;
        while s < text.len() {
            let step = match tokens.get(t) {
                Some(Token::AnyRun) => {
                    star = Some((t, s));
                    t += 1;
                    continue;
                }
                Some(Token::AnyByte) => true,
                Some(Token::Literal(byte)) => *byte == text[s],
                Some(Token::Class(set)) => class_contains(set, text[s]),
                None => false,
            };
            if step {
                t += 1;
                s += 1;
            } else if let Some((star_token, star_text)) = star {
                t = star_token + 1;
                s = star_text + 1;
                star = Some((star_token, star_text + 1));
            } else {
                return false;
            }
        }
        tokens[t..].iter().all(|token| *token == Token::AnyRun)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_patterns_cost_little() {
        // A class of a million bytes is one 256-bit set; matching it is one lookup per key byte.
        let mut class = b"*[".to_vec();
        class.extend(std::iter::repeat_n(b'a', 1 << 20));
        let pattern = Pattern::parse(&class);
        let key = vec![b'b'; 4096];
        let started = std::time::Instant::now();
        assert!(!pattern.matches(&key));
        assert!(pattern.matches(b"xxa"));
        // More single-byte tokens than the key has bytes: no match, without walking the key.
        let long = Pattern::parse(&vec![b'?'; 5000]);
        assert!(!long.matches(&key));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn glob_patterns() {
        let cases: &[(&str, &str, bool)] = &[
            ("*", "", true),
            ("*", "anything", true),
            ("key:*", "key:12", true),
            ("key:*", "ke", false),
            ("h?llo", "hello", true),
            ("h?llo", "hllo", false),
            ("h[ae]llo", "hallo", true),
            ("h[ae]llo", "hillo", false),
            ("h[^e]llo", "hallo", true),
            ("h[^e]llo", "hello", false),
            ("h[a-c]llo", "hbllo", true),
            ("h[c-a]llo", "hbllo", true),
            ("a\\*b", "a*b", true),
            ("a\\*b", "axb", false),
            ("*a*b*c", "xxaxxbxxc", true),
            ("*a*b*c", "xxaxxcxxb", false),
            ("a*", "b", false),
        ];
        for (pattern, text, expected) in cases {
            assert_eq!(
                Pattern::parse(pattern.as_bytes()).matches(text.as_bytes()),
                *expected,
                "{pattern} {text}"
            );
        }
        assert_eq!(Pattern::parse(b"user:1*").literal_prefix(), b"user:1");
        assert_eq!(Pattern::parse(b"a\\?b?").literal_prefix(), b"a?b");
        assert!(Pattern::parse(b"*x").literal_prefix().is_empty());
        // Many stars against a long non-matching text stay cheap.
        let pattern = Pattern::parse("a*".repeat(50).as_bytes());
        assert!(!pattern.matches(&[b'a'; 49]));
    }
}

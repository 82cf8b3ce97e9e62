//! What the values a benchmark writes contain: random bytes (no compressor shrinks them; the
//! default, as YCSB's own values barely compress with LZ4) or text (words from a small vocabulary
//! in `field=value` form, compressible about as much as typical JSON records, for measuring the
//! log GC's compression of small values).

use rand::Rng;

/// The content of written values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueKind {
    /// Uniformly random bytes.
    #[default]
    Random,
    /// Words from a 64-word vocabulary as `fieldN=word word ...;` runs.
    Text,
}

const WORDS: [&str; 64] = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
    "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor",
    "whiskey", "xray", "yankee", "zulu", "account", "balance", "customer", "order", "status", "pending",
    "shipped", "invoice", "region", "north", "south", "east", "west", "premium", "standard", "basic",
    "active", "closed", "created", "updated", "amount", "currency", "euro", "dollar", "yen", "product",
    "category", "books", "music", "garden", "kitchen", "sports", "toys", "email", "phone", "address",
    "street", "city",
];

impl std::str::FromStr for ValueKind {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "random" => Ok(ValueKind::Random),
            "text" => Ok(ValueKind::Text),
            _ => Err(format!("unknown value kind {name:?}; expected random or text")),
        }
    }
}

/// Fills `value` (all of it) with content of `kind`.
pub fn fill(kind: ValueKind, rng: &mut impl Rng, value: &mut [u8]) {
    match kind {
        ValueKind::Random => rng.fill_bytes(value),
        ValueKind::Text => {
            let mut at = 0;
            let mut field = 0;
            while at < value.len() {
                let words = rng.random_range(1..=4);
                let mut run = format!("field{field}=");
                for i in 0..words {
                    if i > 0 {
                        run.push(' ');
                    }
                    run.push_str(WORDS[rng.random_range(0..WORDS.len())]);
                }
                run.push(';');
                let n = run.len().min(value.len() - at);
                value[at..at + n].copy_from_slice(&run.as_bytes()[..n]);
                at += n;
                field += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn text_fills_every_byte_with_printable_words_and_differs_per_draw() {
        let mut rng = StdRng::seed_from_u64(1);
        let (mut a, mut b) = (vec![0u8; 256], vec![0u8; 256]);
        fill(ValueKind::Text, &mut rng, &mut a);
        fill(ValueKind::Text, &mut rng, &mut b);
        assert!(a.iter().all(|c| c.is_ascii_graphic() || *c == b' '), "{}", String::from_utf8_lossy(&a));
        assert!(a.starts_with(b"field0="));
        assert_ne!(a, b);
        let mut empty = [];
        fill(ValueKind::Text, &mut rng, &mut empty);
    }
}

//! What the values a benchmark writes contain: random bytes (no compressor shrinks them; the
//! default, as YCSB's own values barely compress with LZ4), text (words from a small vocabulary
//! in `field=value` form, compressible about as much as typical JSON records, for measuring the
//! log GC's compression of small values), or recurring values (a share of the writes repeat one of
//! a fixed set of random values, for measuring deduplication).

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// The content of written values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueKind {
    /// Uniformly random bytes.
    #[default]
    Random,
    /// Words from a 64-word vocabulary as `fieldN=word word ...;` runs.
    Text,
    /// `percent` of the values are one of `distinct` random values (each as likely), the others
    /// random (`recurring:PERCENT:DISTINCT`; `recurring` is `recurring:50:1000`).
    Recurring {
        /// Share of the values that recur, 0..=100.
        percent: u8,
        /// How many distinct values recur, at least 1.
        distinct: u32,
    },
}

/// Seeds of the recurring values: value `n` is the bytes of a generator seeded with this plus `n`.
const RECURRING_SEED: u64 = 0x5eed_0000_0000;

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
        let unknown =
            || format!("unknown value kind {name:?}; expected random, text or recurring[:PERCENT:DISTINCT]");
        match name {
            "random" => Ok(ValueKind::Random),
            "text" => Ok(ValueKind::Text),
            "recurring" => Ok(ValueKind::Recurring { percent: 50, distinct: 1000 }),
            _ => {
                let rest = name.strip_prefix("recurring:").ok_or_else(unknown)?;
                let (percent, distinct) = rest.split_once(':').ok_or_else(unknown)?;
                let percent: u8 = percent.parse().ok().filter(|p| *p <= 100).ok_or_else(|| {
                    format!("recurring values: the percentage {percent:?} must be 0 to 100")
                })?;
                let distinct: u32 = distinct.parse().ok().filter(|d| *d >= 1).ok_or_else(|| {
                    format!("recurring values: the number of distinct values {distinct:?} must be at least 1")
                })?;
                Ok(ValueKind::Recurring { percent, distinct })
            }
        }
    }
}

/// Fills `value` (all of it) with content of `kind`.
pub fn fill(kind: ValueKind, rng: &mut impl Rng, value: &mut [u8]) {
    match kind {
        ValueKind::Random => rng.fill_bytes(value),
        ValueKind::Recurring { percent, distinct } => {
            if rng.random_range(0..100u8) < percent {
                let number = rng.random_range(0..distinct);
                StdRng::seed_from_u64(RECURRING_SEED + u64::from(number)).fill_bytes(value);
            } else {
                rng.fill_bytes(value);
            }
        }
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

    #[test]
    fn recurring_values_repeat_as_often_as_asked() {
        let kind: ValueKind = "recurring:60:3".parse().unwrap();
        assert_eq!(kind, ValueKind::Recurring { percent: 60, distinct: 3 });
        let mut rng = StdRng::seed_from_u64(7);
        let mut seen = std::collections::HashMap::new();
        for _ in 0..1000 {
            let mut value = vec![0u8; 64];
            fill(kind, &mut rng, &mut value);
            *seen.entry(value).or_insert(0) += 1;
        }
        let repeated: usize = seen.values().filter(|n| **n > 1).sum();
        assert_eq!(seen.values().filter(|n| **n > 1).count(), 3, "three values recur");
        assert!((540..=660).contains(&repeated), "about 60% recur: {repeated}");
        for bad in ["recurring:101:3", "recurring:50:0", "recurring:50", "recurring:x:1", "recur"] {
            assert!(bad.parse::<ValueKind>().is_err(), "{bad}");
        }
    }

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

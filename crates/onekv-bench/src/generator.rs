//! Request distributions as YCSB defines them: uniform, zipfian (YCSB's `ZipfianGenerator` with
//! constant 0.99, and its scrambled variant that spreads the popular items over the key space) and
//! latest (skewed towards the most recently inserted records), plus YCSB's key naming.
//!
//! Owns: which record ordinal a request touches. Does not own: the operation mix (`workload`) or
//! turning ordinals into requests (`runner`). Every generator draws from a caller-supplied RNG, so a
//! seeded run is reproducible and the generators need no locking.

use rand::Rng;

/// YCSB's default zipfian constant (`ZipfianGenerator.ZIPFIAN_CONSTANT`).
pub const ZIPFIAN_CONSTANT: f64 = 0.99;

/// The item count YCSB's `ScrambledZipfianGenerator` draws from before hashing into the key space,
/// and its precomputed zeta (computing zeta over 10^10 items at start-up would take minutes).
const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;
const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// Digits of the zero-padded number in a key: enough for any `u64`, so every key has one width.
const KEY_DIGITS: usize = 20;

/// YCSB's `Utils.fnvhash64`: FNV-1a 64-bit over the little-endian octets of `value`, then the
/// absolute value as a Java `long` (so at most 19 digits, except for `i64::MIN`).
pub fn fnv_hash64(value: u64) -> u64 {
    const OFFSET_BASIS: u64 = 0xCBF2_9CE4_8422_2325;
    const PRIME: u64 = 1_099_511_628_211;
    let mut hash = OFFSET_BASIS;
    let mut rest = value;
    for _ in 0..8 {
        hash ^= rest & 0xff;
        hash = hash.wrapping_mul(PRIME);
        rest >>= 8;
    }
    (hash as i64).wrapping_abs() as u64
}

/// The key of record `ordinal`: `user` + the zero-padded FNV hash of the ordinal (YCSB's
/// `insertorder=hashed`), so consecutive inserts land all over the key space. 24 bytes.
pub fn record_key(ordinal: u64) -> String {
    format!("user{:0width$}", fnv_hash64(ordinal), width = KEY_DIGITS)
}

/// The length in bytes of every key [`record_key`] makes.
pub const KEY_BYTES: usize = 4 + KEY_DIGITS;

/// Uniform over `0..count`.
pub fn uniform(rng: &mut impl Rng, count: u64) -> u64 {
    if count == 0 { 0 } else { rng.random_range(0..count) }
}

/// YCSB's `ZipfianGenerator`: item `i` of `0..n` is drawn with probability proportional to
/// `1 / (i + 1)^theta`, so item 0 is the most popular. Gray et al., "Quickly Generating
/// Billion-Record Synthetic Databases" (SIGMOD 1994). The item count may grow between draws (as
/// records are inserted); zeta is then extended incrementally, as YCSB does.
#[derive(Debug, Clone)]
pub struct Zipfian {
    theta: f64,
    alpha: f64,
    zeta2: f64,
    /// The item count `zetan` and `eta` were computed for.
    count: u64,
    zetan: f64,
    eta: f64,
}

impl Zipfian {
    /// Over `0..count` with YCSB's constant 0.99.
    pub fn new(count: u64) -> Zipfian {
        Zipfian::with_constant(count, ZIPFIAN_CONSTANT)
    }

    /// Over `0..count` with constant `theta` (in `(0, 1)`).
    pub fn with_constant(count: u64, theta: f64) -> Zipfian {
        let zetan = zeta(0, count, theta, 0.0);
        Zipfian::with_zetan(count, theta, zetan)
    }

    fn with_zetan(count: u64, theta: f64, zetan: f64) -> Zipfian {
        let zeta2 = zeta(0, 2, theta, 0.0);
        let mut zipfian = Zipfian { theta, alpha: 1.0 / (1.0 - theta), zeta2, count, zetan, eta: 0.0 };
        zipfian.eta = zipfian.eta_for(count);
        zipfian
    }

    fn eta_for(&self, count: u64) -> f64 {
        (1.0 - (2.0 / count as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan)
    }

    /// The item count the generator currently draws from.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Draws from `0..count`, extending zeta first if `count` grew (a shrinking count is
    /// recomputed from scratch; YCSB does the same, and it does not happen in our workloads).
    pub fn next_of(&mut self, rng: &mut impl Rng, count: u64) -> u64 {
        if count != self.count && count > 0 {
            self.zetan = if count > self.count {
                zeta(self.count, count, self.theta, self.zetan)
            } else {
                zeta(0, count, self.theta, 0.0)
            };
            self.count = count;
            self.eta = self.eta_for(count);
        }
        self.next(rng)
    }

    /// Draws from `0..count()`.
    pub fn next(&self, rng: &mut impl Rng) -> u64 {
        if self.count <= 1 {
            return 0;
        }
        let u: f64 = rng.random();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        let item = (self.count as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        item.min(self.count - 1)
    }
}

/// Sum of `1 / i^theta` for `i` in `from+1..=to`, added to `initial` (the sum up to `from`).
fn zeta(from: u64, to: u64, theta: f64, initial: f64) -> f64 {
    (from..to).fold(initial, |sum, i| sum + 1.0 / ((i + 1) as f64).powf(theta))
}

/// YCSB's `ScrambledZipfianGenerator`: zipfian popularity, but the popular items are scattered
/// over `0..count` by hashing instead of being the lowest ordinals. Draws from YCSB's fixed
/// 10^10-item zipfian and hashes into the current count, so the count may change freely.
#[derive(Debug, Clone)]
pub struct ScrambledZipfian {
    zipfian: Zipfian,
}

impl Default for ScrambledZipfian {
    fn default() -> Self {
        ScrambledZipfian::new()
    }
}

impl ScrambledZipfian {
    /// YCSB's generator (constant 0.99 over 10^10 items, zeta precomputed).
    pub fn new() -> ScrambledZipfian {
        ScrambledZipfian {
            zipfian: Zipfian::with_zetan(SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN),
        }
    }

    /// Draws from `0..count`.
    pub fn next(&self, rng: &mut impl Rng, count: u64) -> u64 {
        if count == 0 {
            return 0;
        }
        fnv_hash64(self.zipfian.next(rng)) % count
    }
}

/// YCSB's `SkewedLatestGenerator`: the most recently inserted record is the most popular, then the
/// one before it, and so on (zipfian over the distance from the newest).
#[derive(Debug, Clone)]
pub struct Latest {
    zipfian: Zipfian,
}

impl Latest {
    /// For a key space that starts with `count` records.
    pub fn new(count: u64) -> Latest {
        Latest { zipfian: Zipfian::new(count.max(1)) }
    }

    /// Draws from `0..count`, where `count - 1` is the newest record.
    pub fn next(&mut self, rng: &mut impl Rng, count: u64) -> u64 {
        if count == 0 {
            return 0;
        }
        let back = self.zipfian.next_of(rng, count);
        count - 1 - back
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const DRAWS: usize = 200_000;

    fn counts(count: u64, mut draw: impl FnMut(&mut StdRng) -> u64) -> Vec<u64> {
        let mut rng = StdRng::seed_from_u64(7);
        let mut counts = vec![0u64; count as usize];
        for _ in 0..DRAWS {
            let item = draw(&mut rng);
            assert!(item < count, "drew {item} from 0..{count}");
            counts[item as usize] += 1;
        }
        counts
    }

    #[test]
    fn keys_are_fixed_width_hashed_and_distinct() {
        assert_eq!(record_key(0).len(), KEY_BYTES);
        assert_eq!(record_key(u64::MAX).len(), KEY_BYTES);
        assert!(record_key(1).starts_with("user"));
        // Hashed, not ordered: consecutive ordinals are far apart.
        assert_ne!(record_key(1)[..8], record_key(2)[..8]);
        let keys: std::collections::HashSet<String> = (0..10_000).map(record_key).collect();
        assert_eq!(keys.len(), 10_000);
    }

    #[test]
    fn fnv_matches_ycsb() {
        // FNV-1a of eight zero octets is 0xA8C7F832281A39C5, negative as a Java long.
        assert_eq!(fnv_hash64(0), 6_284_781_860_667_377_211);
    }

    #[test]
    fn uniform_is_flat() {
        let counts = counts(10, |rng| uniform(rng, 10));
        for count in counts {
            let share = count as f64 / DRAWS as f64;
            assert!((share - 0.1).abs() < 0.01, "share {share}");
        }
    }

    #[test]
    fn zipfian_top_item_has_its_theoretical_share() {
        let n = 1000;
        let zipfian = Zipfian::new(n);
        let counts = counts(n, |rng| zipfian.next(rng));
        // P(item 0) = 1 / zeta(n, 0.99), about 0.134 for n = 1000.
        let expected = 1.0 / zeta(0, n, ZIPFIAN_CONSTANT, 0.0);
        let share = counts[0] as f64 / DRAWS as f64;
        assert!((share - expected).abs() < 0.01, "share {share}, expected {expected}");
        // Popularity falls with the rank: item 0 ≈ 2× item 1, ≫ the median item.
        assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]);
        let ratio = counts[0] as f64 / counts[1] as f64;
        assert!((1.7..2.3).contains(&ratio), "ratio {ratio}");
    }

    #[test]
    fn zipfian_grows_incrementally_like_a_fresh_one() {
        let mut grown = Zipfian::new(100);
        let mut rng = StdRng::seed_from_u64(1);
        grown.next_of(&mut rng, 5000);
        let fresh = Zipfian::new(5000);
        assert!((grown.zetan - fresh.zetan).abs() < 1e-9);
        assert!((grown.eta - fresh.eta).abs() < 1e-9);
    }

    #[test]
    fn scrambled_zipfian_is_skewed_but_scattered() {
        let n = 1000;
        let scrambled = ScrambledZipfian::new();
        let mut counts = counts(n, |rng| scrambled.next(rng, n));
        // The most popular item is not item 0 in general but still gets a large share.
        let hottest = counts.iter().enumerate().max_by_key(|(_, count)| **count).map(|(item, _)| item);
        let sorted = {
            counts.sort_unstable_by(|a, b| b.cmp(a));
            counts
        };
        let top_share = sorted[0] as f64 / DRAWS as f64;
        assert!(top_share > 0.03, "top share {top_share}, hottest item {hottest:?}");
        // The top 10% of items take about a quarter of the requests (YCSB's scrambled zipfian is
        // milder than a plain one: its tail is hashed uniformly); a uniform draw gives them ~11%.
        let top_tenth = sorted[..100].iter().sum::<u64>() as f64 / DRAWS as f64;
        assert!(top_tenth > 0.2, "top tenth {top_tenth}");
    }

    #[test]
    fn latest_prefers_the_newest_records() {
        let n = 1000;
        let mut latest = Latest::new(n);
        let counts = counts(n, |rng| latest.next(rng, n));
        let newest_share = counts[999] as f64 / DRAWS as f64;
        let expected = 1.0 / zeta(0, n, ZIPFIAN_CONSTANT, 0.0);
        assert!((newest_share - expected).abs() < 0.01, "newest share {newest_share}");
        let newest_tenth: u64 = counts[900..].iter().sum();
        let oldest_tenth: u64 = counts[..100].iter().sum();
        assert!(newest_tenth > 10 * oldest_tenth, "{newest_tenth} vs {oldest_tenth}");
        // As records are inserted the hot spot moves with them.
        let mut rng = StdRng::seed_from_u64(3);
        let draws: Vec<u64> = (0..1000).map(|_| latest.next(&mut rng, 2000)).collect();
        assert!(draws.iter().filter(|&&item| item >= 1000).count() > 700);
    }
}

//! How sure a figure is. On seven conversations one constant moves a figure by a few thousandths,
//! so every headline figure gets a 95% percentile-bootstrap interval over questions (Efron &
//! Tibshirani 1993), and a change (an ablation, `--baseline`) the paired form: the questions are
//! resampled together for both runs, so what varies is the per-question difference (Sakai 2006,
//! "Evaluating evaluation metrics based on the bootstrap"). Seeded, so a table prints the same
//! interval every time.

/// Resamples per interval: the percentile bounds move by under 0.001 beyond ~1,000.
pub(super) const RESAMPLES: usize = 2000;
const SEED: u64 = 0x5eed_2026_1206;

/// A mean and its 95% interval.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(super) struct Interval {
    pub mean: f64,
    pub low: f64,
    pub high: f64,
}

impl Interval {
    /// Whether the interval leaves out zero: a difference the questions' spread does not explain.
    pub fn excludes_zero(&self) -> bool {
        self.low > 0.0 || self.high < 0.0
    }
}

/// SplitMix64 (Steele et al. 2014): a fixed seed, no dependency, more than random enough to pick
/// question indices.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        // Lemire's multiply-shift: no modulo bias worth naming at n of a few thousand.
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

/// The mean of `values` (one per question) and its 95% percentile-bootstrap interval; `None`
/// for no values.
pub(super) fn interval(values: &[f64]) -> Option<Interval> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    let mut rng = SplitMix64(SEED);
    let mut means: Vec<f64> = (0..RESAMPLES)
        .map(|_| (0..n).map(|_| values[rng.below(n)]).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    let at = |p: f64| means[((RESAMPLES - 1) as f64 * p).round() as usize];
    Some(Interval {
        mean,
        low: at(0.025),
        high: at(0.975),
    })
}

/// The mean per-question difference `a − b` and its paired 95% interval; `None` when the two
/// runs did not score the same questions.
pub(super) fn difference(a: &[f64], b: &[f64]) -> Option<Interval> {
    if a.len() != b.len() {
        return None;
    }
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    interval(&d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interval_holds_its_mean_and_narrows_with_more_questions() {
        // Hits of 0 and 1 in equal numbers: mean 0.5, standard error 0.5 / sqrt(n).
        let few: Vec<f64> = (0..100).map(|i| f64::from(i % 2)).collect();
        let many: Vec<f64> = (0..1600).map(|i| f64::from(i % 2)).collect();
        let (f, m) = (interval(&few).unwrap(), interval(&many).unwrap());
        assert_eq!(f.mean, 0.5);
        assert!(f.low < 0.5 && 0.5 < f.high);
        // ±1.96 standard errors: ±0.098 at 100 questions, ±0.0245 at 1,600.
        assert!((f.high - f.low - 0.196).abs() < 0.03, "{f:?}");
        assert!((m.high - m.low - 0.049).abs() < 0.008, "{m:?}");
        // Seeded: the same values give the same interval.
        assert_eq!(interval(&few), interval(&few));
        assert_eq!(interval(&[]), None);
    }

    #[test]
    fn a_paired_difference_sees_a_small_change_the_spread_of_the_runs_hides() {
        // Two runs whose questions vary from 0 to 1, the second better by 0.02 on every
        // question: their own intervals overlap, the paired one leaves out zero.
        let a: Vec<f64> = (0..300).map(|i| f64::from(i % 50) / 50.0).collect();
        let b: Vec<f64> = a.iter().map(|x| x + 0.02).collect();
        let (ia, ib) = (interval(&a).unwrap(), interval(&b).unwrap());
        assert!(ib.low < ia.high, "{ia:?} {ib:?}");
        let d = difference(&b, &a).unwrap();
        assert!((d.mean - 0.02).abs() < 1e-12 && d.excludes_zero(), "{d:?}");
        // The same run against itself: zero, and the interval holds it.
        let same = difference(&a, &a).unwrap();
        assert_eq!((same.mean, same.excludes_zero()), (0.0, false));
        assert_eq!(difference(&a, &a[1..]), None);
    }
}

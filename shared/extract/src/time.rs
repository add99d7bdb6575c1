//! Time expressions resolved against the turn's own timestamp.
//!
//! Conversations say "last Friday" far more often than "5 May 2023"; the graph needs absolute
//! day ranges so that a question asked months later can still find the turn. A hand-written
//! token scanner (constant look-ahead per token) keeps the cost linear on any input.

use chrono::{DateTime, Datelike, Days, Months, NaiveDate, NaiveTime, TimeZone, Utc, Weekday};
use recollect_model::TimeRef;

use crate::lexicon::{ambiguous_month, month_of, weekday_of};
use crate::text::{strip_clitic, tokenize, TokKind, Token};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gran {
    Day,
    Week,
    Month,
    Season,
    Year,
}

impl Gran {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Gran::Day => "day",
            Gran::Week => "week",
            Gran::Month => "month",
            Gran::Season => "season",
            Gran::Year => "year",
        }
    }
}

/// A resolved expression with its token span (inclusive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TimeMatch {
    pub first: usize,
    pub last: usize,
    pub start: NaiveDate,
    pub end: NaiveDate,
    pub gran: Gran,
    /// Fully specified by the text (explicit year): meaningful without an anchor.
    pub absolute: bool,
}

impl TimeMatch {
    pub(crate) fn to_time_ref(&self, toks: &[Token<'_>], text: &str) -> TimeRef {
        let s = toks[self.first].start;
        let e = toks[self.last].end;
        TimeRef {
            text: text.get(s..e).unwrap_or_default().to_string(),
            start: self.start,
            end: self.end,
            granularity: self.gran.as_str().to_string(),
        }
    }
}

/// Resolves every time expression in `text` against `anchor` (the turn's timestamp).
pub fn parse_times(text: &str, anchor: DateTime<Utc>) -> Vec<TimeRef> {
    let toks = tokenize(text);
    scan(&toks, anchor.date_naive())
        .iter()
        .map(|m| m.to_time_ref(&toks, text))
        .collect()
}

/// Parses a session stamp such as LoCoMo's "1:56 pm on 8 May, 2023", RFC 3339, or a plain
/// ISO date / date-time (taken as UTC).
pub fn parse_date_time(s: &str) -> Option<DateTime<Utc>> {
    let s = s.trim();
    if s.is_empty() || s.len() > 200 {
        return None;
    }
    if let Ok(dt) = DateTime::parse_from_rfc3339(s) {
        return Some(dt.with_timezone(&Utc));
    }
    for fmt in [
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(ndt) = chrono::NaiveDateTime::parse_from_str(s, fmt) {
            return Some(Utc.from_utc_datetime(&ndt));
        }
    }
    let (time_part, date_part) = match s.split_once(" on ") {
        Some((t, d)) => (Some(t.trim()), d.trim()),
        None => (None, s),
    };
    let time = match time_part {
        Some(t) => parse_clock(t)?,
        None => NaiveTime::MIN,
    };
    let date = parse_absolute_day(date_part)?;
    Some(Utc.from_utc_datetime(&date.and_time(time)))
}

/// "1:56 pm", "1:56pm", "13:56", "9 am".
fn parse_clock(t: &str) -> Option<NaiveTime> {
    let lower = t.to_ascii_lowercase();
    let (digits, meridiem) = if let Some(x) = lower.strip_suffix("am") {
        (x.trim(), Some(false))
    } else if let Some(x) = lower.strip_suffix("pm") {
        (x.trim(), Some(true))
    } else {
        (lower.trim(), None)
    };
    let (h, m) = match digits.split_once(':') {
        Some((h, m)) => (h.trim().parse::<u32>().ok()?, m.trim().parse::<u32>().ok()?),
        None => (digits.parse::<u32>().ok()?, 0),
    };
    let h = match meridiem {
        Some(pm) => {
            if !(1..=12).contains(&h) {
                return None;
            }
            (h % 12) + if pm { 12 } else { 0 }
        }
        None => h,
    };
    NaiveTime::from_hms_opt(h, m, 0)
}

/// A day fully given by the text ("8 May, 2023", "May 8th 2023", "2023-05-08").
fn parse_absolute_day(s: &str) -> Option<NaiveDate> {
    let toks = tokenize(s);
    let anchor = NaiveDate::from_ymd_opt(2000, 1, 1)?;
    let words = toks.iter().filter(|t| t.kind != TokKind::Punct).count();
    let ms = scan(&toks, anchor);
    let m = ms.first()?;
    let covered = toks[m.first..=m.last]
        .iter()
        .filter(|t| t.kind != TokKind::Punct)
        .count();
    (m.absolute && m.gran == Gran::Day && covered == words).then_some(m.start)
}

/// Finds all time expressions, left to right, without overlaps.
pub(crate) fn scan(toks: &[Token<'_>], anchor: NaiveDate) -> Vec<TimeMatch> {
    let sc = Scanner { toks, a: anchor };
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i].kind != TokKind::Punct {
            if let Some(m) = sc.match_at(i) {
                i = m.last + 1;
                out.push(m);
                continue;
            }
        }
        i += 1;
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Modifier {
    Last,
    This,
    Next,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Day,
    Week,
    Month,
    Year,
}

/// A count in "N days ago": exact, or a vague span (lo..=hi).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    Exact(u32),
    Vague(u32, u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Season {
    Spring,
    Summer,
    Fall,
    Winter,
}

struct Scanner<'t, 'a> {
    toks: &'t [Token<'a>],
    a: NaiveDate,
}

fn tm(
    first: usize,
    last: usize,
    r: (NaiveDate, NaiveDate),
    gran: Gran,
    absolute: bool,
) -> TimeMatch {
    TimeMatch {
        first,
        last,
        start: r.0,
        end: r.1,
        gran,
        absolute,
    }
}

impl<'a> Scanner<'_, 'a> {
    /// Lower-case word or number at `i`.
    fn w(&self, i: usize) -> Option<&str> {
        let t = self.toks.get(i)?;
        (t.kind != TokKind::Punct).then_some(t.lower.as_str())
    }

    fn is(&self, i: usize, s: &str) -> bool {
        self.w(i) == Some(s)
    }

    fn is_any(&self, i: usize, set: &[&str]) -> bool {
        self.w(i).is_some_and(|w| set.contains(&w))
    }

    fn punct(&self, i: usize, s: &str) -> bool {
        self.toks.get(i).is_some_and(|t| t.is_punct(s))
    }

    fn prev_word(&self, i: usize) -> Option<&str> {
        i.checked_sub(1).and_then(|j| self.w(j))
    }

    fn adjacent(&self, i: usize) -> bool {
        match (self.toks.get(i), self.toks.get(i + 1)) {
            (Some(x), Some(y)) => x.end == y.start,
            _ => false,
        }
    }

    fn num(&self, i: usize) -> Option<u32> {
        let t = self.toks.get(i)?;
        if t.kind == TokKind::Num && t.surface.len() <= 4 {
            t.surface.parse().ok()
        } else {
            None
        }
    }

    fn year(&self, i: usize) -> Option<i32> {
        let t = self.toks.get(i)?;
        if t.kind == TokKind::Num && t.surface.len() == 4 {
            let y: i32 = t.surface.parse().ok()?;
            (1000..=9999).contains(&y).then_some(y)
        } else {
            None
        }
    }

    /// Day of month: "8", "08", "8th", "1st", "22nd", "3rd".
    fn day(&self, i: usize) -> Option<u32> {
        let t = self.toks.get(i)?;
        if t.kind == TokKind::Punct || t.lower.len() > 4 {
            return None;
        }
        let l = t.lower.as_str();
        let digits_end = l.find(|c: char| !c.is_ascii_digit()).unwrap_or(l.len());
        if digits_end == 0 || digits_end > 2 {
            return None;
        }
        let suffix = &l[digits_end..];
        if !matches!(suffix, "" | "st" | "nd" | "rd" | "th") {
            return None;
        }
        let d: u32 = l[..digits_end].parse().ok()?;
        (1..=31).contains(&d).then_some(d)
    }

    fn ordinal_day(&self, i: usize) -> Option<u32> {
        let t = self.toks.get(i)?;
        if t.kind == TokKind::Word {
            self.day(i)
        } else {
            None
        }
    }

    /// A month name at `i`; the ambiguous ones (may/march/august) only when `strong`.
    fn month(&self, i: usize, strong: bool) -> Option<u32> {
        let t = self.toks.get(i)?;
        if t.kind != TokKind::Word {
            return None;
        }
        let m = month_of(&t.lower, true)?;
        let full = month_of(&t.lower, false).is_some();
        if !full && !strong {
            return None;
        }
        if ambiguous_month(&t.lower) && !strong && !t.cap() {
            return None;
        }
        Some(m)
    }

    fn weekday(&self, i: usize) -> Option<Weekday> {
        weekday_of(strip_clitic(self.w(i)?))
    }

    fn season(&self, i: usize) -> Option<Season> {
        Some(match self.w(i)? {
            "spring" => Season::Spring,
            "summer" => Season::Summer,
            "fall" | "autumn" => Season::Fall,
            "winter" => Season::Winter,
            _ => return None,
        })
    }

    fn unit(&self, i: usize) -> Option<Unit> {
        Some(match self.w(i)? {
            "day" | "days" => Unit::Day,
            "week" | "weeks" => Unit::Week,
            "month" | "months" => Unit::Month,
            "year" | "years" => Unit::Year,
            _ => return None,
        })
    }

    fn day_part(&self, i: usize) -> bool {
        self.is_any(i, &["morning", "afternoon", "evening", "night"])
    }

    /// A count at `i`: returns it and the index after it.
    fn count(&self, i: usize) -> Option<(Count, usize)> {
        if let Some(n) = self.num(i) {
            return (1..=500).contains(&n).then_some((Count::Exact(n), i + 1));
        }
        let w = self.w(i)?;
        let exact = |n| Some((Count::Exact(n), i + 1));
        match w {
            "a" | "an" => {
                if self.is(i + 1, "couple") {
                    let j = if self.is(i + 2, "of") { i + 3 } else { i + 2 };
                    Some((Count::Vague(2, 3), j))
                } else if self.is(i + 1, "few") {
                    Some((Count::Vague(2, 4), i + 2))
                } else {
                    exact(1)
                }
            }
            "couple" => {
                let j = if self.is(i + 1, "of") { i + 2 } else { i + 1 };
                Some((Count::Vague(2, 3), j))
            }
            "few" => Some((Count::Vague(2, 4), i + 1)),
            "several" => Some((Count::Vague(3, 7), i + 1)),
            "one" => exact(1),
            "two" => exact(2),
            "three" => exact(3),
            "four" => exact(4),
            "five" => exact(5),
            "six" => exact(6),
            "seven" => exact(7),
            "eight" => exact(8),
            "nine" => exact(9),
            "ten" => exact(10),
            "eleven" => exact(11),
            "twelve" => exact(12),
            "fifteen" => exact(15),
            "twenty" => exact(20),
            _ => None,
        }
    }

    /// Whether the sentence around tokens first..=last talks about the future, so bare
    /// "Friday" / "in June" mean the coming one.
    fn future_context(&self, first: usize, last: usize) -> bool {
        let mut fut = false;
        let mut past = false;
        let mut look = |t: &Token<'_>| {
            let l = t.lower.as_str();
            match l {
                "will" | "gonna" | "going" | "plan" | "plans" | "planning" | "hope" | "hoping"
                | "wanna" | "shall" | "upcoming" | "soon" | "excited" | "forward" | "can't"
                | "cannot" | "next" | "coming" | "tomorrow" | "won't" | "gotta" | "until"
                | "till" => fut = true,
                "was" | "were" | "did" | "had" | "went" | "got" | "ago" | "yesterday" | "came"
                | "saw" | "made" | "took" | "been" | "last" | "ran" | "met" | "bought"
                | "wasn't" | "didn't" | "gave" | "told" | "left" => past = true,
                _ => {
                    if l.ends_with("'ll") {
                        fut = true;
                    } else if l.len() >= 5
                        && l.ends_with("ed")
                        && !matches!(l, "excited" | "interested" | "scheduled" | "supposed")
                    {
                        past = true;
                    }
                }
            }
        };
        let mut j = first;
        let mut steps = 0;
        while j > 0 && steps < 12 {
            j -= 1;
            steps += 1;
            let t = &self.toks[j];
            if t.ends_sentence() {
                break;
            }
            look(t);
        }
        let mut j = last + 1;
        let mut steps = 0;
        while j < self.toks.len() && steps < 8 {
            let t = &self.toks[j];
            if t.ends_sentence() {
                break;
            }
            look(t);
            j += 1;
            steps += 1;
        }
        fut && !past
    }

    fn match_at(&self, i: usize) -> Option<TimeMatch> {
        self.iso(i)
            .or_else(|| self.relative_day(i))
            .or_else(|| self.counted(i))
            .or_else(|| self.modified(i))
            .or_else(|| self.part_of(i))
            .or_else(|| self.day_month(i))
            .or_else(|| self.month_day(i))
            .or_else(|| self.month_year(i))
            .or_else(|| self.season_bare(i))
            .or_else(|| self.weekday_bare(i))
            .or_else(|| self.weekend_bare(i))
            .or_else(|| self.month_bare(i))
            .or_else(|| self.year_bare(i))
    }

    /// 2023-05-08, 2023/05/08, 05/08/2023 (US order).
    fn iso(&self, i: usize) -> Option<TimeMatch> {
        if let Some(y) = self.year(i) {
            for sep in ["-", "/"] {
                if self.punct(i + 1, sep)
                    && self.punct(i + 3, sep)
                    && (i..i + 4).all(|k| self.adjacent(k))
                {
                    let m = self.num(i + 2)?;
                    let d = self.iso_day(i + 4)?;
                    let date = NaiveDate::from_ymd_opt(y, m, d)?;
                    return Some(tm(i, i + 4, (date, date), Gran::Day, true));
                }
            }
            return None;
        }
        let m = self.num(i)?;
        if self.punct(i + 1, "/") && self.punct(i + 3, "/") && (i..i + 4).all(|k| self.adjacent(k))
        {
            let d = self.num(i + 2)?;
            let y = self.year(i + 4)?;
            let date = NaiveDate::from_ymd_opt(y, m, d)?;
            return Some(tm(i, i + 4, (date, date), Gran::Day, true));
        }
        None
    }

    /// The day of an ISO date, also when glued to a time ("08T13").
    fn iso_day(&self, i: usize) -> Option<u32> {
        let t = self.toks.get(i)?;
        if t.kind == TokKind::Num && t.surface.len() <= 2 {
            return t.surface.parse().ok();
        }
        let l = t.lower.as_str();
        let (d, rest) = l.split_at_checked(2)?;
        if rest.starts_with('t') && d.bytes().all(|b| b.is_ascii_digit()) {
            return d.parse().ok();
        }
        None
    }

    fn relative_day(&self, i: usize) -> Option<TimeMatch> {
        let a = self.a;
        let w = self.w(i)?;
        let day = |first, last, off: i64| {
            let d = shift_days(a, off)?;
            Some(tm(first, last, (d, d), Gran::Day, false))
        };
        let with_part = |j: usize| if self.day_part(j + 1) { j + 1 } else { j };
        match w {
            "today" | "tonight" => day(i, i, 0),
            "yesterday" => day(i, with_part(i), -1),
            "tomorrow" => day(i, with_part(i), 1),
            "earlier" | "later" if self.is_any(i + 1, &["today", "tonight"]) => day(i, i + 1, 0),
            "the" | "day" => {
                let j = if w == "the" { i + 1 } else { i };
                if w == "the" && !self.is(j, "day") {
                    if self.is(j, "other") && self.is(j + 1, "day") {
                        return self.recent(i, j + 1);
                    }
                    return None;
                }
                if self.is(j + 1, "before") && self.is(j + 2, "yesterday") {
                    day(i, j + 2, -2)
                } else if self.is(j + 1, "after") && self.is(j + 2, "tomorrow") {
                    day(i, j + 2, 2)
                } else {
                    None
                }
            }
            "recently" | "lately" => self.recent(i, i),
            _ => None,
        }
    }

    /// "recently", "the other day": the last week, coarse on purpose.
    fn recent(&self, first: usize, last: usize) -> Option<TimeMatch> {
        let s = shift_days(self.a, -7)?;
        Some(tm(first, last, (s, self.a), Gran::Week, false))
    }

    /// "two weeks ago", "in 3 days", "a few months from now", "the last two weeks".
    fn counted(&self, i: usize) -> Option<TimeMatch> {
        let a = self.a;
        // "in N units" (future)
        if self.is(i, "in") {
            let j = if self.is_any(i + 1, &["about", "around", "like", "just"]) {
                i + 2
            } else {
                i + 1
            };
            let (c, k) = self.count(j)?;
            let u = self.unit(k)?;
            if self.is(k + 1, "time") {
                return self.offset(i, k + 1, c, u, 1);
            }
            return self.offset(i, k, c, u, 1);
        }
        // "last/past/next N units" (a span touching the anchor)
        if self.is_any(i, &["last", "past", "next", "previous"]) {
            let (c, k) = self.count(i + 1)?;
            if matches!(self.w(i + 1), Some("a" | "an" | "one")) {
                return None; // "last one", "next a" are not spans
            }
            let u = self.unit(k)?;
            let n = match c {
                Count::Exact(n) | Count::Vague(_, n) => n,
            };
            let forward = self.is(i, "next");
            let (s, e) = if forward {
                (a, shift_units(a, u, n as i64)?)
            } else {
                (shift_units(a, u, -(n as i64))?, a)
            };
            return Some(tm(i, k, (s, e), coarser(u), false));
        }
        // "N units ago" / "N units from now"
        let (c, k) = self.count(i)?;
        let u = self.unit(k)?;
        if self.is(k + 1, "ago") {
            return self.offset(i, k + 1, c, u, -1);
        }
        if self.is(k + 1, "from") && self.is(k + 2, "now") {
            return self.offset(i, k + 2, c, u, 1);
        }
        if self.is(k + 1, "before") && self.is(k + 2, "yesterday") && u == Unit::Day {
            if let Count::Exact(n) = c {
                let d = shift_days(a, -(n as i64) - 1)?;
                return Some(tm(i, k + 2, (d, d), Gran::Day, false));
            }
        }
        None
    }

    /// The range `count` units away from the anchor in direction `sign`.
    fn offset(&self, first: usize, last: usize, c: Count, u: Unit, sign: i64) -> Option<TimeMatch> {
        let a = self.a;
        match c {
            Count::Exact(n) => {
                let n = n as i64 * sign;
                let r = match u {
                    Unit::Day => {
                        let d = shift_days(a, n)?;
                        (d, d)
                    }
                    Unit::Week => week_of(shift_days(a, n * 7)?)?,
                    Unit::Month => {
                        let d = shift_months(a, n)?;
                        month_range(d.year(), d.month())?
                    }
                    Unit::Year => year_range(a.year().checked_add(n as i32)?)?,
                };
                let g = match u {
                    Unit::Day => Gran::Day,
                    Unit::Week => Gran::Week,
                    Unit::Month => Gran::Month,
                    Unit::Year => Gran::Year,
                };
                Some(tm(first, last, r, g, false))
            }
            Count::Vague(lo, hi) => {
                let (near, far) = (lo as i64 * sign, hi as i64 * sign);
                let (x, y) = (shift_units(a, u, near)?, shift_units(a, u, far)?);
                let (s, e) = if x <= y { (x, y) } else { (y, x) };
                let r = match u {
                    Unit::Day => (s, e),
                    Unit::Week => (week_of(s)?.0, week_of(e)?.1),
                    Unit::Month => (
                        month_range(s.year(), s.month())?.0,
                        month_range(e.year(), e.month())?.1,
                    ),
                    Unit::Year => (year_range(s.year())?.0, year_range(e.year())?.1),
                };
                Some(tm(first, last, r, coarser(u), false))
            }
        }
    }

    /// last/this/next + week, weekend, month, year, weekday, month name, season, night.
    fn modified(&self, i: usize) -> Option<TimeMatch> {
        let a = self.a;
        let (m, j) = match self.w(i)? {
            "this" if self.is(i + 1, "past") => (Modifier::Last, i + 2),
            "this" if self.is_any(i + 1, &["coming", "upcoming"]) => (Modifier::Next, i + 2),
            "earlier" | "later" if self.is(i + 1, "this") => (Modifier::This, i + 2),
            "last" | "past" | "previous" => (Modifier::Last, i + 1),
            "this" => (Modifier::This, i + 1),
            "next" | "coming" | "upcoming" => (Modifier::Next, i + 1),
            _ => return None,
        };
        let step: i64 = match m {
            Modifier::Last => -1,
            Modifier::This => 0,
            Modifier::Next => 1,
        };
        let w = self.w(j)?;
        match w {
            "week" => Some(tm(
                i,
                j,
                week_of(shift_days(a, 7 * step)?)?,
                Gran::Week,
                false,
            )),
            "weekend" => {
                let (sat, _) = weekend_of_week(a)?;
                let sat = shift_days(sat, 7 * step)?;
                Some(tm(i, j, (sat, shift_days(sat, 1)?), Gran::Week, false))
            }
            "month" => {
                let d = shift_months(a, step)?;
                Some(tm(
                    i,
                    j,
                    month_range(d.year(), d.month())?,
                    Gran::Month,
                    false,
                ))
            }
            "year" => Some(tm(
                i,
                j,
                year_range(a.year().checked_add(step as i32)?)?,
                Gran::Year,
                false,
            )),
            "night" if m == Modifier::Last => {
                let d = shift_days(a, -1)?;
                Some(tm(i, j, (d, d), Gran::Day, false))
            }
            "morning" | "afternoon" | "evening" | "night" if m == Modifier::This => {
                Some(tm(i, j, (a, a), Gran::Day, false))
            }
            _ => {
                if let Some(wd) = self.weekday(j) {
                    let d = match m {
                        Modifier::Last => prev_weekday(a, wd, true)?,
                        Modifier::Next => next_weekday(a, wd, true)?,
                        Modifier::This => next_weekday(a, wd, false)?,
                    };
                    let last = if self.day_part(j + 1) { j + 1 } else { j };
                    return Some(tm(i, last, (d, d), Gran::Day, false));
                }
                if let Some(mo) = self.month(j, true) {
                    let y = match m {
                        Modifier::Last => {
                            if mo < a.month() {
                                a.year()
                            } else {
                                a.year() - 1
                            }
                        }
                        Modifier::This => a.year(),
                        Modifier::Next => {
                            if mo > a.month() {
                                a.year()
                            } else {
                                a.year() + 1
                            }
                        }
                    };
                    return Some(tm(i, j, month_range(y, mo)?, Gran::Month, false));
                }
                if let Some(s) = self.season(j) {
                    let r = match m {
                        Modifier::Last => last_season(a, s)?,
                        Modifier::This => this_season(a, s)?,
                        Modifier::Next => next_season(a, s)?,
                    };
                    return Some(tm(i, j, r, Gran::Season, false));
                }
                None
            }
        }
    }

    /// early/mid/late + month or year.
    fn part_of(&self, i: usize) -> Option<TimeMatch> {
        let part = match self.w(i)? {
            "early" => 0,
            "mid" | "middle" => 1,
            "late" => 2,
            _ => return None,
        };
        let j = if self.is(i + 1, "in") || self.is(i + 1, "of") {
            i + 2
        } else {
            i + 1
        };
        if let Some(y) = self.year(j) {
            let (s, e) = match part {
                0 => ((1, 1), (4, 30)),
                1 => ((5, 1), (8, 31)),
                _ => ((9, 1), (12, 31)),
            };
            let r = (
                NaiveDate::from_ymd_opt(y, s.0, s.1)?,
                NaiveDate::from_ymd_opt(y, e.0, e.1)?,
            );
            return Some(tm(i, j, r, Gran::Season, true));
        }
        let mo = self.month(j, true)?;
        let (y, last, absolute) = match self.year(j + 1) {
            Some(y) => (y, j + 1, true),
            None => (self.month_year_for(mo, i, j), j, false),
        };
        let (ms, me) = month_range(y, mo)?;
        let r = match part {
            0 => (ms, ms.with_day(10)?),
            1 => (ms.with_day(11)?, ms.with_day(20)?),
            _ => (ms.with_day(21)?, me),
        };
        Some(tm(i, last, r, Gran::Week, absolute))
    }

    /// Year for a bare month name: most recent one not after the anchor, or the coming one
    /// when the sentence is about the future.
    fn month_year_for(&self, mo: u32, first: usize, last: usize) -> i32 {
        let a = self.a;
        if self.future_context(first, last) {
            if mo >= a.month() {
                a.year()
            } else {
                a.year() + 1
            }
        } else if mo <= a.month() {
            a.year()
        } else {
            a.year() - 1
        }
    }

    /// Year for a day without one: nearest to the anchor, or the next one in future context.
    fn day_year_for(&self, mo: u32, d: u32, first: usize, last: usize) -> Option<NaiveDate> {
        let a = self.a;
        let y = a.year();
        let cands: Vec<NaiveDate> = [y - 1, y, y + 1]
            .iter()
            .filter_map(|&yy| NaiveDate::from_ymd_opt(yy, mo, d))
            .collect();
        if self.future_context(first, last) {
            if let Some(c) = cands.iter().find(|c| **c >= a) {
                return Some(*c);
            }
        }
        cands.into_iter().min_by_key(|c| (*c - a).num_days().abs())
    }

    /// [the] 8[th] [of] May[,] [2023]
    fn day_month(&self, i: usize) -> Option<TimeMatch> {
        let mut j = i;
        if self.is(j, "the") {
            j += 1;
            self.ordinal_day(j)?;
        }
        let d = self.day(j)?;
        let mut k = j + 1;
        if self.is(k, "of") {
            k += 1;
        }
        let Some(mo) = self.month(k, true) else {
            // "on the 3rd": a day of the anchor's month or a neighbouring one.
            if k == j + 1 && self.is(i, "the") && self.prev_word(i) == Some("on") {
                return self.nth_nearby(i, j, d);
            }
            return None;
        };
        let mut last = k;
        let mut year = None;
        let yi = if self.punct(k + 1, ",") { k + 2 } else { k + 1 };
        if let Some(y) = self.year(yi) {
            year = Some(y);
            last = yi;
        }
        let date = match year {
            Some(y) => NaiveDate::from_ymd_opt(y, mo, d)?,
            None => self.day_year_for(mo, d, i, last)?,
        };
        Some(tm(i, last, (date, date), Gran::Day, year.is_some()))
    }

    /// Day `d` of the previous, current or next month: the latest one not after the anchor,
    /// or the first one not before it in future context.
    fn nth_nearby(&self, first: usize, last: usize, d: u32) -> Option<TimeMatch> {
        let a = self.a;
        let cands: Vec<NaiveDate> = [-1i64, 0, 1]
            .iter()
            .filter_map(|&off| shift_months(a.with_day(1)?, off))
            .filter_map(|m| m.with_day(d))
            .collect();
        let date = if self.future_context(first, last) {
            cands.into_iter().find(|c| *c >= a)?
        } else {
            cands.into_iter().rev().find(|c| *c <= a)?
        };
        Some(tm(first, last, (date, date), Gran::Day, false))
    }

    /// May 8[th][,] [2023]; "May the 8th".
    fn month_day(&self, i: usize) -> Option<TimeMatch> {
        let strong = self.toks.get(i).is_some_and(|t| t.cap())
            || self.prev_word(i).is_some_and(|p| {
                matches!(
                    p,
                    "on" | "in" | "of" | "since" | "by" | "until" | "before" | "after"
                )
            });
        let mo = self.month(i, strong)?;
        if !strong && ambiguous_month(self.w(i)?) {
            return None;
        }
        let mut j = i + 1;
        if self.is(j, "the") {
            j += 1;
        }
        let d = self.day(j)?;
        // "May 2023" is a month; a two-digit "May 20" is a day only if not followed by a unit.
        if self.unit(j + 1).is_some()
            || self.is_any(j + 1, &["people", "times", "of", "am", "pm", "percent"])
        {
            return None;
        }
        let yi = if self.punct(j + 1, ",") { j + 2 } else { j + 1 };
        let (date, last, absolute) = match self.year(yi) {
            Some(y) => (NaiveDate::from_ymd_opt(y, mo, d)?, yi, true),
            None => (self.day_year_for(mo, d, i, j)?, j, false),
        };
        Some(tm(i, last, (date, date), Gran::Day, absolute))
    }

    /// May 2023, May of 2023, May, 2023.
    fn month_year(&self, i: usize) -> Option<TimeMatch> {
        let mo = self.month(i, true)?;
        let mut j = i + 1;
        if self.is(j, "of") || self.punct(j, ",") {
            j += 1;
        }
        let y = self.year(j)?;
        Some(tm(i, j, month_range(y, mo)?, Gran::Month, true))
    }

    /// "in the summer", "summer 2022", "the summer of 2022", "over the winter".
    fn season_bare(&self, i: usize) -> Option<TimeMatch> {
        let (first, j) = if self.is(i, "the") {
            (i, i + 1)
        } else {
            (i, i)
        };
        let s = self.season(j)?;
        let mut yi = j + 1;
        if self.is(yi, "of") || self.punct(yi, ",") {
            yi += 1;
        }
        if let Some(y) = self.year(yi) {
            return Some(tm(first, yi, season_range(s, y)?, Gran::Season, true));
        }
        // Without a year, a season needs a determiner: "fall" and "spring" are also verbs/nouns.
        let qualified = self.is(i, "the")
            || self.prev_word(i).is_some_and(|p| {
                matches!(
                    p,
                    "in" | "during" | "over" | "all" | "for" | "this" | "since"
                )
            });
        if !qualified || self.is(j + 1, "of") {
            return None;
        }
        let a = self.a;
        let r = if self.future_context(first, j) {
            // The current one if still running, else the next.
            let cur = this_season(a, s)?;
            if cur.1 >= a {
                cur
            } else {
                next_season(a, s)?
            }
        } else {
            let cur = this_season(a, s)?;
            if cur.0 <= a {
                cur
            } else {
                last_season(a, s)?
            }
        };
        Some(tm(first, j, r, Gran::Season, false))
    }

    /// "on Friday", "Friday night": the nearest past one, or the coming one in future context.
    fn weekday_bare(&self, i: usize) -> Option<TimeMatch> {
        let wd = self.weekday(i)?;
        let last = if self.day_part(i + 1) { i + 1 } else { i };
        let d = if self.future_context(i, last) {
            next_weekday(self.a, wd, true)?
        } else {
            prev_weekday(self.a, wd, true)?
        };
        Some(tm(i, last, (d, d), Gran::Day, false))
    }

    /// "the weekend", "over the weekend".
    fn weekend_bare(&self, i: usize) -> Option<TimeMatch> {
        if !(self.is(i, "the") && self.is(i + 1, "weekend")) {
            return None;
        }
        let a = self.a;
        let (sat, _) = weekend_of_week(a)?;
        let in_weekend = a >= sat;
        let sat = if self.future_context(i, i + 1) || in_weekend {
            sat
        } else {
            shift_days(sat, -7)?
        };
        Some(tm(i, i + 1, (sat, shift_days(sat, 1)?), Gran::Week, false))
    }

    /// "in May", "since March", "June": a month without day or year.
    fn month_bare(&self, i: usize) -> Option<TimeMatch> {
        let t = self.toks.get(i)?;
        let cue = self.prev_word(i).is_some_and(|p| {
            matches!(
                p,
                "in" | "during"
                    | "since"
                    | "until"
                    | "till"
                    | "by"
                    | "before"
                    | "after"
                    | "of"
                    | "from"
                    | "through"
                    | "around"
                    | "early"
                    | "late"
                    | "mid"
                    | "end"
            )
        });
        let strong = cue || (t.cap() && !t.sent_start);
        let mo = self.month(i, strong)?;
        // Abbreviations need a number next to them.
        month_of(&t.lower, false)?;
        if ambiguous_month(&t.lower) && !cue {
            return None;
        }
        let y = self.month_year_for(mo, i, i);
        Some(tm(i, i, month_range(y, mo)?, Gran::Month, false))
    }

    /// "in 2022", "since 2019", "the year 2020".
    fn year_bare(&self, i: usize) -> Option<TimeMatch> {
        let y = self.year(i)?;
        if !(1900..=2100).contains(&y) {
            return None;
        }
        let cue = self.prev_word(i).is_some_and(|p| {
            matches!(
                p,
                "in" | "since"
                    | "during"
                    | "until"
                    | "till"
                    | "before"
                    | "after"
                    | "by"
                    | "of"
                    | "from"
                    | "to"
                    | "through"
                    | "year"
                    | "around"
                    | "circa"
                    | "and"
                    | "back"
                    | "between"
            )
        });
        if !cue {
            return None;
        }
        Some(tm(i, i, year_range(y)?, Gran::Year, true))
    }
}

fn coarser(u: Unit) -> Gran {
    match u {
        Unit::Day => Gran::Week,
        Unit::Week => Gran::Month,
        Unit::Month => Gran::Season,
        Unit::Year => Gran::Year,
    }
}

fn shift_days(d: NaiveDate, n: i64) -> Option<NaiveDate> {
    if n >= 0 {
        d.checked_add_days(Days::new(n as u64))
    } else {
        d.checked_sub_days(Days::new(n.unsigned_abs()))
    }
}

fn shift_months(d: NaiveDate, n: i64) -> Option<NaiveDate> {
    let n32 = u32::try_from(n.unsigned_abs()).ok()?;
    if n >= 0 {
        d.checked_add_months(Months::new(n32))
    } else {
        d.checked_sub_months(Months::new(n32))
    }
}

fn shift_units(d: NaiveDate, u: Unit, n: i64) -> Option<NaiveDate> {
    match u {
        Unit::Day => shift_days(d, n),
        Unit::Week => shift_days(d, n.checked_mul(7)?),
        Unit::Month => shift_months(d, n),
        Unit::Year => shift_months(d, n.checked_mul(12)?),
    }
}

/// Monday..Sunday of the week containing `d`.
fn week_of(d: NaiveDate) -> Option<(NaiveDate, NaiveDate)> {
    let mon = shift_days(d, -(d.weekday().num_days_from_monday() as i64))?;
    Some((mon, shift_days(mon, 6)?))
}

/// Saturday and Sunday of the (Monday-based) week containing `d`.
fn weekend_of_week(d: NaiveDate) -> Option<(NaiveDate, NaiveDate)> {
    let (mon, sun) = week_of(d)?;
    Some((shift_days(mon, 5)?, sun))
}

pub(crate) fn month_range(y: i32, m: u32) -> Option<(NaiveDate, NaiveDate)> {
    let first = NaiveDate::from_ymd_opt(y, m, 1)?;
    let last = first.checked_add_months(Months::new(1))?.pred_opt()?;
    Some((first, last))
}

pub(crate) fn year_range(y: i32) -> Option<(NaiveDate, NaiveDate)> {
    Some((
        NaiveDate::from_ymd_opt(y, 1, 1)?,
        NaiveDate::from_ymd_opt(y, 12, 31)?,
    ))
}

fn prev_weekday(a: NaiveDate, wd: Weekday, strict: bool) -> Option<NaiveDate> {
    let mut diff = (a.weekday().num_days_from_monday() + 7 - wd.num_days_from_monday()) % 7;
    if diff == 0 && strict {
        diff = 7;
    }
    shift_days(a, -(diff as i64))
}

fn next_weekday(a: NaiveDate, wd: Weekday, strict: bool) -> Option<NaiveDate> {
    let mut diff = (wd.num_days_from_monday() + 7 - a.weekday().num_days_from_monday()) % 7;
    if diff == 0 && strict {
        diff = 7;
    }
    shift_days(a, diff as i64)
}

/// Meteorological (northern) seasons; winter `y` runs from December `y` to February `y+1`.
fn season_range(s: Season, y: i32) -> Option<(NaiveDate, NaiveDate)> {
    let (sm, em, ey) = match s {
        Season::Spring => (3, 5, y),
        Season::Summer => (6, 8, y),
        Season::Fall => (9, 11, y),
        Season::Winter => (12, 2, y.checked_add(1)?),
    };
    Some((NaiveDate::from_ymd_opt(y, sm, 1)?, month_range(ey, em)?.1))
}

/// The instance of `s` belonging to the anchor's season-year (the running one if in it).
fn this_season(a: NaiveDate, s: Season) -> Option<(NaiveDate, NaiveDate)> {
    let y = if s == Season::Winter && a.month() <= 2 {
        a.year() - 1
    } else {
        a.year()
    };
    season_range(s, y)
}

/// The most recent instance of `s` that has already ended.
fn last_season(a: NaiveDate, s: Season) -> Option<(NaiveDate, NaiveDate)> {
    for back in 0..3 {
        let r = season_range(s, a.year().checked_sub(back)?)?;
        if r.1 < a {
            return Some(r);
        }
    }
    None
}

/// The first instance of `s` that starts after the anchor.
fn next_season(a: NaiveDate, s: Season) -> Option<(NaiveDate, NaiveDate)> {
    for fwd in -1..2 {
        let r = season_range(s, a.year().checked_add(fwd)?)?;
        if r.0 > a {
            return Some(r);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anchor() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2023, 5, 8, 13, 56, 0).unwrap() // a Monday
    }

    fn d(y: i32, m: u32, dd: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(y, m, dd).unwrap()
    }

    fn one(text: &str) -> TimeRef {
        let v = parse_times(text, anchor());
        assert_eq!(v.len(), 1, "{text:?} gave {v:?}");
        v.into_iter().next().unwrap()
    }

    fn range(text: &str) -> (NaiveDate, NaiveDate, String) {
        let t = one(text);
        (t.start, t.end, t.granularity)
    }

    fn day(text: &str) -> NaiveDate {
        let (s, e, g) = range(text);
        assert_eq!(s, e, "{text}");
        assert_eq!(g, "day", "{text}");
        s
    }

    #[test]
    fn calendar_relative_days() {
        assert_eq!(day("I did it yesterday."), d(2023, 5, 7));
        assert_eq!(day("today was long"), d(2023, 5, 8));
        assert_eq!(day("party tonight!"), d(2023, 5, 8));
        assert_eq!(day("this morning I ran"), d(2023, 5, 8));
        assert_eq!(day("this evening"), d(2023, 5, 8));
        assert_eq!(day("last night was fun"), d(2023, 5, 7));
        assert_eq!(day("see you tomorrow"), d(2023, 5, 9));
        assert_eq!(day("the day before yesterday"), d(2023, 5, 6));
        assert_eq!(day("the day after tomorrow"), d(2023, 5, 10));
        assert_eq!(one("yesterday morning").text, "yesterday morning");
    }

    #[test]
    fn weeks_months_years() {
        assert_eq!(
            range("last week"),
            (d(2023, 5, 1), d(2023, 5, 7), "week".into())
        );
        assert_eq!(
            range("this week"),
            (d(2023, 5, 8), d(2023, 5, 14), "week".into())
        );
        assert_eq!(
            range("next week"),
            (d(2023, 5, 15), d(2023, 5, 21), "week".into())
        );
        assert_eq!(
            range("last weekend"),
            (d(2023, 5, 6), d(2023, 5, 7), "week".into())
        );
        assert_eq!(
            range("this weekend"),
            (d(2023, 5, 13), d(2023, 5, 14), "week".into())
        );
        assert_eq!(
            range("over the weekend I hiked"),
            (d(2023, 5, 6), d(2023, 5, 7), "week".into())
        );
        assert_eq!(
            range("last month"),
            (d(2023, 4, 1), d(2023, 4, 30), "month".into())
        );
        assert_eq!(
            range("this month"),
            (d(2023, 5, 1), d(2023, 5, 31), "month".into())
        );
        assert_eq!(
            range("next month"),
            (d(2023, 6, 1), d(2023, 6, 30), "month".into())
        );
        assert_eq!(
            range("last year"),
            (d(2022, 1, 1), d(2022, 12, 31), "year".into())
        );
        assert_eq!(
            range("next year"),
            (d(2024, 1, 1), d(2024, 12, 31), "year".into())
        );
        assert_eq!(one("earlier this year").text, "earlier this year");
    }

    #[test]
    fn weekdays() {
        assert_eq!(day("last Friday"), d(2023, 5, 5));
        assert_eq!(day("this past Friday"), d(2023, 5, 5));
        assert_eq!(day("next Friday"), d(2023, 5, 12));
        assert_eq!(day("this Friday"), d(2023, 5, 12));
        assert_eq!(day("I went hiking on Friday"), d(2023, 5, 5));
        assert_eq!(day("we met Sunday night"), d(2023, 5, 7));
        assert_eq!(day("I'm going to the concert on Friday"), d(2023, 5, 12));
        assert_eq!(day("I will see her on Wednesday"), d(2023, 5, 10));
        assert_eq!(day("last Monday"), d(2023, 5, 1));
        assert!(parse_times("I love Fridays", anchor()).is_empty());
    }

    #[test]
    fn counted_offsets() {
        let (s, e, g) = range("two weeks ago");
        assert!(s <= d(2023, 4, 24) && d(2023, 4, 24) <= e);
        assert_eq!((e - s).num_days(), 6);
        assert_eq!(g, "week");
        assert_eq!(day("3 days ago"), d(2023, 5, 5));
        assert_eq!(day("a day ago"), d(2023, 5, 7));
        assert_eq!(
            range("a month ago"),
            (d(2023, 4, 1), d(2023, 4, 30), "month".into())
        );
        assert_eq!(
            range("two years ago"),
            (d(2021, 1, 1), d(2021, 12, 31), "year".into())
        );
        assert_eq!(range("ten years ago").0, d(2013, 1, 1));
        assert_eq!(day("in 3 days"), d(2023, 5, 11));
        assert_eq!(range("in two weeks").0, d(2023, 5, 22));
        assert_eq!(
            range("in a month"),
            (d(2023, 6, 1), d(2023, 6, 30), "month".into())
        );
        let (s, e, g) = range("a few days ago");
        assert_eq!((s, e, g.as_str()), (d(2023, 5, 4), d(2023, 5, 6), "week"));
        let (s, e, _) = range("a couple of weeks ago");
        assert!(s <= d(2023, 4, 24) && e >= d(2023, 4, 30) && e < d(2023, 5, 8));
        let (s, e, _) = range("several months ago");
        assert!(s < d(2023, 2, 1) && e < d(2023, 5, 1));
        assert_eq!(one("about two weeks ago").text, "two weeks ago");
        assert_eq!(
            range("the past two weeks"),
            (d(2023, 4, 24), d(2023, 5, 8), "month".into())
        );
        assert_eq!(day("two days from now"), d(2023, 5, 10));
        assert!(parse_times("I have two days off", anchor()).is_empty());
    }

    #[test]
    fn explicit_dates() {
        assert_eq!(day("on 8 May"), d(2023, 5, 8));
        assert_eq!(one("on 8 May").text, "8 May");
        assert_eq!(day("8 May 2023"), d(2023, 5, 8));
        assert_eq!(day("May 8"), d(2023, 5, 8));
        assert_eq!(day("May 8th, 2023"), d(2023, 5, 8));
        assert_eq!(day("the 8th of May"), d(2023, 5, 8));
        assert_eq!(day("on 2 December"), d(2022, 12, 2));
        assert_eq!(day("We met on the 3rd."), d(2023, 5, 3));
        assert_eq!(day("We met on the 30th."), d(2023, 4, 30));
        assert_eq!(day("The party will be on the 20th!"), d(2023, 5, 20));
        assert_eq!(one("We met on the 3rd.").text, "the 3rd");
        assert_eq!(day("2022-11-03"), d(2022, 11, 3));
        assert_eq!(day("at 2023-05-08T13:56:00Z"), d(2023, 5, 8));
        assert_eq!(day("12/25/2021"), d(2021, 12, 25));
        assert_eq!(
            range("May 2023"),
            (d(2023, 5, 1), d(2023, 5, 31), "month".into())
        );
        assert_eq!(
            range("in March of 2021"),
            (d(2021, 3, 1), d(2021, 3, 31), "month".into())
        );
        assert_eq!(
            range("in 2022"),
            (d(2022, 1, 1), d(2022, 12, 31), "year".into())
        );
        assert_eq!(range("since 2019").0, d(2019, 1, 1));
        assert_eq!(
            range("early 2022"),
            (d(2022, 1, 1), d(2022, 4, 30), "season".into())
        );
        assert_eq!(
            range("late 2022"),
            (d(2022, 9, 1), d(2022, 12, 31), "season".into())
        );
        assert!(parse_times("I ran 2022 meters", anchor()).is_empty());
        assert!(one("8 May 2023").text == "8 May 2023");
    }

    #[test]
    fn months_and_seasons() {
        assert_eq!(
            range("in May"),
            (d(2023, 5, 1), d(2023, 5, 31), "month".into())
        );
        assert_eq!(
            range("back in February"),
            (d(2023, 2, 1), d(2023, 2, 28), "month".into())
        );
        assert_eq!(
            range("we went in July"),
            (d(2022, 7, 1), d(2022, 7, 31), "month".into())
        );
        assert_eq!(range("I'm going to Paris in July").0, d(2023, 7, 1));
        assert_eq!(
            range("last May"),
            (d(2022, 5, 1), d(2022, 5, 31), "month".into())
        );
        assert_eq!(range("last April").0, d(2023, 4, 1));
        assert_eq!(range("next May").0, d(2024, 5, 1));
        assert_eq!(range("next June").0, d(2023, 6, 1));
        assert_eq!(
            range("last summer"),
            (d(2022, 6, 1), d(2022, 8, 31), "season".into())
        );
        assert_eq!(
            range("this summer"),
            (d(2023, 6, 1), d(2023, 8, 31), "season".into())
        );
        assert_eq!(
            range("last winter"),
            (d(2022, 12, 1), d(2023, 2, 28), "season".into())
        );
        assert_eq!(range("last fall").0, d(2022, 9, 1));
        assert_eq!(range("last autumn").0, d(2022, 9, 1));
        assert_eq!(range("in the spring").0, d(2023, 3, 1));
        assert_eq!(
            range("summer 2021"),
            (d(2021, 6, 1), d(2021, 8, 31), "season".into())
        );
        assert_eq!(
            range("recently"),
            (d(2023, 5, 1), d(2023, 5, 8), "week".into())
        );
        assert_eq!(range("the other day").2, "week");
        // Modal "may", verbs "fall" and "march" are not times.
        assert!(parse_times("May I ask? You may fall. They march on.", anchor()).is_empty());
        assert!(parse_times("I love the spring of water", anchor()).is_empty());
    }

    #[test]
    fn several_in_one_text_keep_order() {
        let v = parse_times(
            "Yesterday I booked a trip for next month; we met last Friday.",
            anchor(),
        );
        let texts: Vec<&str> = v.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(texts, vec!["Yesterday", "next month", "last Friday"]);
    }

    #[test]
    fn extreme_anchors_do_not_panic() {
        for a in [DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC] {
            let v = parse_times(
                "yesterday tomorrow next week last year in 10 years 500 years ago next summer last winter Friday in May 9999-12-31",
                a,
            );
            assert!(v.len() < 20);
        }
    }

    #[test]
    fn session_stamps() {
        let t = parse_date_time("1:56 pm on 8 May, 2023").unwrap();
        assert_eq!(t, Utc.with_ymd_and_hms(2023, 5, 8, 13, 56, 0).unwrap());
        let t = parse_date_time("12:09 am on 13 September, 2023").unwrap();
        assert_eq!(t, Utc.with_ymd_and_hms(2023, 9, 13, 0, 9, 0).unwrap());
        let t = parse_date_time("10:37 am on 27 June, 2023").unwrap();
        assert_eq!(t, Utc.with_ymd_and_hms(2023, 6, 27, 10, 37, 0).unwrap());
        let t = parse_date_time("2023-05-08T13:56:00+02:00").unwrap();
        assert_eq!(t, Utc.with_ymd_and_hms(2023, 5, 8, 11, 56, 0).unwrap());
        assert_eq!(
            parse_date_time("May 8, 2023").unwrap(),
            Utc.with_ymd_and_hms(2023, 5, 8, 0, 0, 0).unwrap()
        );
        assert!(parse_date_time("13:56 pm on 8 May, 2023").is_none());
        assert!(parse_date_time("on 8 May").is_none());
        assert!(parse_date_time("yesterday").is_none());
        assert!(parse_date_time("").is_none());
    }
}

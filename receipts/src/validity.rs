//! Validity time: when a revision held, as distinct from when cairn learned it (record time).
//!
//! ## Model (the XTDB and SQL:2011 rule)
//! - An **assertion** says "revision X held over `[valid_from, valid_to)`". Every acceptance
//!   that writes is one, made at its **record time**; without a period it asserts
//!   `[record time, open)`, which is exactly what cairn meant before validity existed.
//! - Assertions of a source are ordered by the ledger (a per-source sequence), never by time
//!   alone, and record time increases strictly per source ([`record_time`]).
//! - A later assertion overrides earlier ones **only over its own period**: a later
//!   `valid_from` closes the previous revision at that instant, a backdated open one corrects
//!   back to it, and a bounded one splits the revision it lands in.
//! - The ledger keeps both the append-only assertions and the derived **rectangles**: a
//!   revision holding over a valid period during a record period. Applying an assertion
//!   ([`apply`]) closes, at its record time, every believed rectangle its period overlaps, and
//!   believes again the parts of them outside its period, beside its own.
//! - A tombstone is asserted like a revision ("gone from X"): a rectangle of the tombstone
//!   revision means the source did not exist there.
//!
//! ## Invariants
//! - At any record time the believed rectangles of a source are disjoint in valid time, so
//!   "what held at T as known at R" ([`held`]) has at most one answer.
//! - Rectangles are never empty: `valid_from < valid_to` and `recorded_from < recorded_to`.
//! - An open end is [`OPEN`] (2^53 - 1) everywhere, ledger and stores alike: Qdrant compares
//!   ranges as floats, and 2^53 - 1 is the largest integer a float holds exactly.
//! - On the wire an instant is integer epoch microseconds or RFC 3339 with an offset
//!   ([`parse_instant`]); a bare date or a time without an offset is refused.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::clock::Micros;
use crate::error::{LedgerError, Result};

/// The open end of a period (2^53 - 1 microseconds): later than any instant cairn accepts.
pub const OPEN: Micros = (1 << 53) - 1;

/// A half-open period `[from, to)`; `to == OPEN` is open-ended.
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Period {
    /// The first instant it covers.
    pub from: Micros,
    /// The first instant it no longer covers ([`OPEN`]: never ends).
    pub to: Micros,
}

impl Period {
    /// Whether `instant` lies in the period.
    pub fn contains(&self, instant: Micros) -> bool {
        self.from <= instant && instant < self.to
    }

    /// Whether the two periods share an instant.
    pub fn overlaps(&self, other: &Period) -> bool {
        self.from < other.to && other.from < self.to
    }

    /// Whether it never ends.
    pub fn is_open(&self) -> bool {
        self.to == OPEN
    }
}

/// What a submission says about validity. Both absent: the revision holds from its record
/// time on.
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Validity {
    /// When it starts to hold (absent: its record time).
    pub valid_from: Option<Micros>,
    /// When it stops holding (absent: never).
    pub valid_to: Option<Micros>,
}

impl Validity {
    /// Whether the submission said anything about validity.
    pub fn is_given(&self) -> bool {
        self.valid_from.is_some() || self.valid_to.is_some()
    }

    /// The period asserted at `recorded_at`, or the typed refusal of an empty one.
    pub fn period(&self, recorded_at: Micros) -> Result<Period> {
        let from = self.valid_from.unwrap_or(recorded_at);
        let to = self.valid_to.unwrap_or(OPEN);
        if from >= to {
            return Err(LedgerError::invalid(
                "empty_validity",
                format!(
                    "valid_from ({}) must be earlier than valid_to ({}); a period holds at least \
                     one microsecond",
                    format_instant(from),
                    format_instant(to)
                ),
            ));
        }
        Ok(Period { from, to })
    }
}

/// A revision holding over `valid` while cairn believed it, during `[recorded_from,
/// recorded_to)`.
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rectangle {
    /// Its id.
    pub id: Uuid,
    /// The assertion that made it.
    pub assertion_id: Uuid,
    /// The revision that held (a tombstone: the source did not exist).
    pub revision_id: Uuid,
    /// When it held.
    pub valid: Period,
    /// When cairn started to believe it.
    pub recorded_from: Micros,
    /// When cairn stopped believing it ([`OPEN`]: it still does).
    pub recorded_to: Micros,
}

impl Rectangle {
    /// Whether it is what cairn believed at `as_of` about `valid_at`.
    pub fn covers(&self, valid_at: Micros, as_of: Micros) -> bool {
        self.valid.contains(valid_at) && self.recorded_from <= as_of && as_of < self.recorded_to
    }
}

/// One assertion, as the ledger records it (append-only).
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assertion {
    /// Its id.
    pub id: Uuid,
    /// Its place among the source's assertions (1, 2, ...).
    pub seq: i64,
    /// The revision asserted.
    pub revision_id: Uuid,
    /// The period it asserts.
    pub valid: Period,
    /// When cairn recorded it.
    pub recorded_at: Micros,
    /// Who asked.
    pub actor: String,
    /// Why (`accepted`, `reverted_to_earlier_revision`, `deleted`, ...).
    pub cause: String,
}

/// A source's validity as the ledger holds it: every assertion in ledger order and every
/// rectangle, believed or not.
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// The assertions, in the source's own order.
    pub assertions: Vec<Assertion>,
    /// The rectangles, by record start then valid start.
    pub rectangles: Vec<Rectangle>,
    /// Which of the revisions named are tombstones (the source did not exist there).
    pub tombstones: Vec<Uuid>,
}

/// A point in both times: what held at `valid_at` as the ledger believed at `as_of`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct At {
    /// Valid time.
    pub valid_at: Micros,
    /// Record time.
    pub as_of: Micros,
}

impl Timeline {
    /// A timeline from an engine's rows: the assertions in ledger order, and each rectangle
    /// with whether its revision is a tombstone.
    pub(crate) fn assemble(
        assertions: Vec<Assertion>,
        rectangles: impl IntoIterator<Item = (Rectangle, bool)>,
    ) -> Timeline {
        let mut timeline = Timeline {
            assertions,
            ..Timeline::default()
        };
        for (rectangle, tombstone) in rectangles {
            if tombstone && !timeline.tombstones.contains(&rectangle.revision_id) {
                timeline.tombstones.push(rectangle.revision_id);
            }
            timeline.rectangles.push(rectangle);
        }
        timeline
    }
}

/// What held at an instant as cairn knew it at another: the rectangle, and whether its
/// revision is a tombstone.
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// The rectangle that answers.
    pub rectangle: Rectangle,
    /// Whether the source was deleted there.
    pub tombstone: bool,
}

/// Where a temporal answer's history is incomplete ([`crate::Reader::history_gaps`]): some
/// revision that held at the point searched cannot be returned from an index. Gaps come from
/// revisions superseded before they were projected, revisions that hold only in the past
/// (the policy projects only what holds now or later), generations built from the heads of
/// their time, and revisions superseded before the ledger kept past passages (schema 16).
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryGaps {
    /// A revision that held has no vectors in the generation searched.
    pub vector: bool,
    /// A revision that held has no passages, current or past.
    pub lexical: bool,
}

/// What applying one assertion changes: the believed rectangles to close at `recorded_at`,
/// and the rectangles to believe from then on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// The ids of the believed rectangles it closes.
    pub close: Vec<Uuid>,
    /// The rectangles it adds: the remaining parts of the closed ones, then its own.
    pub insert: Vec<Rectangle>,
}

/// The record time of a source's next assertion: the ledger's clock, or one microsecond after
/// the source's last assertion when the clock has not moved past it.
pub fn record_time(now: Micros, last: Option<Micros>) -> Micros {
    match last {
        Some(last) if last >= now => last + 1,
        _ => now,
    }
}

/// Applies the assertion `assertion_id` of `revision_id` over `period` at `recorded_at` to the
/// source's currently believed rectangles (`believed`: those with an open record end).
pub fn apply(
    believed: &[Rectangle],
    assertion_id: Uuid,
    revision_id: Uuid,
    period: Period,
    recorded_at: Micros,
) -> Applied {
    let mut applied = Applied::default();
    for old in believed.iter().filter(|old| old.valid.overlaps(&period)) {
        applied.close.push(old.id);
        let pieces = [
            Period {
                from: old.valid.from,
                to: period.from,
            },
            Period {
                from: period.to,
                to: old.valid.to,
            },
        ];
        for piece in pieces {
            let piece = Period {
                from: piece.from.max(old.valid.from),
                to: piece.to.min(old.valid.to),
            };
            if piece.from < piece.to {
                applied.insert.push(Rectangle {
                    id: crate::ids::new_v7(),
                    assertion_id: old.assertion_id,
                    revision_id: old.revision_id,
                    valid: piece,
                    recorded_from: recorded_at,
                    recorded_to: OPEN,
                });
            }
        }
    }
    applied.insert.push(Rectangle {
        id: crate::ids::new_v7(),
        assertion_id,
        revision_id,
        valid: period,
        recorded_from: recorded_at,
        recorded_to: OPEN,
    });
    applied
}

/// The rectangle that says what held at `valid_at` as cairn knew it at `as_of`, if any.
pub fn held(rectangles: &[Rectangle], valid_at: Micros, as_of: Micros) -> Option<&Rectangle> {
    rectangles
        .iter()
        .find(|rectangle| rectangle.covers(valid_at, as_of))
}

/// An instant from the wire: integer epoch microseconds, or an RFC 3339 string with an offset
/// (`2026-03-01T00:00:00Z`, `2026-03-01T09:30:00.5+02:00`). `field` names it in the refusal.
pub fn parse_instant(field: &str, value: &serde_json::Value) -> Result<Micros> {
    let refused = |why: &str| {
        LedgerError::invalid(
            "invalid_instant",
            format!(
                "{field}: {why}; give epoch microseconds or RFC 3339 with an offset \
                 (2026-03-01T00:00:00Z)"
            ),
        )
    };
    let micros = match value {
        serde_json::Value::Number(number) => number
            .as_i64()
            .ok_or_else(|| refused("not an integer number of microseconds"))?,
        serde_json::Value::String(text) => parse_rfc3339(text).map_err(|why| refused(&why))?,
        _ => return Err(refused("not a number or a string")),
    };
    if !(0..OPEN).contains(&micros) {
        return Err(refused(
            "out of range (from 1970 to 2255; an open end is written by leaving it out)",
        ));
    }
    Ok(micros)
}

/// An optional instant from the wire: absent or `null` is none, anything else must be one
/// ([`parse_instant`]).
pub fn optional_instant(field: &str, value: Option<&serde_json::Value>) -> Result<Option<Micros>> {
    value
        .filter(|value| !value.is_null())
        .map(|value| parse_instant(field, value))
        .transpose()
}

/// The point in both times a request names with `valid_at` and `as_of` (wire instants, null
/// or absent when not given), if any: `valid_at` alone is as known `now`; `as_of` alone is
/// about itself (what the ledger believed then, about then).
pub fn point_in_time(
    valid_at: Option<&serde_json::Value>,
    as_of: Option<&serde_json::Value>,
    now: Micros,
) -> Result<Option<At>> {
    let valid_at = optional_instant("valid_at", valid_at)?;
    let as_of = optional_instant("as_of", as_of)?;
    Ok(match (valid_at, as_of) {
        (None, None) => None,
        (valid_at, as_of) => {
            let as_of = as_of.unwrap_or(now);
            Some(At {
                valid_at: valid_at.unwrap_or(as_of),
                as_of,
            })
        }
    })
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` to epoch microseconds.
fn parse_rfc3339(text: &str) -> std::result::Result<Micros, String> {
    let bytes = text.as_bytes();
    if bytes.len() == 10 {
        return Err(format!(
            "{text:?} is a bare date; say which instant of it, with an offset"
        ));
    }
    let digits = |range: std::ops::Range<usize>| -> std::result::Result<i64, String> {
        let part = text
            .get(range)
            .filter(|part| !part.is_empty() && part.bytes().all(|byte| byte.is_ascii_digit()))
            .ok_or_else(|| format!("{text:?} is not RFC 3339"))?;
        part.parse::<i64>()
            .map_err(|_| format!("{text:?} is not RFC 3339"))
    };
    let separator =
        |index: usize, allowed: &[u8]| bytes.get(index).is_some_and(|byte| allowed.contains(byte));
    if bytes.len() < 19
        || !separator(4, b"-")
        || !separator(7, b"-")
        || !separator(10, b"Tt ")
        || !separator(13, b":")
        || !separator(16, b":")
    {
        return Err(format!("{text:?} is not RFC 3339"));
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    let mut index = 19;
    let mut fraction = 0_i64;
    if separator(index, b".") {
        let start = index + 1;
        let mut end = start;
        while bytes.get(end).is_some_and(u8::is_ascii_digit) {
            end += 1;
        }
        if end == start {
            return Err(format!("{text:?} has an empty fraction of a second"));
        }
        // Microseconds: the first six digits, the rest truncated.
        let kept = &text[start..end.min(start + 6)];
        fraction = kept
            .parse::<i64>()
            .map_err(|_| format!("{text:?} is not RFC 3339"))?
            * 10_i64.pow(u32::try_from(6 - kept.len()).unwrap_or(0));
        index = end;
    }
    let offset_seconds = match bytes.get(index) {
        Some(b'Z' | b'z') if bytes.len() == index + 1 => 0,
        Some(sign @ (b'+' | b'-')) if bytes.len() == index + 6 && separator(index + 3, b":") => {
            let hours = digits(index + 1..index + 3)?;
            let minutes = digits(index + 4..index + 6)?;
            if hours > 23 || minutes > 59 {
                return Err(format!("{text:?} has an offset out of range"));
            }
            let seconds = hours * 3600 + minutes * 60;
            if *sign == b'-' {
                -seconds
            } else {
                seconds
            }
        }
        None => {
            return Err(format!(
                "{text:?} has no offset; add Z for UTC or the local offset (+02:00)"
            ))
        }
        Some(_) => return Err(format!("{text:?} is not RFC 3339")),
    };
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        _ => return Err(format!("{text:?} has no month {month}")),
    };
    if day < 1 || day > days_in_month || hour > 23 || minute > 59 || second > 60 {
        return Err(format!("{text:?} is not a valid date and time"));
    }
    // A leap second is read as the next second's start.
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_seconds;
    Ok(seconds * 1_000_000 + fraction)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// An instant as RFC 3339 in UTC with microseconds (`1970-01-01T00:00:00.000000Z`); [`OPEN`]
/// is written `open`.
pub fn format_instant(micros: Micros) -> String {
    if micros == OPEN {
        return "open".to_owned();
    }
    let seconds = micros.div_euclid(1_000_000);
    let fraction = micros.rem_euclid(1_000_000);
    let days = seconds.div_euclid(86_400);
    let of_day = seconds.rem_euclid(86_400);
    // Days to a civil date (H. Hinnant's algorithm, proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{fraction:06}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn instant(text: &str) -> Micros {
        parse_instant("t", &serde_json::json!(text)).expect("a valid instant")
    }

    #[test]
    fn instants_parse_with_offsets_and_round_trip() {
        assert_eq!(instant("1970-01-01T00:00:00Z"), 0);
        assert_eq!(instant("1970-01-01T01:00:00+01:00"), 0);
        assert_eq!(instant("1969-12-31T23:00:00-01:00"), 0);
        assert_eq!(
            instant("2026-03-01T00:00:00.5Z"),
            instant("2026-03-01T00:00:00Z") + 500_000
        );
        assert_eq!(
            format_instant(instant("2024-02-29T12:34:56.123456Z")),
            "2024-02-29T12:34:56.123456Z"
        );
        assert_eq!(
            parse_instant("t", &serde_json::json!(1_700_000_000_000_000_i64)).ok(),
            Some(1_700_000_000_000_000)
        );
    }

    #[test]
    fn instants_without_an_offset_or_time_are_refused() {
        for bad in [
            "2026-03-01",
            "2026-03-01T00:00:00",
            "2026-02-30T00:00:00Z",
            "2026-03-01T24:00:00Z",
            "2026-03-01T00:00:00.Z",
            "2026-03-01T00:00:00+2:00",
            "yesterday",
            "",
        ] {
            let error = parse_instant("valid_from", &serde_json::json!(bad))
                .expect_err(&format!("{bad:?} must be refused"));
            assert_eq!(error.code(), "invalid_instant", "{bad:?}");
        }
        for bad in [
            serde_json::json!(-1),
            serde_json::json!(OPEN),
            serde_json::json!(1.5),
        ] {
            assert!(parse_instant("valid_to", &bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn empty_periods_are_refused() {
        let validity = Validity {
            valid_from: Some(10),
            valid_to: Some(10),
        };
        assert_eq!(
            validity.period(5).expect_err("empty").code(),
            "empty_validity"
        );
        assert_eq!(
            Validity::default().period(7).ok(),
            Some(Period { from: 7, to: OPEN })
        );
    }

    /// The model the rectangles must agree with: replay every assertion recorded by `as_of`
    /// in ledger order; the last one whose period holds `valid_at` wins.
    fn replay(
        assertions: &[(Uuid, Period, Micros)],
        valid_at: Micros,
        as_of: Micros,
    ) -> Option<Uuid> {
        assertions
            .iter()
            .rfind(|(_, period, recorded)| *recorded <= as_of && period.contains(valid_at))
            .map(|(revision, _, _)| *revision)
    }

    proptest! {
        #[test]
        fn rectangles_agree_with_replaying_assertions(
            steps in proptest::collection::vec((0_u8..4, 0_i64..40, 0_i64..40, any::<bool>(), 0_i64..3), 1..25),
            probes in proptest::collection::vec((0_i64..60, 0_i64..80), 1..40),
        ) {
            let revisions: Vec<Uuid> = (0..4).map(|_| crate::ids::new_v7()).collect();
            let mut rectangles: Vec<Rectangle> = Vec::new();
            let mut assertions = Vec::new();
            let mut last = None;
            for (revision, from, length, bounded, advance) in steps {
                let now = last.map_or(0, |last: Micros| last + advance);
                let recorded_at = record_time(now, last);
                prop_assert!(last.is_none_or(|last| recorded_at > last));
                last = Some(recorded_at);
                let period = Period { from, to: if bounded { from + length + 1 } else { OPEN } };
                let believed: Vec<Rectangle> = rectangles.iter().filter(|r| r.recorded_to == OPEN).cloned().collect();
                let applied = apply(&believed, crate::ids::new_v7(), revisions[usize::from(revision)], period, recorded_at);
                for rectangle in rectangles.iter_mut().filter(|r| applied.close.contains(&r.id)) {
                    rectangle.recorded_to = recorded_at;
                }
                rectangles.extend(applied.insert);
                assertions.push((revisions[usize::from(revision)], period, recorded_at));
                // Believed rectangles stay disjoint, and none is empty.
                let believed: Vec<&Rectangle> = rectangles.iter().filter(|r| r.recorded_to == OPEN).collect();
                for (index, a) in believed.iter().enumerate() {
                    prop_assert!(a.valid.from < a.valid.to);
                    for b in &believed[index + 1..] {
                        prop_assert!(!a.valid.overlaps(&b.valid));
                    }
                }
            }
            for (valid_at, as_of) in probes {
                let expected = replay(&assertions, valid_at, as_of);
                let found = held(&rectangles, valid_at, as_of).map(|r| r.revision_id);
                prop_assert_eq!(found, expected, "valid_at {} as_of {}", valid_at, as_of);
                prop_assert!(rectangles.iter().filter(|r| r.covers(valid_at, as_of)).count() <= 1);
            }
        }
    }
}

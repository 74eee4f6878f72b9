//! Conformance: validity time. Every acceptance that writes is an assertion over a period; the
//! ledger keeps the assertions and the rectangles derived from them, and answers what held at
//! T as known at R the same way on every engine, equal to replaying the assertions.

use super::{must, put, Harness, START};
use receipts::model::{Change, Submission};
use receipts::validity::{Validity, OPEN};
use receipts::Micros;
use uuid::Uuid;

const DAY: Micros = 86_400_000_000;

/// The revision that held at `valid_at` as known at `as_of`, `None` when nothing did (a
/// tombstone counts as nothing).
async fn held(harness: &Harness, key: &str, valid_at: Micros, as_of: Micros) -> Option<Uuid> {
    must(
        harness.ledger.held_at("law", key, valid_at, as_of).await,
        "held_at",
    )
    .filter(|held| !held.tombstone)
    .map(|held| held.rectangle.revision_id)
}

async fn accept_at(
    harness: &Harness,
    at: Micros,
    submission: Submission,
) -> receipts::Result<Uuid> {
    harness.clock.set(at);
    let mut results = harness.ledger.accept(vec![submission]).await;
    results
        .pop()
        .unwrap_or_else(|| Err(receipts::LedgerError::Unavailable("no result".to_owned())))
        .map(|acceptance| acceptance.source_revision_id)
}

/// Erases `law/key` at the clock's time.
async fn erase(harness: &Harness, key: &str) {
    must(
        harness
            .ledger
            .erase(receipts::model::ErasureRequest {
                dataset: "law".to_owned(),
                source_key: key.to_owned(),
                actor: "test:conformance".to_owned(),
                reason: format!("erase {key}"),
            })
            .await,
        "erase",
    );
}

fn from(at: Micros) -> Validity {
    Validity {
        valid_from: Some(at),
        valid_to: None,
    }
}

/// The case: J1 accepted in January with no period, J2 accepted on 2 April valid from
/// 1 March. Now J2 holds from March and J1 before; as known on 20 or 25 March, J1 held.
pub async fn validity_answers_what_held_and_what_was_known(harness: Harness) {
    let jan_10 = START + 9 * DAY;
    let feb_15 = START + 45 * DAY;
    let mar_1 = START + 59 * DAY;
    let mar_20 = START + 78 * DAY;
    let mar_25 = START + 83 * DAY;
    let apr_2 = START + 91 * DAY;
    let j1 = must(
        accept_at(&harness, jan_10, put("law", "ruling", "J1: the rule holds")).await,
        "J1",
    );
    let j2 = must(
        accept_at(
            &harness,
            apr_2,
            put("law", "ruling", "J2: the rule changed").valid(from(mar_1)),
        )
        .await,
        "J2",
    );
    let now = apr_2 + DAY;
    harness.clock.set(now);
    assert_eq!(held(&harness, "ruling", now, now).await, Some(j2), "now");
    assert_eq!(
        held(&harness, "ruling", feb_15, now).await,
        Some(j1),
        "15 February"
    );
    assert_eq!(
        held(&harness, "ruling", mar_20, now).await,
        Some(j2),
        "20 March"
    );
    assert_eq!(
        held(&harness, "ruling", mar_20, mar_20).await,
        Some(j1),
        "as of 20 March"
    );
    assert_eq!(
        held(&harness, "ruling", mar_20, mar_25).await,
        Some(j1),
        "20 March as of 25 March"
    );
    assert_eq!(
        held(&harness, "ruling", jan_10 - 1, now).await,
        None,
        "before J1"
    );
    // The head is the effective revision.
    let source = must(harness.ledger.source("law", "ruling").await, "source").expect("exists");
    assert_eq!(source.head.id, j2);
    let timeline = must(harness.ledger.timeline("law", "ruling").await, "timeline");
    let asserted: Vec<(Uuid, Micros, Micros, Micros)> = timeline
        .assertions
        .iter()
        .map(|a| (a.revision_id, a.valid.from, a.valid.to, a.recorded_at))
        .collect();
    assert_eq!(
        asserted,
        vec![(j1, jan_10, OPEN, jan_10), (j2, mar_1, OPEN, apr_2)]
    );
    // J1 [Jan 10, open) believed until 2 April, then [Jan 10, Mar 1); J2 [Mar 1, open).
    let believed: Vec<(Uuid, Micros, Micros)> = timeline
        .rectangles
        .iter()
        .filter(|r| r.recorded_to == OPEN)
        .map(|r| (r.revision_id, r.valid.from, r.valid.to))
        .collect();
    assert_eq!(believed, vec![(j1, jan_10, mar_1), (j2, mar_1, OPEN)]);
    // Lexical search at a point in time finds the revision held then, from the past
    // passages when it is no longer head; today's search finds the head only.
    let lexical_at = |valid_at: Micros, as_of: Micros| {
        let ledger = harness.ledger.clone();
        async move {
            let at = receipts::validity::At { valid_at, as_of };
            must(
                ledger
                    .lexical_search_at("rule", &["law".to_owned()], 10, None, at)
                    .await,
                "lexical_search_at",
            )
            .into_iter()
            .map(|hit| hit.revision_id)
            .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        lexical_at(feb_15, now).await,
        vec![j1],
        "lexical, 15 February"
    );
    assert_eq!(lexical_at(mar_20, now).await, vec![j2], "lexical, 20 March");
    assert_eq!(
        lexical_at(mar_20, mar_25).await,
        vec![j1],
        "lexical, 20 March as of 25 March"
    );
    assert_eq!(
        lexical_at(jan_10 - 1, now).await,
        Vec::<Uuid>::new(),
        "lexical, before J1"
    );
    let today = must(
        harness.ledger.lexical_search("rule", &[], 10, None).await,
        "lexical",
    );
    assert_eq!(
        today.iter().map(|hit| hit.revision_id).collect::<Vec<_>>(),
        vec![j2]
    );
    // Binding at a point in time: held then, not head now.
    let refs = [j1, j2].map(|revision_id| receipts::HitRef {
        revision_id,
        chunk_index: None,
    });
    let at = receipts::validity::At {
        valid_at: feb_15,
        as_of: now,
    };
    let bound = must(
        harness.ledger.bind_hits_at(&refs, "g", at).await,
        "bind_hits_at",
    );
    let current: Vec<(Uuid, bool)> = bound
        .iter()
        .map(|b| (b.hit.revision_id, b.current))
        .collect();
    assert_eq!(current, vec![(j1, true), (j2, false)]);
    let bound = must(harness.ledger.bind_hits(&refs, "g").await, "bind_hits");
    let current: Vec<(Uuid, bool)> = bound
        .iter()
        .map(|b| (b.hit.revision_id, b.current))
        .collect();
    assert_eq!(current, vec![(j1, false), (j2, true)]);
    // The period each revision holds over, at the point asked: J1 from 10 January to 1 March
    // on 15 February; J2 did not hold then; now J2 from 1 March on.
    let periods = must(harness.ledger.periods(&[j1, j2], at).await, "periods");
    assert_eq!(
        periods,
        vec![(
            j1,
            receipts::validity::Period {
                from: jan_10,
                to: mar_1
            }
        )]
    );
    let today = receipts::validity::At {
        valid_at: now,
        as_of: now,
    };
    let periods = must(harness.ledger.periods(&[j1, j2], today).await, "periods");
    assert_eq!(
        periods,
        vec![(
            j2,
            receipts::validity::Period {
                from: mar_1,
                to: OPEN
            }
        )]
    );
    let current: Vec<(Uuid, bool)> = bound
        .iter()
        .map(|b| (b.hit.revision_id, b.current))
        .collect();
    assert_eq!(current, vec![(j1, false), (j2, true)]);
    // The store recorded each assertion in the source's history.
    let history = must(
        harness.ledger.history("source", "law/ruling").await,
        "history",
    );
    let asserted = history
        .iter()
        .filter(|entry| entry.event == "asserted")
        .count();
    assert_eq!(asserted, 2, "{history:?}");
}

/// Periods acceptance refuses, with typed errors and nothing written.
pub async fn validity_refusals_are_typed_and_write_nothing(harness: Harness) {
    let at = START + DAY;
    must(
        accept_at(&harness, at, put("law", "a", "first")).await,
        "first",
    );
    let before = must(harness.ledger.counts().await, "counts");
    // A source's first revision must hold now: one valid only from tomorrow is refused.
    let error = accept_at(
        &harness,
        at + 5,
        put("law", "fresh", "later").valid(from(at + DAY)),
    )
    .await
    .expect_err("a first revision valid from tomorrow");
    assert_eq!(error.code(), "validity_in_future", "{error}");
    // A bounded period with nothing to hold after it.
    let error = accept_at(
        &harness,
        at + 6,
        put("law", "gap", "for a while").valid(Validity {
            valid_from: Some(at - DAY),
            valid_to: Some(at + DAY),
        }),
    )
    .await
    .expect_err("nothing after it");
    assert_eq!(error.code(), "validity_gap", "{error}");
    let cases = [
        (
            Validity {
                valid_from: Some(at - DAY),
                valid_to: Some(at - DAY),
            },
            "empty_validity",
        ),
        (
            Validity {
                valid_from: None,
                valid_to: Some(at - DAY),
            },
            "empty_validity",
        ),
    ];
    for (validity, code) in cases {
        let error = accept_at(&harness, at + 10, put("law", "a", "second").valid(validity))
            .await
            .expect_err(code);
        assert_eq!(error.code(), code, "{validity:?}: {error}");
    }
    let after = must(harness.ledger.counts().await, "counts");
    assert_eq!(before.revisions, after.revisions);
    let timeline = must(harness.ledger.timeline("law", "a").await, "timeline");
    assert_eq!(timeline.assertions.len(), 1);
}

/// What one source was told, in ledger order: (revision or `None` for a tombstone, valid
/// period, record time).
type Said = (Option<Uuid>, receipts::validity::Period, Micros);

/// Runs every job due at `at` as a worker would start it (crossing its boundary first), and
/// completes it; answers the jobs that went on. A job whose revision no longer holds is
/// superseded by its crossing; one claimed beside a crossing that moved its source's head, by
/// that crossing.
async fn run_due(harness: &Harness, at: Micros) -> Vec<receipts::model::Job> {
    harness.clock.set(at);
    let mut went_on = Vec::new();
    loop {
        let claimed = must(harness.ledger.claim("test:conformance", 100).await, "claim");
        if claimed.is_empty() {
            return went_on;
        }
        for job in claimed {
            let token = receipts::LeaseToken::of(&job).expect("a claimed job is leased");
            match harness.ledger.cross_boundary(&token).await {
                Ok(true) => {}
                Ok(false) | Err(receipts::LedgerError::LeaseLost { .. }) => continue,
                Err(error) => panic!("cross: {error}"),
            }
            match harness.ledger.complete(&token).await {
                Ok(_) => went_on.push(job),
                Err(receipts::LedgerError::LeaseLost { .. }) => {}
                Err(error) => panic!("complete: {error}"),
            }
        }
    }
}

/// Runs every job due at `at` ([`run_due`]), then checks that each source's head is the
/// revision the model says holds at `at` (a tombstone when nothing does).
async fn settle(harness: &Harness, at: Micros, keys: &[&str], model: &[Vec<Said>]) {
    run_due(harness, at).await;
    for (source, key) in keys.iter().enumerate() {
        let Some(view) = must(harness.ledger.source("law", key).await, "source") else {
            continue;
        };
        let expected = model[source]
            .iter()
            .rev()
            .find(|(_, valid, _)| valid.contains(at))
            .and_then(|(revision, _, _)| *revision);
        assert_eq!(
            (!view.head.tombstone).then_some(view.head.id),
            expected,
            "{key}: the head at {at}, every due boundary crossed"
        );
    }
}

/// A small deterministic generator (xorshift), so that a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound.max(1)
    }
}

/// Random sequences of puts, backdated corrections, reverts, reassertions of the head and
/// deletions on three sources: for random (T, R) the ledger's answer equals replaying the
/// assertions in ledger order (the last one recorded by R whose period holds T wins), and
/// record time increases strictly per source. Then an erasure: nothing of the erased
/// revisions is found at any T or R.
pub async fn validity_follows_replayed_assertions(harness: Harness) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let keys = ["a", "b", "c"];
    let mut model: Vec<Vec<Said>> = vec![Vec::new(); keys.len()];
    let mut texts: Vec<Vec<String>> = vec![Vec::new(); keys.len()];
    let mut now = START;
    let mut scheduled = 0;
    let mut bounded = 0;
    for step in 0..120 {
        // Some steps share the clock's microsecond: the ledger then records one later.
        let step_by = match rng.below(3) {
            0 => 0,
            1 => 1 + rng.below(1_000) as i64,
            _ => (1 + rng.below(3) as i64) * DAY,
        };
        now += step_by;
        // Now and then, a day or more on (past every record time bumped beyond the clock),
        // the workers catch up: every due job crosses its boundary.
        if step_by >= DAY {
            settle(&harness, now, &keys, &model).await;
        }
        let source = rng.below(keys.len() as u64) as usize;
        let key = keys[source];
        let previous_head = must(harness.ledger.source("law", key).await, "source")
            .map(|view| (view.head.id, view.head.tombstone));
        // Backdated, or (once the source has a head) scheduled up to two days ahead.
        let backdate = match rng.below(4) {
            0 => None,
            1 if previous_head.is_some() => Some(now + 1 + rng.below(2 * DAY as u64) as i64),
            _ => Some(START + rng.below(((now - START) / 1_000).max(1) as u64) as i64 * 1_000),
        };
        // Some periods end, up to three days after they start.
        let until = match rng.below(3) {
            0 => Some(backdate.unwrap_or(now) + 1 + rng.below(3 * DAY as u64) as i64),
            _ => None,
        };
        let validity = Validity {
            valid_from: backdate,
            valid_to: until,
        };
        let (submission, tombstone) = match rng.below(10) {
            0 | 1 if !texts[source].is_empty() => (
                Submission {
                    change: Change::Delete { reason: None },
                    ..put("law", key, "unused")
                },
                true,
            ),
            2 | 3 if !texts[source].is_empty() => {
                // A revert to an earlier text (or a reassertion of the head).
                let earlier = texts[source][rng.below(texts[source].len() as u64) as usize].clone();
                (put("law", key, &earlier), false)
            }
            _ => {
                let text = format!("{key} text {step}");
                texts[source].push(text.clone());
                (put("law", key, &text), false)
            }
        };
        let last = model[source].last().map(|(_, _, recorded)| *recorded);
        let result = accept_at(&harness, now, submission.valid(validity)).await;
        let revision = match result {
            Ok(revision) => revision,
            Err(error)
                if matches!(
                    error.code(),
                    "source_not_found" | "validity_gap" | "validity_in_future" | "empty_validity"
                ) =>
            {
                continue
            }
            Err(error) => panic!("step {step}: {error}"),
        };
        // What the ledger recorded: an assertion, unless nothing changed (a duplicate).
        let timeline = must(harness.ledger.timeline("law", key).await, "timeline");
        let recorded = timeline.assertions.len() > model[source].len();
        // A duplicate is of the head, or of a revision scheduled with the same period.
        let duplicate = previous_head.map(|(id, _)| id) == Some(revision)
            || model[source]
                .iter()
                .any(|(known, _, _)| *known == Some(revision));
        if !recorded {
            assert!(duplicate, "step {step}: a write without an assertion");
            continue;
        }
        let assertion = timeline.assertions.last().expect("recorded");
        let expected_at = match last {
            Some(last) if last >= now => last + 1,
            _ => now,
        };
        assert_eq!(
            assertion.recorded_at, expected_at,
            "step {step}: record time"
        );
        assert_eq!(assertion.revision_id, revision, "step {step}");
        assert_eq!(
            assertion.seq as usize,
            model[source].len() + 1,
            "step {step}"
        );
        assert_eq!(
            assertion.valid.from,
            backdate.unwrap_or(expected_at),
            "step {step}"
        );
        assert_eq!(assertion.valid.to, until.unwrap_or(OPEN), "step {step}");
        scheduled += usize::from(assertion.valid.from > assertion.recorded_at);
        bounded += usize::from(until.is_some());
        model[source].push((
            (!tombstone).then_some(revision),
            assertion.valid,
            assertion.recorded_at,
        ));
    }
    assert!(scheduled > 0, "the sequence scheduled nothing");
    assert!(bounded > 0, "the sequence bounded nothing");
    // Every boundary has come by `end`: once the due jobs have crossed theirs, each head is
    // the revision the ledger believes holds then.
    let end = now + 10 * DAY;
    settle(&harness, end, &keys, &model).await;
    for (source, key) in keys.iter().enumerate() {
        for _ in 0..40 {
            let valid_at = START + rng.below(((end - START) / 1_000) as u64) as i64 * 1_000;
            let as_of = START + rng.below(((end - START) / 1_000) as u64) as i64 * 1_000;
            let expected = model[source]
                .iter()
                .rev()
                .find(|(_, valid, recorded)| *recorded <= as_of && valid.contains(valid_at))
                .and_then(|(revision, _, _)| *revision);
            assert_eq!(
                held(&harness, key, valid_at, as_of).await,
                expected,
                "{key} at {valid_at} as of {as_of}"
            );
        }
    }
    // Search at random (T, R), as the searcher asks the ledger: the lexical index finds a
    // source exactly when a revision held then (every text says "text"), and only that
    // revision; binding calls a revision current exactly when it is the one that held.
    let every: Vec<(usize, Uuid)> = model
        .iter()
        .enumerate()
        .flat_map(|(source, said)| {
            said.iter()
                .filter_map(move |(revision, _, _)| revision.map(|id| (source, id)))
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let refs: Vec<receipts::model::HitRef> = every
        .iter()
        .map(|(_, revision_id)| receipts::model::HitRef {
            revision_id: *revision_id,
            chunk_index: None,
        })
        .collect();
    for _ in 0..40 {
        let valid_at = START + rng.below(((end - START) / 1_000) as u64) as i64 * 1_000;
        let as_of = START + rng.below(((end - START) / 1_000) as u64) as i64 * 1_000;
        let at = receipts::validity::At { valid_at, as_of };
        let expected: Vec<Option<Uuid>> = model
            .iter()
            .map(|said| {
                said.iter()
                    .rev()
                    .find(|(_, valid, recorded)| *recorded <= as_of && valid.contains(valid_at))
                    .and_then(|(revision, _, _)| *revision)
            })
            .collect();
        let hits = must(
            harness
                .ledger
                .lexical_search_at("text", &["law".to_owned()], 1000, None, at)
                .await,
            "lexical at",
        );
        let mut found = std::collections::BTreeSet::new();
        for hit in &hits {
            let source = keys
                .iter()
                .position(|key| *key == hit.source_key)
                .expect("a known source");
            assert_eq!(
                Some(hit.revision_id),
                expected[source],
                "{} at {valid_at} as of {as_of}: a hit outside the rectangle",
                hit.source_key
            );
            found.insert(source);
        }
        let held: std::collections::BTreeSet<usize> = expected
            .iter()
            .enumerate()
            .filter_map(|(source, revision)| revision.map(|_| source))
            .collect();
        assert_eq!(found, held, "sources found at {valid_at} as of {as_of}");
        let bound = must(
            harness.ledger.bind_hits_at(&refs, "conformance", at).await,
            "bind at",
        );
        assert_eq!(bound.len(), refs.len());
        for (hit, (source, revision)) in bound.iter().zip(&every) {
            assert_eq!(
                hit.current,
                expected[*source] == Some(*revision),
                "{revision} bound at {valid_at} as of {as_of}"
            );
        }
    }
    // Erasure: no query at any T or R finds an erased revision.
    let erased: Vec<Uuid> = model[0]
        .iter()
        .filter_map(|(revision, _, _)| *revision)
        .collect();
    harness.clock.set(end + DAY);
    erase(&harness, "a").await;
    let timeline = must(harness.ledger.timeline("law", "a").await, "timeline");
    assert!(
        timeline
            .assertions
            .iter()
            .all(|assertion| !erased.contains(&assertion.revision_id)),
        "an erased revision's assertion is left"
    );
    for _ in 0..40 {
        let valid_at = START + rng.below(((end + 2 * DAY - START) / 1_000) as u64) as i64 * 1_000;
        let as_of = START + rng.below(((end + 2 * DAY - START) / 1_000) as u64) as i64 * 1_000;
        let found = held(&harness, "a", valid_at, as_of).await;
        assert!(
            found.is_none(),
            "erased source found at {valid_at} as of {as_of}: {found:?}"
        );
        let at = receipts::validity::At { valid_at, as_of };
        let hits = must(
            harness
                .ledger
                .lexical_search_at("text", &[], 100, None, at)
                .await,
            "lexical_search_at",
        );
        assert!(
            hits.iter().all(|hit| hit.source_key != "a"),
            "an erased revision's passage at {valid_at} as of {as_of}"
        );
    }
    // Every lexical answer at random points holds only revisions held then.
    for _ in 0..20 {
        let valid_at = START + rng.below(((end - START) / 1_000) as u64) as i64 * 1_000;
        let as_of = START + rng.below(((end - START) / 1_000) as u64) as i64 * 1_000;
        let at = receipts::validity::At { valid_at, as_of };
        for hit in must(
            harness
                .ledger
                .lexical_search_at("text", &[], 100, None, at)
                .await,
            "lexical_search_at",
        ) {
            let held = held(&harness, &hit.source_key, valid_at, as_of).await;
            assert_eq!(
                held,
                Some(hit.revision_id),
                "{} at {valid_at} as of {as_of}",
                hit.source_key
            );
        }
    }
}

/// A revision valid from a later instant is scheduled: it is stored and asserted, the head
/// stays, and its job waits for the boundary. Once the clock reaches it, the job that claims
/// it moves the head (cause `validity_boundary`) and the lexical index with it; until then the
/// default search does not return it, while a search at a later `valid_at` does. A deletion
/// can be scheduled the same way ("gone from X").
pub async fn scheduled_revisions_take_the_head_at_their_boundary(harness: Harness) {
    let at = START + DAY;
    let boundary = at + DAY;
    let j1 = must(
        accept_at(&harness, at, put("law", "s", "heron rules apply")).await,
        "J1",
    );
    harness.clock.set(at + 10);
    let receipt = harness
        .ledger
        .accept(vec![
            put("law", "s", "egret rules apply").valid(from(boundary))
        ])
        .await
        .pop()
        .expect("one result");
    let receipt = must(receipt, "J2");
    let j2 = receipt.source_revision_id;
    assert_ne!(j1, j2);
    let head = |view: Option<receipts::model::SourceView>| view.map(|view| view.head.id);
    assert_eq!(
        head(must(harness.ledger.source("law", "s").await, "source")),
        Some(j1),
        "the head stays until the boundary"
    );
    let job = must(harness.ledger.job(receipt.projection_job_id).await, "job")
        .expect("the receipt's job");
    assert_eq!(job.run_at, boundary, "the job waits for the boundary");
    assert_eq!(job.run_at_rule, "scheduled: its validity starts then");
    // Submitted again with the same period: the same receipt, nothing new.
    let again = harness
        .ledger
        .accept(vec![
            put("law", "s", "egret rules apply").valid(from(boundary))
        ])
        .await
        .pop()
        .expect("one result");
    let again = must(again, "J2 again");
    assert_eq!(again.status, receipts::model::AcceptStatus::Duplicate);
    assert_eq!(again.projection_job_id, receipt.projection_job_id);

    let lexical = |query: &'static str| {
        let ledger = harness.ledger.clone();
        async move {
            must(
                ledger
                    .lexical_search(query, &["law".to_owned()], 10, None)
                    .await,
                "lexical",
            )
            .into_iter()
            .map(|hit| hit.revision_id)
            .collect::<Vec<Uuid>>()
        }
    };
    assert_eq!(lexical("egret").await, Vec::<Uuid>::new(), "not before");
    assert_eq!(lexical("heron").await, vec![j1]);
    let later = receipts::validity::At {
        valid_at: boundary + 1,
        as_of: at + 20,
    };
    let ahead = must(
        harness
            .ledger
            .lexical_search_at("egret", &["law".to_owned()], 10, None, later)
            .await,
        "lexical at",
    );
    assert_eq!(
        ahead.iter().map(|hit| hit.revision_id).collect::<Vec<_>>(),
        vec![j2],
        "what will hold is found at its valid time"
    );

    // Before the boundary no claim takes the job.
    harness.clock.set(boundary - 1);
    let claimed = must(harness.ledger.claim("test:conformance", 10).await, "claim");
    assert!(claimed.iter().all(|job| job.revision_id != Some(j2)));
    for job in &claimed {
        let token = receipts::LeaseToken::of(job).expect("leased");
        must(harness.ledger.complete(&token).await, "complete J1");
    }
    harness.clock.set(boundary + 1);
    let claimed = must(harness.ledger.claim("test:conformance", 10).await, "claim");
    let job = claimed
        .iter()
        .find(|job| job.revision_id == Some(j2))
        .expect("the scheduled job is due");
    let token = receipts::LeaseToken::of(job).expect("leased");
    must(harness.ledger.cross_boundary(&token).await, "cross");
    // Crossing again changes nothing.
    must(harness.ledger.cross_boundary(&token).await, "cross again");
    assert_eq!(
        head(must(harness.ledger.source("law", "s").await, "source")),
        Some(j2),
        "the head moved at the boundary"
    );
    assert_eq!(lexical("egret").await, vec![j2]);
    assert_eq!(lexical("heron").await, Vec::<Uuid>::new());
    let history = must(harness.ledger.history("source", "law/s").await, "history");
    assert!(
        history
            .iter()
            .any(|entry| entry.cause == "validity_boundary"),
        "{history:?}"
    );
    must(harness.ledger.complete(&token).await, "complete J2");

    // Gone from a later instant: the deletion is scheduled too.
    let gone = boundary + DAY;
    harness.clock.set(boundary + 10);
    let deleted = harness
        .ledger
        .accept(vec![Submission {
            change: Change::Delete { reason: None },
            ..put("law", "s", "unused")
        }
        .valid(from(gone))])
        .await
        .pop()
        .expect("one result");
    let deleted = must(deleted, "delete");
    assert!(deleted.tombstone);
    assert_eq!(
        head(must(harness.ledger.source("law", "s").await, "source")),
        Some(j2)
    );
    harness.clock.set(gone + 1);
    let claimed = must(harness.ledger.claim("test:conformance", 10).await, "claim");
    let job = claimed
        .iter()
        .find(|job| job.id == deleted.projection_job_id)
        .expect("the deletion is due");
    let token = receipts::LeaseToken::of(job).expect("leased");
    must(harness.ledger.cross_boundary(&token).await, "cross");
    let view = must(harness.ledger.source("law", "s").await, "source").expect("source");
    assert!(view.head.tombstone, "gone from the boundary on");
    assert_eq!(lexical("egret").await, Vec::<Uuid>::new());
}

/// Bounded periods: a correction that held only in the past is history (the head stays, its
/// job is superseded at once, a search at its valid time finds it); one that holds now moves
/// the head and schedules the return of the revision before it at its end; one in the future
/// is scheduled at both ends. A scheduled job whose revision a later assertion overrode is
/// superseded when it comes due, and goes no further.
pub async fn bounded_periods_return_the_head_at_their_end(harness: Harness) {
    let at = START + 20 * DAY;
    let head = |harness: &Harness| {
        let ledger = harness.ledger.clone();
        async move {
            must(ledger.source("law", "b").await, "source")
                .map(|view| view.head.id)
                .expect("the source")
        }
    };
    let accept = |at: Micros, text: &'static str, from: Micros, to: Option<Micros>| {
        let harness = &harness;
        async move {
            harness.clock.set(at);
            let mut results = harness
                .ledger
                .accept(vec![put("law", "b", text).valid(Validity {
                    valid_from: Some(from),
                    valid_to: to,
                })])
                .await;
            must(results.pop().expect("one result"), text)
        }
    };
    let j1 = accept(at, "plover original text", at - 10 * DAY, None).await;
    run_due(&harness, at + 1).await;

    // History only: [at - 5d, at - 4d), accepted now.
    let correction = accept(
        at + 10,
        "avocet corrected text",
        at - 5 * DAY,
        Some(at - 4 * DAY),
    )
    .await;
    assert_eq!(head(&harness).await, j1.source_revision_id);
    let job = must(
        harness.ledger.job(correction.projection_job_id).await,
        "job",
    )
    .expect("job");
    assert_eq!(
        job.state,
        receipts::JobState::Superseded,
        "history is not projected"
    );
    assert_eq!(
        held(&harness, "b", at - 5 * DAY + 1, at + 11).await,
        Some(correction.source_revision_id)
    );
    assert_eq!(
        held(&harness, "b", at - 4 * DAY, at + 11).await,
        Some(j1.source_revision_id)
    );
    let found = must(
        harness
            .ledger
            .lexical_search_at(
                "avocet",
                &["law".to_owned()],
                10,
                None,
                receipts::validity::At {
                    valid_at: at - 5 * DAY + 1,
                    as_of: at + 11,
                },
            )
            .await,
        "lexical at",
    );
    assert_eq!(
        found.iter().map(|hit| hit.revision_id).collect::<Vec<_>>(),
        vec![correction.source_revision_id]
    );

    // Holding now, until tomorrow: the head moves now and returns to J1 at the end.
    let now_bounded = accept(at + 20, "stilt interim text", at - DAY, Some(at + DAY)).await;
    assert_eq!(head(&harness).await, now_bounded.source_revision_id);
    let went_on = run_due(&harness, at + 30).await;
    assert_eq!(
        went_on
            .iter()
            .map(|job| job.revision_id)
            .collect::<Vec<_>>(),
        vec![Some(now_bounded.source_revision_id)],
        "the return waits for the end"
    );
    let went_on = run_due(&harness, at + DAY).await;
    assert_eq!(
        went_on
            .iter()
            .map(|job| job.revision_id)
            .collect::<Vec<_>>(),
        vec![Some(j1.source_revision_id)],
        "J1 returns at the end"
    );
    assert_eq!(head(&harness).await, j1.source_revision_id);

    // In the future, for a day: scheduled at both ends.
    let later = accept(
        at + DAY + 10,
        "godwit later text",
        at + 2 * DAY,
        Some(at + 3 * DAY),
    )
    .await;
    assert_eq!(head(&harness).await, j1.source_revision_id);
    assert!(run_due(&harness, at + 2 * DAY - 1).await.is_empty());
    run_due(&harness, at + 2 * DAY).await;
    assert_eq!(head(&harness).await, later.source_revision_id);
    run_due(&harness, at + 3 * DAY).await;
    assert_eq!(head(&harness).await, j1.source_revision_id);

    // Scheduled, then overridden by the head asserted again over every time: the job that
    // comes due is superseded, and the head stays.
    let overridden = accept(
        at + 3 * DAY + 10,
        "curlew scheduled text",
        at + 5 * DAY,
        None,
    )
    .await;
    let again = accept(
        at + 3 * DAY + 20,
        "plover original text",
        at - 10 * DAY,
        None,
    )
    .await;
    assert_eq!(again.source_revision_id, j1.source_revision_id);
    assert!(run_due(&harness, at + 5 * DAY).await.is_empty());
    let job = must(
        harness.ledger.job(overridden.projection_job_id).await,
        "job",
    )
    .expect("job");
    assert_eq!(job.state, receipts::JobState::Superseded);
    assert_eq!(head(&harness).await, j1.source_revision_id);
}

/// The partial-history flag: the ledger records, as they arise, the revisions that held at
/// some time but have no vectors in a generation (superseded before projection, or holding
/// only in the past), and answers for a point in time whether one of them held then. A
/// projected revision, a head still waiting for projection and another dataset are no gaps;
/// an erasure takes its revisions' gaps with it.
pub async fn history_gaps_name_what_temporal_search_cannot_return(harness: Harness) {
    use receipts::validity::{At, HistoryGaps};
    let generation = super::activate_test_generation(&harness).await;
    let at = START + 30 * DAY;
    let law = ["law".to_owned()];
    let gaps = |valid_at: Micros, as_of: Micros, generation: Option<&str>| {
        let ledger = harness.ledger.clone();
        let generation = generation.map(str::to_owned);
        let law = law.clone();
        async move {
            must(
                ledger
                    .history_gaps(&law, generation.as_deref(), At { valid_at, as_of })
                    .await,
                "history gaps",
            )
        }
    };
    let searched = Some(generation.id.as_str());
    must(
        accept_at(&harness, at, put("law", "g", "kestrel first")).await,
        "J1",
    );
    harness.clock.set(at + 1);
    for job in must(harness.ledger.claim("test:conformance", 10).await, "claim") {
        let token = receipts::LeaseToken::of(&job).expect("leased");
        must(
            harness
                .ledger
                .write_chunks(&token, &generation.id, super::rows(&["kestrel first"]))
                .await,
            "chunks",
        );
        must(harness.ledger.complete(&token).await, "complete");
    }
    // J2 is superseded by J3 before anything projects it.
    must(
        accept_at(&harness, at + DAY, put("law", "g", "kestrel second")).await,
        "J2",
    );
    must(
        accept_at(&harness, at + 2 * DAY, put("law", "g", "kestrel third")).await,
        "J3",
    );
    let now = at + 3 * DAY;
    harness.clock.set(now);
    let complete = HistoryGaps::default();
    let vector_gap = HistoryGaps {
        vector: true,
        lexical: false,
    };
    assert_eq!(
        gaps(at + DAY + 5, now, searched).await,
        vector_gap,
        "J2's time"
    );
    assert_eq!(
        gaps(at + 5, now, searched).await,
        complete,
        "J1 was projected"
    );
    assert_eq!(
        gaps(at + 2 * DAY + 5, now, searched).await,
        complete,
        "J3 is the head, waiting for its projection"
    );
    assert_eq!(
        gaps(at + DAY + 5, at + DAY - 1, searched).await,
        complete,
        "as known before J2"
    );
    assert_eq!(
        gaps(at + DAY + 5, now, None).await,
        complete,
        "no vector search"
    );
    let other = must(
        harness
            .ledger
            .history_gaps(
                &["elsewhere".to_owned()],
                searched,
                At {
                    valid_at: at + DAY + 5,
                    as_of: now,
                },
            )
            .await,
        "history gaps",
    );
    assert_eq!(other, complete, "another dataset");
    // A generation built now holds the heads: every earlier revision is a gap in it.
    let rebuilt = super::test_generation("chunker-rebuilt");
    must(
        harness
            .ledger
            .change_generation(receipts::model::GenerationCommand {
                change: receipts::model::GenerationChange::Create {
                    generation: rebuilt.clone(),
                    priority: 0,
                },
                actor: "test:conformance".to_owned(),
                reason: "rebuild".to_owned(),
            })
            .await,
        "create",
    );
    assert_eq!(
        gaps(at + 5, now, Some(&rebuilt.id)).await,
        vector_gap,
        "J1, rebuilt"
    );
    assert_eq!(gaps(at + 5, now, searched).await, complete, "J1, first");

    // A correction that holds only in the past is not projected: a gap over its period.
    must(
        accept_at(
            &harness,
            now,
            put("law", "g", "kestrel corrected").valid(Validity {
                valid_from: Some(at + 10),
                valid_to: Some(at + 20),
            }),
        )
        .await,
        "correction",
    );
    assert_eq!(gaps(at + 15, now + 1, searched).await, vector_gap);
    assert_eq!(
        gaps(at + 15, now - 1, searched).await,
        complete,
        "not yet said"
    );

    // Erasure takes the gaps of its revisions with it.
    harness.clock.set(now + DAY);
    erase(&harness, "g").await;
    for (valid_at, as_of) in [
        (at + DAY + 5, now),
        (at + 15, now + 1),
        (at + 15, now + 2 * DAY),
    ] {
        assert_eq!(gaps(valid_at, as_of, searched).await, complete);
    }
}

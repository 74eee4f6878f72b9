//! Filters on the ledger: the SQL a ledger runs for a filter selects exactly the current
//! sources that [`Filter::matches`] selects, on random documents and random filters; the
//! filter is applied before the lexical `LIMIT`; and at a point in time it applies to the
//! revision that held.

use std::collections::{BTreeMap, BTreeSet};

use receipts::filter::facets::{FacetCount, FacetCounts, FacetField, FacetValue};
use receipts::filter::{Filter, FilterLimits, RevisionFacts};
use receipts::model::{Change, Document, Submission};
use receipts::validity::At;
use receipts::Clock;
use serde_json::{json, Value};
use uuid::Uuid;

use super::{must, must_accept, Harness};

/// A small deterministic generator (splitmix64): the same documents and filters on every
/// ledger, and a failing case can be replayed from its seed.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

const TAGS: [&str; 5] = ["async", "io", "net", "draft", "ünï"];
const KEYS: [&str; 8] = [
    "src/ch01.md",
    "src/ch16-threads.md",
    "src/appendix/a.md",
    "appendix/b.md",
    "src/ch1[1].md",
    "src/a_b%.md",
    "notes/x\\y.txt",
    "README",
];
const AUTHORS: [&str; 3] = ["Ada", "Alan", "Grace"];
const MEDIA: [&str; 3] = ["text/plain", "text/markdown", "text/x-rst"];

fn metadata_value(random: &mut Random) -> Option<Value> {
    Some(match random.below(12) {
        0 => return None,
        1 => Value::Null,
        2 => json!(random.below(5) as i64 + 2018),
        3 => json!(random.below(5) as f64 + 2018.5),
        4 => json!(*random.pick(&AUTHORS)),
        5 => json!([*random.pick(&AUTHORS), *random.pick(&AUTHORS)]),
        6 => json!(random.chance(50)),
        7 => json!("2020"),
        8 => json!({"nested": 2020}),
        9 => json!([2019, "Ada", true]),
        10 => json!([[2020]]),
        _ => json!(-0.5),
    })
}

fn document(random: &mut Random, serial: usize) -> Document {
    let tags: Vec<String> = TAGS
        .iter()
        .filter(|_| random.chance(35))
        .map(|tag| (*tag).to_owned())
        .collect();
    let mut metadata = serde_json::Map::new();
    for field in ["year", "author", "draft"] {
        if let Some(value) = metadata_value(random) {
            metadata.insert(field.to_owned(), value);
        }
    }
    Document {
        bytes: format!("lantern keeper {serial} of the harbour light").into_bytes(),
        media_type: (*random.pick(&MEDIA)).to_owned(),
        tags,
        metadata,
    }
}

fn scalar(random: &mut Random) -> Value {
    match random.below(7) {
        6 => json!(random.below(2)),
        0 => json!(random.below(5) as i64 + 2018),
        1 => json!(random.below(5) as f64 + 2018.5),
        2 => json!(*random.pick(&AUTHORS)),
        3 => json!(random.chance(50)),
        4 => json!("2020"),
        _ => json!(-0.5),
    }
}

fn condition(random: &mut Random, start: i64, end: i64) -> Value {
    let field = *random.pick(&["year", "author", "draft"]);
    let metadata = format!("metadata.{field}");
    match random.below(12) {
        0 => json!({"field": "tags", "any": [random.pick(&TAGS), random.pick(&TAGS)]}),
        1 => json!({"field": "tags", "all": [random.pick(&TAGS), random.pick(&TAGS)]}),
        2 => json!({"field": "tags", "none": [random.pick(&TAGS)]}),
        3 => json!({"field": "media_type", "in": [random.pick(&MEDIA)]}),
        4 => {
            json!({"field": "source_key", "prefix": random.pick(&["src/", "src/a", "appendix", "src/ch1["])})
        }
        5 => {
            json!({"field": "source_key", "glob": random.pick(&["src/*.md-*", "*[1]*", "src/a_b%.md-*", "*appendix*", "notes/x\\y.txt-?", "src/ch??.md-??", "*", "README-1?"])})
        }
        6 => {
            let middle = start + (end - start) * random.below(100) as i64 / 100;
            json!({"field": "accepted_at", *random.pick(&["gte", "gt", "lt", "lte"]): middle})
        }
        7 => json!({"field": metadata, "eq": scalar(random)}),
        8 => json!({"field": metadata, "in": [scalar(random), scalar(random)]}),
        9 => json!({"field": metadata, "exists": random.chance(50)}),
        10 => json!({"field": metadata, "gte": random.below(4) as i64 + 2018, "lt": 2021.5}),
        _ => json!({"field": metadata, "lt": 0}),
    }
}

fn filter(random: &mut Random, depth: usize, start: i64, end: i64) -> Value {
    if depth == 0 || random.chance(40) {
        return condition(random, start, end);
    }
    let mut group = serde_json::Map::new();
    for part in ["must", "should", "must_not"] {
        if random.chance(55) {
            let children: Vec<Value> = (0..1 + random.below(3))
                .map(|_| filter(random, depth - 1, start, end))
                .collect();
            group.insert(part.to_owned(), Value::Array(children));
        }
    }
    if group.is_empty() {
        return condition(random, start, end);
    }
    Value::Object(group)
}

fn put(key: &str, document: Document) -> Submission {
    Submission {
        dataset: "docs".to_owned(),
        source_key: key.to_owned(),
        actor: "test:conformance".to_owned(),
        connector: None,
        validity: Default::default(),
        change: Change::Put(document),
        readers: None,
    }
}

/// The source keys the lexical query finds under `filter`.
async fn found(harness: &Harness, filter: &Filter, limit: u32, at: Option<At>) -> Vec<String> {
    must(
        harness
            .ledger
            .lexical_search_where("lantern", &[], filter, limit, None, at)
            .await,
        "filtered lexical search",
    )
    .into_iter()
    .map(|hit| hit.source_key)
    .collect()
}

/// Random documents (edited and deleted as they go) and random filters: the ledger's lexical
/// phase finds exactly the current sources the exact evaluation selects; with a small limit
/// the page is full of matches whenever enough match; each condition kind is seen both
/// matching and not.
pub async fn filters_select_what_the_exact_evaluation_selects(harness: Harness) {
    let mut random = Random(0x5EED_F11E);
    let start = harness.clock.now_micros();
    let mut heads: BTreeMap<String, Uuid> = BTreeMap::new();
    for serial in 0..60 {
        let key = format!("{}-{serial}", random.pick(&KEYS));
        let accepted = must_accept(&harness, put(&key, document(&mut random, serial))).await;
        heads.insert(key, accepted.source_revision_id);
    }
    // Edits (new tags and metadata, so a stale revision would match differently) and
    // deletions.
    let keys: Vec<String> = heads.keys().cloned().collect();
    for (index, key) in keys.iter().enumerate() {
        if index % 4 == 0 {
            let accepted =
                must_accept(&harness, put(key, document(&mut random, 1000 + index))).await;
            heads.insert(key.clone(), accepted.source_revision_id);
        } else if index % 9 == 0 {
            must_accept(&harness, super::delete("docs", key)).await;
            heads.remove(key);
        }
    }
    let end = harness.clock.now_micros();
    // Who may read: some sources name readers (possibly none), the rest follow the dataset's
    // default, which turns closed halfway through the cases.
    const READERS: [&str; 4] = ["user:ada", "user:bob", "group:eng", "group:hr"];
    for key in &keys {
        if random.chance(60) {
            let readers: Vec<&str> = READERS
                .iter()
                .copied()
                .filter(|_| random.chance(40))
                .collect();
            super::set_readers(&harness, "docs", key, Some(&readers)).await;
        }
    }
    let identities: Vec<Vec<String>> = vec![
        vec!["user:ada".to_owned()],
        vec!["user:bob".to_owned(), "group:eng".to_owned()],
        vec![
            "service:x".to_owned(),
            "group:hr".to_owned(),
            "group:eng".to_owned(),
        ],
        vec!["user:nobody".to_owned()],
    ];
    let ids: Vec<Uuid> = heads.values().copied().collect();
    let mut facts = must(harness.ledger.revision_facts(&ids).await, "revision facts");
    assert_eq!(facts.len(), heads.len(), "every head's facts are read");

    let mut matched_some = 0;
    let mut matched_none = 0;
    let mut facet_values_seen = 0;
    let mut truncations = 0;
    // Unfiltered counts: every head.
    let every: Vec<&RevisionFacts> = facts.iter().collect();
    for field in ["tags", "metadata.author"] {
        let field = FacetField::parse(field).expect("a facet field");
        let got = must(
            harness
                .ledger
                .facet_counts(&[], None, None, &field, 100, None)
                .await,
            "facet counts",
        );
        assert_eq!(got, facet_model(&every, &field, 100), "unfiltered facets");
        assert_eq!(got.sources as usize, heads.len());
    }
    for case in 0..250 {
        let wire = filter(&mut random, 3, start, end);
        let roomy = FilterLimits {
            max_conditions: 500,
            ..FilterLimits::default()
        };
        let parsed = Filter::parse(&wire, roomy)
            .unwrap_or_else(|error| panic!("case {case}: {wire} refused: {error}"));
        if case == 125 {
            must(
                harness
                    .ledger
                    .change_access(receipts::access::AccessChange::Dataset {
                        dataset: "docs".to_owned(),
                        default: receipts::access::DefaultAccess::Nobody,
                        actor: "test:conformance".to_owned(),
                        reason: "closed halfway".to_owned(),
                    })
                    .await,
                "close the dataset",
            );
            facts = must(harness.ledger.revision_facts(&ids).await, "revision facts");
        }
        // A third of the cases read as an identity, as a search for such a token does.
        let parsed = if case % 3 == 0 {
            let who = random.pick(&identities).clone();
            receipts::access::restrict(Some(parsed), who)
        } else {
            parsed
        };
        let expected: BTreeSet<String> = facts
            .iter()
            .filter(|facts| parsed.matches(&facts.facts()))
            .map(|facts| facts.source_key.clone())
            .collect();
        let got: BTreeSet<String> = found(&harness, &parsed, 1000, None)
            .await
            .into_iter()
            .collect();
        assert_eq!(got, expected, "case {case}: {wire}");
        let selected: BTreeSet<Uuid> = must(
            harness
                .ledger
                .filter_revisions(&[], &parsed, None, 10_000)
                .await,
            "filter revisions",
        )
        .into_iter()
        .collect();
        let expected_heads: BTreeSet<Uuid> = facts
            .iter()
            .filter(|facts| parsed.matches(&facts.facts()))
            .map(|facts| facts.revision_id)
            .collect();
        assert_eq!(
            selected, expected_heads,
            "case {case}: heads selected by {wire}"
        );
        if expected.is_empty() {
            matched_none += 1;
        } else {
            matched_some += 1;
        }
        if case % 5 == 0 {
            let limit = *random.pick(&[2u32, 3, 100]);
            let counted: Vec<&RevisionFacts> = facts
                .iter()
                .filter(|facts| parsed.matches(&facts.facts()))
                .collect();
            for field in [
                "tags",
                "media_type",
                "metadata.year",
                "metadata.author",
                "metadata.draft",
            ] {
                let field = FacetField::parse(field).expect("a facet field");
                let got = must(
                    harness
                        .ledger
                        .facet_counts(&[], Some(&parsed), None, &field, limit, None)
                        .await,
                    "facet counts",
                );
                assert_eq!(
                    got,
                    facet_model(&counted, &field, limit),
                    "case {case}: facets of {} under {wire}",
                    field.name()
                );
                facet_values_seen += got.values.len();
                truncations += usize::from(got.truncated);
            }
        }
        if expected.len() >= 3 {
            // Applied before the cut: a page of 3 is 3 matching sources' passages.
            let page = found(&harness, &parsed, 3, None).await;
            assert_eq!(page.len(), 3, "case {case}: a short page under {wire}");
            assert!(
                page.iter().all(|key| expected.contains(key)),
                "case {case}: {page:?}"
            );
        }
    }
    assert!(
        facet_values_seen > 100 && truncations > 5,
        "facets must count values and cut long lists ({facet_values_seen} values, \
         {truncations} cut)"
    );
    assert!(
        matched_some > 50 && matched_none > 10,
        "the random filters must both match and miss ({matched_some} matched, {matched_none} \
         empty)"
    );
}

/// At a point in time a filter applies to the revision that held then, not to the head.
pub async fn filters_apply_to_the_revision_that_held(harness: Harness) {
    let tagged = |tag: &str| Document {
        bytes: format!("lantern of {tag} times").into_bytes(),
        media_type: "text/plain".to_owned(),
        tags: vec![tag.to_owned()],
        metadata: serde_json::Map::new(),
    };
    let old = must_accept(&harness, put("v", tagged("old"))).await;
    harness.clock.advance(10_000_000);
    let new = must_accept(&harness, put("v", tagged("new"))).await;
    harness.clock.advance(10_000_000);
    let now = harness.clock.now_micros();
    let at = At {
        valid_at: old.accepted_at + 1,
        as_of: now,
    };
    let tag = |name: &str| {
        Filter::parse(
            &json!({"field": "tags", "any": [name]}),
            FilterLimits::default(),
        )
        .expect("parses")
    };
    let revisions = |hits: Vec<receipts::LexicalHit>| -> Vec<Uuid> {
        hits.into_iter().map(|hit| hit.revision_id).collect()
    };
    let then_old = must(
        harness
            .ledger
            .lexical_search_where("lantern", &[], &tag("old"), 10, None, Some(at))
            .await,
        "search then",
    );
    assert_eq!(revisions(then_old), vec![old.source_revision_id]);
    let then_new = must(
        harness
            .ledger
            .lexical_search_where("lantern", &[], &tag("new"), 10, None, Some(at))
            .await,
        "search then",
    );
    assert!(then_new.is_empty(), "{then_new:?}");
    let now_new = must(
        harness
            .ledger
            .lexical_search_where("lantern", &[], &tag("new"), 10, None, None)
            .await,
        "search now",
    );
    assert_eq!(revisions(now_new), vec![new.source_revision_id]);
    let now_old = must(
        harness
            .ledger
            .lexical_search_where("lantern", &[], &tag("old"), 10, None, None)
            .await,
        "search now",
    );
    assert!(now_old.is_empty(), "{now_old:?}");
    let selected = |filter: Filter, at: Option<At>| {
        let ledger = harness.ledger.clone();
        async move {
            must(
                ledger
                    .filter_revisions(&["docs".to_owned()], &filter, at, 10)
                    .await,
                "filter revisions",
            )
        }
    };
    assert_eq!(
        selected(tag("old"), Some(at)).await,
        vec![old.source_revision_id]
    );
    // Facets at that time count the revision that held.
    let tags_then = must(
        harness
            .ledger
            .facet_counts(&[], None, Some(at), &FacetField::Tags, 10, None)
            .await,
        "facets then",
    );
    assert_eq!(
        tags_then.values,
        vec![FacetCount {
            value: FacetValue::Text("old".to_owned()),
            count: 1
        }]
    );
    let tags_now = must(
        harness
            .ledger
            .facet_counts(&[], None, None, &FacetField::Tags, 10, None)
            .await,
        "facets now",
    );
    assert_eq!(
        tags_now.values,
        vec![FacetCount {
            value: FacetValue::Text("new".to_owned()),
            count: 1
        }]
    );
    assert!(selected(tag("new"), Some(at)).await.is_empty());
    assert_eq!(
        selected(tag("new"), None).await,
        vec![new.source_revision_id]
    );
    assert!(selected(tag("old"), None).await.is_empty());
    let elsewhere = must(
        harness
            .ledger
            .filter_revisions(&["notes".to_owned()], &tag("new"), None, 10)
            .await,
        "filter revisions",
    );
    assert!(elsewhere.is_empty());
}

/// The exact facet counts, from each revision's facts: a source counts once per distinct value
/// it holds (a list's elements; strings, numbers and booleans only).
fn facet_model(facts: &[&RevisionFacts], field: &FacetField, limit: u32) -> FacetCounts {
    let mut counted: Vec<FacetCount> = Vec::new();
    let mut valued = 0;
    for facts in facts {
        let mut values: Vec<FacetValue> = Vec::new();
        let offered: Vec<Value> = match field {
            FacetField::Tags => facts.tags.iter().map(|tag| json!(tag)).collect(),
            FacetField::MediaType => vec![json!(facts.media_type)],
            FacetField::Metadata(name) => match facts.metadata.get(name) {
                Some(Value::Array(items)) => items.clone(),
                Some(value) => vec![value.clone()],
                None => Vec::new(),
            },
        };
        for value in offered {
            let value = match value {
                Value::Bool(flag) => FacetValue::Bool(flag),
                Value::Number(number) => match number.as_f64() {
                    Some(number) => FacetValue::Number(number),
                    None => continue,
                },
                Value::String(text) => FacetValue::Text(text),
                _ => continue,
            };
            if !values.contains(&value) {
                values.push(value);
            }
        }
        valued += usize::from(!values.is_empty());
        for value in values {
            match counted.iter_mut().find(|count| count.value == value) {
                Some(count) => count.count += 1,
                None => counted.push(FacetCount { value, count: 1 }),
            }
        }
    }
    counted.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.value.order(&b.value)));
    let distinct = counted.len();
    counted.truncate(limit as usize);
    FacetCounts {
        field: field.name(),
        sources: facts.len() as u64,
        missing: (facts.len() - valued) as u64,
        truncated: distinct > counted.len(),
        values: counted,
        exact: true,
    }
}

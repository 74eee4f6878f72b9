//! Conformance: who may read which document. Tokens carry an identity (and keep it through a
//! rotation); access changes go through one path, write nothing when nothing changes, are
//! recorded in history, and are read back as the readers in force; the ledger's one check
//! (`may_read`) and the filter condition a search joins (`Condition::Readable`) agree with
//! [`receipts::access::admits`] for sources with readers, sources on their dataset's default,
//! a dataset turned closed, a reader revoked and an erased source. (The random filters of
//! `filters_select_what_the_exact_evaluation_selects` run with random access too.)

use std::collections::BTreeSet;

use receipts::access::{restrict, AccessChange, DefaultAccess, Identity};
use receipts::auth::{NewToken, Scope, TokenChange};
use receipts::filter::Filter;
use receipts::model::ErasureRequest;

use super::{must, must_accept, put, Harness};

fn names(principal: &str, groups: &[&str]) -> Vec<String> {
    let groups: Vec<String> = groups.iter().map(|group| (*group).to_owned()).collect();
    Identity::new(principal, &groups)
        .expect("an identity")
        .names()
}

/// Sets a source's readers (`None`: back to the dataset's default).
pub async fn set_readers(harness: &Harness, dataset: &str, key: &str, readers: Option<&[&str]>) {
    must(
        harness
            .ledger
            .change_access(AccessChange::Source {
                dataset: dataset.to_owned(),
                source_key: key.to_owned(),
                readers: readers.map(|list| list.iter().map(|r| (*r).to_owned()).collect()),
                actor: "test:conformance".to_owned(),
                reason: "conformance".to_owned(),
            })
            .await,
        "change access",
    );
}

async fn set_default(harness: &Harness, dataset: &str, default: DefaultAccess) {
    must(
        harness
            .ledger
            .change_access(AccessChange::Dataset {
                dataset: dataset.to_owned(),
                default,
                actor: "test:conformance".to_owned(),
                reason: "conformance".to_owned(),
            })
            .await,
        "change the dataset default",
    );
}

/// The heads `filter` selects in every dataset.
async fn selection(harness: &Harness, filter: &Filter) -> Vec<uuid::Uuid> {
    must(
        harness
            .ledger
            .filter_revisions(&[], filter, None, 1000)
            .await,
        "filter revisions",
    )
}

/// A token may read as an identity, which authentication hands back and a rotation keeps; a
/// token without one reads as none; a malformed identity is refused.
pub async fn tokens_carry_an_identity(harness: Harness) {
    let identity =
        Identity::new("user:alice", &["eng".to_owned(), "hr".to_owned()]).expect("an identity");
    let token = |name: &str, identity: Option<Identity>| NewToken {
        name: name.to_owned(),
        scopes: vec![Scope::Search],
        datasets: None,
        identity,
        created_by: "test".to_owned(),
        expires_at: None,
    };
    let alice = must(
        harness
            .ledger
            .create_token(token("alice", Some(identity.clone())))
            .await,
        "create",
    );
    let plain = must(
        harness.ledger.create_token(token("plain", None)).await,
        "create",
    );
    let principal = must(harness.ledger.authenticate(&alice.secret).await, "auth")
        .expect("alice authenticates");
    assert_eq!(principal.identity.as_ref(), Some(&identity));
    assert_eq!(
        principal.reads_as(),
        Some(vec![
            "user:alice".to_owned(),
            "group:eng".to_owned(),
            "group:hr".to_owned()
        ])
    );
    let principal = must(harness.ledger.authenticate(&plain.secret).await, "auth")
        .expect("plain authenticates");
    assert_eq!(principal.identity, None);
    assert_eq!(principal.reads_as(), None);
    let rotated = must(
        harness
            .ledger
            .change_token(TokenChange::Rotate {
                id: alice.id,
                actor: "test".to_owned(),
                reason: None,
                expires_at: None,
            })
            .await,
        "rotate",
    );
    assert_eq!(rotated.token.identity.as_ref(), Some(&identity));
    let listed = must(harness.ledger.tokens().await, "list");
    assert!(listed
        .iter()
        .any(|info| info.id == rotated.token.id && info.identity.as_ref() == Some(&identity)));
    let forged = Identity {
        principal: "user:mallory".to_owned(),
        groups: vec!["eng".to_owned()],
    };
    let refused = harness
        .ledger
        .create_token(token("forged", Some(forged)))
        .await
        .expect_err("groups must be `group:<name>`");
    assert_eq!(refused.code(), "invalid_groups");
}

/// Access changes go through one path: each is recorded in history with its actor and reason,
/// a change to what is held writes nothing, and the readers in force follow the source's own
/// list, else its dataset's default; `may_read` applies them to each identity.
pub async fn access_changes_are_one_audited_path(harness: Harness) {
    must_accept(&harness, put("docs", "hr/pay.md", "salaries lantern")).await;
    must_accept(&harness, put("docs", "wiki/home.md", "welcome lantern")).await;
    let alice = names("user:alice", &["hr"]);
    let bob = names("user:bob", &["eng"]);
    let may = |who: &Vec<String>, key: &str| {
        let ledger = harness.ledger.clone();
        let who = who.clone();
        let key = key.to_owned();
        async move { must(ledger.may_read(Some(&who), "docs", &key).await, "may read") }
    };
    // Nobody named: the dataset is open to every identity.
    let record = must(
        harness.ledger.access_of("docs", "hr/pay.md").await,
        "access of",
    );
    assert_eq!((record.readers, record.version), (None, 0));
    assert!(may(&bob, "hr/pay.md").await);

    set_readers(&harness, "docs", "hr/pay.md", Some(&["group:hr"])).await;
    set_readers(&harness, "docs", "hr/pay.md", Some(&["group:hr"])).await;
    let record = must(
        harness.ledger.access_of("docs", "hr/pay.md").await,
        "access of",
    );
    assert_eq!(record.readers, Some(vec!["group:hr".to_owned()]));
    assert_eq!(record.version, 1, "an unchanged list is no change");
    assert_eq!(record.changed_by.as_deref(), Some("test:conformance"));
    assert!(may(&alice, "hr/pay.md").await);
    assert!(!may(&bob, "hr/pay.md").await);
    assert!(must(
        harness.ledger.may_read(None, "docs", "hr/pay.md").await,
        "may read"
    ));

    // A reader added, then the group revoked: each takes effect at once.
    set_readers(
        &harness,
        "docs",
        "hr/pay.md",
        Some(&["group:hr", "user:bob"]),
    )
    .await;
    assert!(may(&bob, "hr/pay.md").await);
    set_readers(&harness, "docs", "hr/pay.md", Some(&["user:bob"])).await;
    assert!(!may(&alice, "hr/pay.md").await);

    // A closed dataset hides what names nobody, and only that.
    set_default(&harness, "docs", DefaultAccess::Nobody).await;
    assert!(!may(&alice, "wiki/home.md").await);
    assert!(may(&bob, "hr/pay.md").await);
    let record = must(
        harness.ledger.access_of("docs", "wiki/home.md").await,
        "access of",
    );
    assert_eq!(record.effective(), Some(Vec::new()));
    // Back to the default: closed, so bob loses it too.
    set_readers(&harness, "docs", "hr/pay.md", None).await;
    assert!(!may(&bob, "hr/pay.md").await);
    set_default(&harness, "docs", DefaultAccess::Everyone).await;
    assert!(may(&bob, "hr/pay.md").await);

    let history = must(
        harness.ledger.history("access", "docs/hr/pay.md").await,
        "history",
    );
    // Each engine writes a list as its JSON text: compared as JSON.
    let states: Vec<serde_json::Value> = history
        .iter()
        .map(|entry| {
            let to = entry.to.clone().unwrap_or_default();
            serde_json::from_str(&to).unwrap_or(serde_json::Value::String(to))
        })
        .collect();
    assert_eq!(
        states,
        vec![
            serde_json::json!(["group:hr"]),
            serde_json::json!(["group:hr", "user:bob"]),
            serde_json::json!(["user:bob"]),
            serde_json::json!("default"),
        ],
        "one history row per change, none for the repeat"
    );
    assert!(history
        .iter()
        .all(|entry| entry.actor == "test:conformance" && entry.cause == "conformance"));
    let defaults = must(harness.ledger.history("access", "docs").await, "history");
    assert_eq!(defaults.len(), 2, "closed, then open again: {defaults:?}");

    // A new revision keeps the source's readers; changes racing new revisions end with the
    // last change, whatever the interleaving, and every revision is read by it.
    set_readers(&harness, "docs", "wiki/home.md", Some(&["group:eng"])).await;
    must_accept(
        &harness,
        put("docs", "wiki/home.md", "welcome, edited lantern"),
    )
    .await;
    assert!(may(&bob, "wiki/home.md").await);
    assert!(!may(&alice, "wiki/home.md").await);
    let mut racing = Vec::new();
    for round in 0..8 {
        let ledger = harness.ledger.clone();
        racing.push(tokio::spawn(async move {
            let readers = if round % 2 == 0 {
                vec!["user:alice".to_owned()]
            } else {
                vec!["group:eng".to_owned()]
            };
            ledger
                .change_access(AccessChange::Source {
                    dataset: "docs".to_owned(),
                    source_key: "wiki/home.md".to_owned(),
                    readers: Some(readers),
                    actor: "test:conformance".to_owned(),
                    reason: format!("race {round}"),
                })
                .await
        }));
        let ledger = harness.ledger.clone();
        racing.push(tokio::spawn(async move {
            ledger
                .accept(vec![put(
                    "docs",
                    "wiki/home.md",
                    &format!("edit {round} lantern"),
                )])
                .await
                .into_iter()
                .try_for_each(|result| result.map(|_| ()))
        }));
    }
    for task in racing {
        must(task.await.expect("a racing task"), "racing change or put");
    }
    set_readers(&harness, "docs", "wiki/home.md", Some(&["user:bob"])).await;
    let source = must(
        harness.ledger.source("docs", "wiki/home.md").await,
        "source",
    )
    .expect("the source");
    assert!(
        source.revisions.len() >= 10,
        "{} revisions",
        source.revisions.len()
    );
    assert!(may(&bob, "wiki/home.md").await);
    assert!(!may(&alice, "wiki/home.md").await);

    // An erased source is gone for every reader; its readers stay with its key (fail closed:
    // a document ingested again under it is read by the same readers until they change).
    must(
        harness
            .ledger
            .erase(ErasureRequest {
                dataset: "docs".to_owned(),
                source_key: "wiki/home.md".to_owned(),
                actor: "test:conformance".to_owned(),
                reason: "conformance".to_owned(),
            })
            .await,
        "erase",
    );
    let readable = restrict(None, bob.clone());
    let left = selection(&harness, &readable).await;
    let facts = must(harness.ledger.revision_facts(&left).await, "facts");
    assert!(
        facts.iter().all(|fact| fact.source_key != "wiki/home.md"),
        "an erased source is selected for nobody"
    );
    let record = must(
        harness.ledger.access_of("docs", "wiki/home.md").await,
        "access of",
    );
    assert_eq!(record.readers, Some(vec!["user:bob".to_owned()]));
    must_accept(&harness, put("docs", "wiki/home.md", "back again lantern")).await;
    assert!(!may(&alice, "wiki/home.md").await);
    assert!(may(&bob, "wiki/home.md").await);

    // The sources that name readers, listed by key and paged, one dataset at a time.
    set_readers(&harness, "docs", "hr/pay.md", Some(&["group:hr"])).await;
    set_readers(&harness, "other", "z.md", Some(&["user:zed"])).await;
    let listed = must(
        harness.ledger.named_readers("docs", None, 1000).await,
        "named readers",
    );
    assert_eq!(
        listed,
        vec![
            ("hr/pay.md".to_owned(), vec!["group:hr".to_owned()]),
            ("wiki/home.md".to_owned(), vec!["user:bob".to_owned()]),
        ]
    );
    let first = must(
        harness.ledger.named_readers("docs", None, 1).await,
        "first page",
    );
    assert_eq!(first.len(), 1);
    let rest = must(
        harness
            .ledger
            .named_readers("docs", Some(&first[0].0), 1000)
            .await,
        "next page",
    );
    assert_eq!(rest, listed[1..].to_vec());

    // Malformed readers never reach the ledger's tables through the checked path.
    let refused = receipts::access::SourceAccess {
        readers: vec!["alice".to_owned()],
    }
    .checked()
    .expect_err("a reader needs its kind");
    assert_eq!(refused.code(), "invalid_access");
}

/// The filter condition a search joins for an identity selects, in the lexical query and the
/// ledger's selection, exactly the heads the exact evaluation admits over `revision_facts`;
/// after a revocation and an erasure too.
pub async fn readable_sources_are_selected_exactly(harness: Harness) {
    let keys = ["a", "b", "c", "d", "e", "f"];
    for key in keys {
        must_accept(&harness, put("docs", key, &format!("lantern {key}"))).await;
    }
    must_accept(&harness, put("other", "z", "lantern z")).await;
    set_readers(&harness, "docs", "a", Some(&["user:alice"])).await;
    set_readers(&harness, "docs", "b", Some(&["group:eng"])).await;
    set_readers(&harness, "docs", "c", Some(&[])).await;
    set_readers(&harness, "docs", "d", Some(&["user:bob", "group:hr"])).await;
    let identities = [
        names("user:alice", &[]),
        names("user:bob", &["eng"]),
        names("service:indexer", &["hr"]),
    ];
    let check = |label: &'static str| {
        let harness = &harness;
        let identities = identities.clone();
        async move {
            let mut seen = BTreeSet::new();
            for who in &identities {
                let filter: Filter = restrict(None, who.clone());
                let heads = selection(harness, &filter).await;
                let facts = must(harness.ledger.revision_facts(&heads).await, "facts");
                let selected: BTreeSet<String> =
                    facts.iter().map(|fact| fact.source_key.clone()).collect();
                let all = must(
                    harness
                        .ledger
                        .lexical_search("lantern", &[], 1000, None)
                        .await,
                    "lexical",
                );
                let mut expected = BTreeSet::new();
                for hit in &all {
                    if must(
                        harness
                            .ledger
                            .may_read(Some(who), &hit.dataset, &hit.source_key)
                            .await,
                        "may read",
                    ) {
                        expected.insert(hit.source_key.clone());
                    }
                }
                let lexical: BTreeSet<String> = must(
                    harness
                        .ledger
                        .lexical_search_where("lantern", &[], &filter, 1000, None, None)
                        .await,
                    "lexical",
                )
                .into_iter()
                .map(|hit| hit.source_key)
                .collect();
                assert_eq!(selected, expected, "{label}: selection for {who:?}");
                assert_eq!(lexical, expected, "{label}: lexical for {who:?}");
                assert!(
                    facts.iter().all(|fact| filter.matches(&fact.facts())),
                    "{label}: binding admits what was selected"
                );
                seen.insert(expected.len());
            }
            seen
        }
    };
    let sizes = check("named and open").await;
    assert!(
        sizes.len() > 1,
        "identities must see different sets: {sizes:?}"
    );
    // alice: a, e, f, z; bob (eng): b, d, e, f, z; the indexer (hr): d, e, f, z.
    let alice = restrict(None, identities[0].clone());
    let heads = selection(&harness, &alice).await;
    assert_eq!(heads.len(), 4, "alice reads a, e, f and z");

    set_readers(&harness, "docs", "a", Some(&["user:bob"])).await;
    set_default(&harness, "docs", DefaultAccess::Nobody).await;
    must(
        harness
            .ledger
            .erase(ErasureRequest {
                dataset: "docs".to_owned(),
                source_key: "d".to_owned(),
                actor: "test:conformance".to_owned(),
                reason: "conformance".to_owned(),
            })
            .await,
        "erase",
    );
    check("revoked, closed and erased").await;
    let heads = must(
        harness
            .ledger
            .filter_revisions(&[], &alice, None, 1000)
            .await,
        "filter revisions",
    );
    assert_eq!(
        heads.len(),
        1,
        "alice now reads z only (another, open dataset)"
    );
}

/// A put's readers are recorded in its acceptance's own transaction: an accepted put (a
/// duplicate too) sets them, with its actor in history; a refused one (blocked content, a key
/// a connector owns, readers that are not names) changes nobody's access, so a failing put
/// can never widen who reads the revision already there.
pub async fn a_puts_readers_hold_only_when_it_is_accepted(harness: Harness) {
    let ledger = &harness.ledger;
    must_accept(
        &harness,
        put("docs", "a.md", "alpha lantern").read_by(vec!["user:alice".to_owned()]),
    )
    .await;
    let record = must(ledger.access_of("docs", "a.md").await, "access of");
    assert_eq!(record.readers, Some(vec!["user:alice".to_owned()]));
    assert_eq!(record.changed_by.as_deref(), Some("test:conformance"));
    // The same bytes again, naming bob: a duplicate, and its readers hold.
    let again = must(
        ledger
            .accept(vec![put("docs", "a.md", "alpha lantern")
                .read_by(vec!["user:bob".to_owned(), "user:alice".to_owned()])])
            .await
            .pop()
            .expect("one result"),
        "duplicate",
    );
    assert_eq!(again.status, receipts::model::AcceptStatus::Duplicate);
    assert_eq!(
        must(ledger.access_of("docs", "a.md").await, "access of").readers,
        Some(vec!["user:alice".to_owned(), "user:bob".to_owned()])
    );
    // Blocked content naming everyone: refused, and the readers are as they were.
    must(
        ledger
            .block_content(receipts::model::ContentBlock {
                dataset: "docs".to_owned(),
                sha256: receipts::ids::sha256_hex(b"blocked lantern"),
                reason: "retracted".to_owned(),
                actor: "token:curator".to_owned(),
            })
            .await,
        "block",
    );
    let refused = ledger
        .accept(vec![
            put("docs", "a.md", "blocked lantern").read_by(vec!["user:mallory".to_owned()])
        ])
        .await
        .pop()
        .expect("one result");
    assert!(refused.is_err(), "{refused:?}");
    // Readers that are not names: refused before anything is written.
    let malformed = ledger
        .accept(vec![
            put("docs", "b.md", "beta lantern").read_by(vec!["mallory".to_owned()])
        ])
        .await
        .pop()
        .expect("one result");
    assert!(
        malformed.is_err_and(|error| error.code() == "invalid_access"),
        "a reader needs its kind"
    );
    assert!(must(ledger.source("docs", "b.md").await, "source").is_none());
    let record = must(ledger.access_of("docs", "a.md").await, "access of");
    assert_eq!(
        record.readers,
        Some(vec!["user:alice".to_owned(), "user:bob".to_owned()])
    );
    assert_eq!(record.version, 2, "two accepted puts, two changes");
    assert!(!must(
        ledger
            .may_read(Some(&names("user:mallory", &[])), "docs", "a.md")
            .await,
        "may read"
    ));
}

/// A change to a source's readers queues one `access` job per live vector generation, in the
/// change's own transaction: none while the source's projection waits to run (it reads the
/// readers when it runs), one pending at most per source (it reads them when it runs), a
/// new one once the last is running; none for a source that does not exist, a change that
/// changes nothing or a dataset's default.
pub async fn access_changes_queue_access_jobs(harness: Harness) {
    use receipts::JobKind;
    let ledger = &harness.ledger;
    let generation = super::activate_test_generation(&harness).await;
    must_accept(&harness, put("docs", "a.md", "alpha")).await;
    // The projection waits to run: it writes the readers itself.
    set_readers(&harness, "docs", "a.md", Some(&["user:a"])).await;
    let (project, token) = super::claim_one(&harness, "worker").await;
    assert_eq!(project.kind, JobKind::Project);
    must(ledger.complete(&token).await, "complete the projection");
    assert!(must(ledger.claim("worker", 10).await, "claim").is_empty());

    set_readers(&harness, "docs", "a.md", Some(&["user:b"])).await;
    let (access, _running) = super::claim_one(&harness, "worker").await;
    assert_eq!(access.kind, JobKind::Access);
    assert_eq!(
        (access.dataset.as_str(), access.source_key.as_str()),
        ("docs", "a.md")
    );
    assert_eq!(access.revision_id, None);
    assert_eq!(access.connector_id, None);
    assert_eq!(access.generation.as_deref(), Some(generation.id.as_str()));
    assert_eq!(access.priority, receipts::access::ACCESS_PRIORITY);

    // While it runs, a change queues another; further changes share that pending one.
    set_readers(&harness, "docs", "a.md", Some(&["user:c"])).await;
    set_readers(&harness, "docs", "a.md", Some(&["user:d"])).await;
    let claimed = must(ledger.claim("worker", 10).await, "claim");
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(claimed[0].kind, JobKind::Access);

    // Back to the dataset's default is a change too.
    set_readers(&harness, "docs", "a.md", None).await;
    let claimed = must(ledger.claim("worker", 10).await, "claim");
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert!(
        claimed[0].change_cause.contains("claimed"),
        "{:?}",
        claimed[0]
    );

    // Nothing to write: the same readers, a source that does not exist, a dataset default.
    set_readers(&harness, "docs", "a.md", None).await;
    set_readers(&harness, "docs", "missing.md", Some(&["user:a"])).await;
    set_default(&harness, "docs", DefaultAccess::Nobody).await;
    assert!(must(ledger.claim("worker", 10).await, "claim").is_empty());

    // The history names who queued the jobs and why.
    let queued = must(
        ledger.history("job", &access.id.to_string()).await,
        "history",
    );
    assert!(
        queued
            .iter()
            .any(|entry| entry.actor == receipts::access::ACCESS_QUEUER
                && entry.cause.contains("conformance")),
        "{queued:?}"
    );
}

//! Running a pass: bucket by bucket from its cursor, each bucket read twice before anything
//! is recorded, paced by the store requests made and the points read (at most
//! `points_per_second`, a request counting as [`crate::REQUEST_POINTS`]), ended as completed
//! (every bucket checked) or abandoned (by an operator, or by an error it names).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gateways::vectors::Held;
use gateways::{GatewayError, VectorStore, VectorStores};
use receipts::model::{
    stores, Backend, DriftRecord, DriftState, GenerationState, LedgerBucket, PassChange, PassState,
    VerifyPass, VerifyTier,
};
use receipts::verify::{self as rules, Drift, BUCKETS};
use receipts::{LedgerError, VerifyLedger};
use uuid::Uuid;

use crate::VerifySettings;

/// Why a pass could not go on.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The ledger refused or failed.
    #[error("{0}")]
    Ledger(LedgerError),
    /// A store failed (the pass is abandoned with the store's message).
    #[error("{0}")]
    Store(GatewayError),
}

impl From<LedgerError> for VerifyError {
    fn from(error: LedgerError) -> Self {
        VerifyError::Ledger(error)
    }
}

impl From<GatewayError> for VerifyError {
    fn from(error: GatewayError) -> Self {
        VerifyError::Store(error)
    }
}

/// What one bucket came to.
#[derive(Debug, Clone, Default)]
pub struct BucketOutcome {
    /// Drift the second look confirmed.
    pub drift: Vec<Drift>,
    /// Sources skipped because work was in flight.
    pub skipped: i64,
    /// Requests made to the vector store.
    pub store_requests: u64,
    /// Points the check covered: those the store counted or answered (once or twice), or
    /// those the ledger's heads promise when more, for the ledger's side of the work.
    pub points_read: u64,
    /// The ledger's side as the second look read it (what a repair acts on).
    pub ledger: LedgerBucket,
}

/// Runs verify passes for one process: started by hand (the API) or on a schedule, each pass
/// run by at most one task here (the ledger keeps one running pass per tier and generation
/// across processes).
pub struct Verifier {
    pub(crate) ledger: Arc<dyn VerifyLedger>,
    pub(crate) stores: Option<Arc<dyn VectorStores>>,
    settings: VerifySettings,
    /// Embeds one sampled chunk per bucket in the deep tier with the generation's model, to
    /// catch vectors of a wrong model.
    embedders: Option<Arc<dyn gateways::Embedders>>,
    running: Mutex<HashSet<Uuid>>,
    /// Store calls made by this verifier's passes (bucket counts and bucket reads).
    calls: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("settings", &self.settings)
            .field("vector_stores", &self.stores.is_some())
            .finish()
    }
}

/// The store a generation projects into, and whether it is there at all.
struct StoreSide {
    store: Option<Arc<dyn VectorStore>>,
    /// The generation's embedding model.
    model: String,
    /// The container (collection) is gone and the pass does not repair: every promise is
    /// missing.
    absent: bool,
}

impl Verifier {
    /// A verifier over `ledger` and the vector stores of its generations (`None`: no vector
    /// backend here; chunk rows and bytes are still checked).
    pub fn new(
        ledger: Arc<dyn VerifyLedger>,
        stores: Option<Arc<dyn VectorStores>>,
        settings: VerifySettings,
    ) -> Arc<Verifier> {
        Verifier::with_embedders(ledger, stores, None, settings)
    }

    /// [`Verifier::new`] with the models the generations embed with: the deep tier embeds one
    /// chunk per bucket again with the generation's model and compares it with the stored
    /// vector (generations of a model this process cannot run are not sampled).
    pub fn with_embedders(
        ledger: Arc<dyn VerifyLedger>,
        stores: Option<Arc<dyn VectorStores>>,
        embedders: Option<Arc<dyn gateways::Embedders>>,
        settings: VerifySettings,
    ) -> Arc<Verifier> {
        Arc::new(Verifier {
            ledger,
            stores,
            embedders,
            settings,
            running: Mutex::new(HashSet::new()),
            calls: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Its settings.
    pub fn settings(&self) -> &VerifySettings {
        &self.settings
    }

    /// Store calls its passes made so far (a bucket's count, a bucket's read).
    pub fn store_calls(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Starts a pass of `tier` over `generation` (the active one when `None`), or answers the
    /// running one, and runs it in the background, at `rate` points per second when given
    /// (`cairn verify --rate`; the configured limit otherwise, and after a restart resumes
    /// it). Returns the pass as it stands.
    pub async fn start(
        self: &Arc<Self>,
        tier: VerifyTier,
        generation: Option<String>,
        repair: bool,
        rate: Option<u32>,
        actor: &str,
        reason: &str,
    ) -> Result<VerifyPass, VerifyError> {
        let generation = match generation {
            Some(generation) => generation,
            None => self
                .ledger
                .active_generation()
                .await?
                .map(|generation| generation.id)
                .ok_or_else(|| {
                    LedgerError::invalid(
                        "no_active_generation",
                        "no generation is active yet: nothing has been projected to verify",
                    )
                })?,
        };
        let pass = self
            .ledger
            .change_pass(PassChange::Start {
                tier,
                generation,
                repair,
                actor: actor.to_owned(),
                reason: reason.to_owned(),
            })
            .await?;
        self.spawn(pass.clone(), rate);
        Ok(pass)
    }

    /// Starts the schedule: resumes the passes the ledger says are running (a restart stopped
    /// them mid-way; their cursor says where), then starts a pass of the configured tier over
    /// the active generation every interval. Also sets the last-complete gauges from the
    /// ledger, so a restart does not make a recent pass look old.
    pub fn spawn_schedule(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let verifier = self.clone();
        tokio::spawn(async move {
            match verifier.ledger.verify_passes(100).await {
                Ok(passes) => {
                    for tier in VerifyTier::ALL {
                        if let Some(done) = passes
                            .iter()
                            .find(|p| p.tier == *tier && p.state == PassState::Completed)
                        {
                            metrics::gauge!("cairn_verify_last_complete_seconds", "tier" => tier.as_str())
                                .set(done.changed_at as f64 / 1e6);
                        }
                    }
                    for pass in passes.into_iter().filter(|p| p.state == PassState::Running) {
                        tracing::info!(pass = %pass.id, tier = %pass.tier, cursor = pass.cursor, "resuming a verify pass");
                        verifier.spawn(pass, None);
                    }
                }
                Err(error) => tracing::warn!(%error, "could not read verify passes to resume"),
            }
            let Some(interval) = verifier.settings.interval else {
                return;
            };
            loop {
                tokio::time::sleep(interval).await;
                let (tier, repair) = (verifier.settings.tier, verifier.settings.repair);
                let reason = format!("scheduled every {} s", interval.as_secs());
                if let Err(error) = verifier
                    .start(tier, None, repair, None, "cairn:schedule", &reason)
                    .await
                {
                    tracing::warn!(%error, %tier, "the scheduled verify pass did not start");
                }
            }
        })
    }

    /// Runs `pass` in a task of its own unless this process already runs it.
    fn spawn(self: &Arc<Self>, pass: VerifyPass, rate: Option<u32>) {
        let verifier = self.clone();
        tokio::spawn(async move {
            if let Err(error) = verifier.run_at(pass.clone(), rate).await {
                tracing::error!(pass = %pass.id, tier = %pass.tier, generation = %pass.generation, %error, "verify pass stopped");
            }
        });
    }

    /// Runs `pass` from its cursor to its end in the caller's task; returns the pass as it
    /// ended. A store or ledger failure abandons it, naming the failure (the next pass starts
    /// over). Does nothing and answers the pass if this process already runs it.
    pub async fn run(&self, pass: VerifyPass) -> Result<VerifyPass, VerifyError> {
        self.run_at(pass, None).await
    }

    /// [`Verifier::run`] at `rate` points per second (`None`: the configured limit).
    pub async fn run_at(
        &self,
        pass: VerifyPass,
        rate: Option<u32>,
    ) -> Result<VerifyPass, VerifyError> {
        let first = self
            .running
            .lock()
            .map(|mut running| running.insert(pass.id))
            .unwrap_or(false);
        if !first {
            return Ok(pass);
        }
        let result = self.run_to_end(pass.clone(), rate).await;
        if let Ok(mut running) = self.running.lock() {
            running.remove(&pass.id);
        }
        match result {
            Ok(pass) => Ok(pass),
            Err(error) => {
                let reason = format!("stopped by an error: {error}");
                let abandoned = self
                    .ledger
                    .change_pass(PassChange::Finish {
                        pass_id: pass.id,
                        state: PassState::Abandoned,
                        actor: "cairn:verify".to_owned(),
                        reason: reason.chars().take(500).collect(),
                    })
                    .await;
                if let Err(recorded) = abandoned {
                    tracing::warn!(pass = %pass.id, %recorded, "could not record the pass as abandoned");
                }
                Err(error)
            }
        }
    }

    async fn run_to_end(
        &self,
        mut pass: VerifyPass,
        rate: Option<u32>,
    ) -> Result<VerifyPass, VerifyError> {
        let side = self.store_side(&pass).await?;
        let tier = pass.tier;
        let rate = f64::from(rate.unwrap_or(self.settings.points_per_second).max(1));
        let started = Instant::now();
        tracing::info!(pass = %pass.id, %tier, generation = %pass.generation, from = pass.cursor, repair = pass.repair, points_per_second = rate, "verify pass running");
        // One bucketed count of the store, paced like any request: the buckets it holds
        // nothing in are settled from the ledger alone.
        let held = match (&side.store, side.absent) {
            (Some(store), false) => {
                let counts = store.bucket_counts().await?;
                metrics::counter!("cairn_verify_store_requests_total", "tier" => tier.as_str())
                    .increment(1);
                self.calls
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs_f64(crate::REQUEST_POINTS as f64 / rate))
                    .await;
                Some(counts)
            }
            _ => None,
        };
        while pass.state == PassState::Running && pass.cursor < i64::from(BUCKETS) {
            let step = Instant::now();
            let bucket = u16::try_from(pass.cursor).unwrap_or(BUCKETS - 1);
            let outcome = self
                .check_bucket(tier, &pass.generation, &side, held.as_ref(), bucket)
                .await?;
            metrics::counter!("cairn_verify_buckets_checked_total", "tier" => tier.as_str())
                .increment(1);
            metrics::counter!("cairn_verify_store_requests_total", "tier" => tier.as_str())
                .increment(outcome.store_requests);
            self.calls
                .fetch_add(outcome.store_requests, std::sync::atomic::Ordering::Relaxed);
            let records: Vec<DriftRecord> = outcome
                .drift
                .iter()
                .map(|drift| record(&pass, drift))
                .collect();
            for drift in &records {
                metrics::counter!("cairn_verify_drift_total", "kind" => drift.kind.as_str(), "store" => drift.store.clone())
                    .increment(1);
                tracing::warn!(pass = %pass.id, kind = %drift.kind, store = %drift.store, dataset = %drift.dataset, source_key = %drift.source_key, revision = %drift.revision_id, evidence = %drift.evidence, "verify confirmed drift");
            }
            let advanced = self
                .ledger
                .change_pass(PassChange::Advance {
                    pass_id: pass.id,
                    bucket: pass.cursor,
                    skipped: outcome.skipped,
                    drift: records.clone(),
                })
                .await;
            pass = match advanced {
                Ok(pass) => pass,
                // An operator abandoned it meanwhile: stop quietly.
                Err(LedgerError::Invalid {
                    code: "verify_state",
                    ..
                }) => {
                    return Ok(self.ledger.verify_pass(pass.id).await?.unwrap_or(pass));
                }
                Err(error) => return Err(error.into()),
            };
            if pass.repair && !records.is_empty() {
                crate::repair::repair_all(
                    self,
                    &pass,
                    side.store.as_deref(),
                    &records,
                    &outcome.ledger,
                )
                .await?;
            }
            // The bucket's work at the rate: its requests and the points they read.
            let work = outcome.store_requests * crate::REQUEST_POINTS + outcome.points_read;
            let pace = Duration::from_secs_f64(work as f64 / rate);
            if let Some(wait) = pace.checked_sub(step.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
        if pass.state != PassState::Running {
            return Ok(pass);
        }
        let ended = self
            .ledger
            .change_pass(PassChange::Finish {
                pass_id: pass.id,
                state: PassState::Completed,
                actor: pass.created_by.clone(),
                reason: format!(
                    "every bucket checked: {} drift, {} sources skipped as in flight",
                    pass.drift_total(),
                    pass.skipped
                ),
            })
            .await?;
        metrics::gauge!("cairn_verify_last_complete_seconds", "tier" => tier.as_str())
            .set(unix_seconds());
        metrics::gauge!("cairn_verify_open_drift", "tier" => tier.as_str())
            .set(ended.drift_total() as f64);
        tracing::info!(pass = %ended.id, %tier, generation = %ended.generation, drift = ended.drift_total(), skipped = ended.skipped, seconds = started.elapsed().as_secs_f64(), "verify pass completed");
        Ok(ended)
    }

    async fn store_side(&self, pass: &VerifyPass) -> Result<StoreSide, VerifyError> {
        let generations = self.ledger.generations().await?;
        let generation = generations
            .iter()
            .find(|generation| generation.id == pass.generation)
            .ok_or_else(|| LedgerError::GenerationNotFound(pass.generation.clone()))?;
        if generation.state == GenerationState::Retired {
            return Err(LedgerError::invalid(
                "generation_state",
                format!("generation {} is retired", generation.id),
            )
            .into());
        }
        if !generation.backends.contains(&Backend::Vector) {
            return Ok(StoreSide {
                store: None,
                model: generation.model.clone(),
                absent: false,
            });
        }
        let Some(stores) = &self.stores else {
            return Err(GatewayError::Config(
                "this process holds no vector store (workers.count = 0 on the embedded store: \
                 run verify in the process that runs the workers)"
                    .to_owned(),
            )
            .into());
        };
        let store = stores.store(&pass.generation).await?;
        let present = store.ensure_present(pass.repair).await?;
        if !present {
            tracing::warn!(pass = %pass.id, location = %store.location(), "the vector store's collection is missing: every promise is reported missing");
        }
        Ok(StoreSide {
            store: Some(store),
            model: generation.model.clone(),
            absent: !present,
        })
    }

    /// Checks one bucket: the first look, and a second look for anything it found. `held` is
    /// the store's bucketed count from the pass's start, when there is a store.
    async fn check_bucket(
        &self,
        tier: VerifyTier,
        generation: &str,
        side: &StoreSide,
        held: Option<&std::collections::HashMap<u16, usize>>,
        bucket: u16,
    ) -> Result<BucketOutcome, VerifyError> {
        let mut work = Work::default();
        let first_ledger = self.ledger.verify_bucket(generation, bucket).await?;
        let empty_in_store = held.is_some_and(|counts| !counts.contains_key(&bucket));
        if empty_in_store && first_ledger.heads.is_empty() && first_ledger.unsettled.is_empty() {
            // Nothing promised, nothing in flight, nothing held: settled without the store.
            return Ok(BucketOutcome {
                drift: Vec::new(),
                skipped: 0,
                store_requests: 0,
                points_read: 0,
                ledger: first_ledger,
            });
        }
        let first_store = read_store(tier, side, &first_ledger, bucket, false, &mut work).await?;
        let first = self
            .drift_of(
                tier,
                (generation, side),
                &first_ledger,
                first_store.as_deref(),
            )
            .await?;
        if first.is_empty() {
            return Ok(BucketOutcome {
                drift: Vec::new(),
                skipped: first_ledger.unsettled.len() as i64,
                store_requests: work.requests,
                points_read: work.points.max(promised(&first_ledger)),
                ledger: first_ledger,
            });
        }
        // The second look: the store first, then the ledger, so a change that lands between
        // the two reads shows in the ledger's answer (a moved head, an open job).
        let second_store = read_store(tier, side, &first_ledger, bucket, true, &mut work).await?;
        let second_ledger = self.ledger.verify_bucket(generation, bucket).await?;
        let second = self
            .drift_of(
                tier,
                (generation, side),
                &second_ledger,
                second_store.as_deref(),
            )
            .await?;
        let drift = rules::confirmed(&first, &first_ledger, second, &second_ledger);
        Ok(BucketOutcome {
            drift,
            skipped: second_ledger.unsettled.len() as i64,
            store_requests: work.requests,
            points_read: work.points.max(promised(&second_ledger)),
            ledger: second_ledger,
        })
    }

    /// Drift between a ledger side and a store side (`None`: the store's counts matched and it
    /// was not read point by point), with the bytes in the deep tier.
    async fn drift_of(
        &self,
        tier: VerifyTier,
        (generation, side): (&str, &StoreSide),
        ledger: &LedgerBucket,
        held: Option<&[Held]>,
    ) -> Result<Vec<Drift>, VerifyError> {
        let mut drift = rules::compare_rows(ledger);
        if let Some(held) = held {
            drift.extend(rules::compare_vectors(ledger, held));
        }
        if tier == VerifyTier::Deep {
            for head in &ledger.heads {
                let bytes = self.ledger.content(&head.content_sha256).await?;
                let found = bytes.map(|bytes| receipts::ids::sha256_hex(&bytes));
                drift.extend(rules::bytes_drift(head, found.as_deref()));
            }
            drift.extend(self.sample_model(generation, side, ledger).await?);
        }
        Ok(drift)
    }

    /// Embeds the first chunk of one settled head of the bucket (the lowest revision id) again
    /// and compares it with its stored vector.
    async fn sample_model(
        &self,
        generation: &str,
        side: &StoreSide,
        ledger: &LedgerBucket,
    ) -> Result<Option<Drift>, VerifyError> {
        let (Some(embedders), Some(store)) = (&self.embedders, &side.store) else {
            return Ok(None);
        };
        if side.absent {
            return Ok(None);
        }
        let embedder = match embedders
            .embedder(&side.model, gateways::EmbedRole::Query)
            .await
        {
            Ok(embedder) => embedder,
            Err(gateways::GatewayError::ModelMissing(_)) => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        let Some(head) = ledger
            .heads
            .iter()
            .filter(|head| head.points.unwrap_or(0) > 0)
            .min_by_key(|head| head.revision_id)
        else {
            return Ok(None);
        };
        let rows = self.ledger.chunks(head.revision_id, generation).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let index = u32::try_from(row.chunk_index).unwrap_or(0);
        let embedded = embedder.embed(vec![row.text.clone()]).await?;
        let stored = store
            .vectors(&[gateways::vectors::point_id(head.revision_id, index)])
            .await?;
        let (Some(fresh), Some(Some(kept))) = (embedded.first(), stored.first()) else {
            // A missing point is reported by the comparison itself.
            return Ok(None);
        };
        let dot: f32 = fresh.iter().zip(kept).map(|(a, b)| a * b).sum();
        let cosine = dot
            / (gateways::vectors::norm(fresh) * gateways::vectors::norm(kept)).max(f32::EPSILON);
        Ok(rules::model_drift(
            head,
            index,
            cosine,
            embedder.agreement(),
        ))
    }
}

/// The store's side of a bucket for a tier: `None` when the counts tier found the bucket's
/// current points as promised (and nothing in flight), else every point by revision (`full`:
/// Points the ledger's settled heads of a bucket promise: the ledger's side of its check.
fn promised(ledger: &LedgerBucket) -> u64 {
    ledger
        .heads
        .iter()
        .filter_map(|head| head.points)
        .map(u64::from)
        .sum()
}

/// The store work one bucket's check did: what the pass's rate limit charges.
#[derive(Debug, Default, Clone, Copy)]
struct Work {
    /// Requests made to the store.
    requests: u64,
    /// Points its answers held.
    points: u64,
}

/// always, for the second look).
async fn read_store(
    tier: VerifyTier,
    side: &StoreSide,
    ledger: &LedgerBucket,
    bucket: u16,
    full: bool,
    work: &mut Work,
) -> Result<Option<Vec<Held>>, GatewayError> {
    let Some(store) = &side.store else {
        return Ok(None);
    };
    if side.absent {
        return Ok(Some(Vec::new()));
    }
    if tier == VerifyTier::Counts && !full {
        work.requests += 1;
        let current = store.bucket_current(bucket).await?;
        work.points += current as u64;
        let promised: usize = ledger
            .heads
            .iter()
            .filter_map(|head| head.points)
            .map(|points| points as usize)
            .sum();
        if current == promised && ledger.unsettled.is_empty() {
            return Ok(None);
        }
    }
    work.requests += 1;
    let held = store
        .bucket_points(bucket, tier == VerifyTier::Deep)
        .await?;
    work.points += held.iter().map(|h| u64::from(h.points)).sum::<u64>();
    if tier == VerifyTier::Scrub && !full {
        // Equal digests of the current points, and nothing held beyond the heads' points
        // that could be extra or stale: the bucket is clean without a revision-by-revision
        // comparison.
        // A head's points must also name the head's own source (the digest does not see it).
        let heads: std::collections::HashMap<Uuid, (&str, &str)> = ledger
            .heads
            .iter()
            .map(|head| {
                (
                    head.revision_id,
                    (head.dataset.as_str(), head.source_key.as_str()),
                )
            })
            .collect();
        let only_heads = held.iter().all(|h| match heads.get(&h.revision_id) {
            Some(source) => *source == (h.dataset.as_str(), h.source_key.as_str()),
            None => h.current == 0 && ledger.known.contains_key(&h.revision_id),
        });
        if only_heads && rules::promised_digest(ledger) == rules::held_digest(ledger, &held) {
            let counts_match = ledger.heads.iter().all(|head| {
                let points: u32 = held
                    .iter()
                    .filter(|h| h.revision_id == head.revision_id)
                    .map(|h| h.points)
                    .sum();
                head.points.is_none_or(|promised| promised == points)
            });
            if counts_match {
                return Ok(None);
            }
        }
    }
    Ok(Some(held))
}

fn record(pass: &VerifyPass, drift: &Drift) -> DriftRecord {
    DriftRecord {
        id: Uuid::now_v7(),
        pass_id: pass.id,
        kind: drift.kind,
        store: drift.store.clone(),
        generation: pass.generation.clone(),
        dataset: drift.dataset.clone(),
        source_key: drift.source_key.clone(),
        revision_id: drift.revision_id,
        evidence: drift.evidence.clone(),
        state: if drift.store == stores::BYTES {
            DriftState::Corrupt
        } else {
            DriftState::Open
        },
        repair: None,
        found_at: 0,
        changed_at: 0,
    }
}

fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs_f64())
        .unwrap_or(0.0)
}

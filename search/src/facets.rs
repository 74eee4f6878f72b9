//! Facet counts beside a search, or alone (`GET /v1/datasets/{dataset}/facets`).
//!
//! Counts come from the ledger, over every source the query's datasets and filter select
//! (never the page): exact, each field counted concurrently under the request's deadline. A
//! field whose count cannot finish in time is named in `facets_partial` and left out: a
//! count of part of the set is never returned.

use std::time::{Duration, Instant};

use receipts::filter::facets::{FacetCounts, FacetField};
use receipts::filter::Filter;
use receipts::validity::At;
use receipts::SearchLedger;
use serde::Serialize;

use crate::{SearchError, Searcher};

/// Most facet fields one request may count.
pub const MAX_FACETS: usize = 8;
/// Values listed per field when the request names no number.
pub const DEFAULT_FACET_VALUES: u32 = 20;
/// Most values listed per field.
pub const MAX_FACET_VALUES: u32 = 100;

/// Which fields to count, and how many values of each to list.
#[derive(Debug, Clone, PartialEq)]
pub struct FacetRequest {
    /// Fields, distinct, at most [`MAX_FACETS`].
    pub fields: Vec<FacetField>,
    /// Values listed per field, 1 to [`MAX_FACET_VALUES`].
    pub values: u32,
}

/// Facet counts without a query.
#[derive(Debug, Clone)]
pub struct FacetQuery {
    /// Datasets (empty: every dataset).
    pub datasets: Vec<String>,
    /// Only sources that match.
    pub filter: Option<Filter>,
    /// Count the revisions that held then (`None`: the heads).
    pub at: Option<At>,
    /// What to count.
    pub request: FacetRequest,
    /// Time for every count together.
    pub budget: Duration,
}

/// What [`Searcher::facets`] answers.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct FacetAnswer {
    /// Each field counted within the budget, in the order asked.
    pub facets: Vec<FacetCounts>,
    /// Fields left out: their count could not finish within the budget.
    pub facets_partial: Vec<String>,
    /// Time from admission to answer.
    pub took_ms: f64,
}

/// Counts each field of `request`, concurrently, until `deadline`: the counts that finished,
/// and the fields that did not.
pub(crate) async fn count(
    ledger: &dyn SearchLedger,
    datasets: &[String],
    filter: Option<&Filter>,
    at: Option<At>,
    request: &FacetRequest,
    deadline: Instant,
) -> (Vec<FacetCounts>, Vec<String>) {
    let counts = request.fields.iter().map(|field| async move {
        let counted = ledger
            .facet_counts(datasets, filter, at, field, request.values, Some(deadline))
            .await;
        (field, counted)
    });
    let mut facets = Vec::new();
    let mut partial = Vec::new();
    for (field, counted) in futures::future::join_all(counts).await {
        match counted {
            Ok(counts) => facets.push(counts),
            Err(error) => {
                if error.code() != "deadline_exceeded" {
                    tracing::warn!(field = %field.name(), %error, "facet count failed");
                }
                partial.push(field.name());
            }
        }
    }
    (facets, partial)
}

impl Searcher {
    /// Facet counts without a query: admitted like a search (the same slots and queue), and
    /// bounded by its budget.
    pub async fn facets(&self, query: FacetQuery) -> Result<FacetAnswer, SearchError> {
        let started = Instant::now();
        let _permit = self.admit(started, query.budget).await?;
        let (facets, facets_partial) = count(
            self.ledger.as_ref(),
            &query.datasets,
            query.filter.as_ref(),
            query.at,
            &query.request,
            started + query.budget,
        )
        .await;
        Ok(FacetAnswer {
            facets,
            facets_partial,
            took_ms: started.elapsed().as_secs_f64() * 1000.0,
        })
    }
}

//! `cairn bench extract`: extraction throughput per format on real files, one document at a
//! time on one thread, through the same code acceptance and projection run
//! (`Extracted::from_bytes`, with its bounds).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use extract::{Extracted, Format, Limits};
use serde_json::{json, Value};

/// What one format's files gave.
#[derive(Default)]
struct Tally {
    files: usize,
    extracted: usize,
    bytes: u64,
    extracted_bytes: u64,
    text_bytes: u64,
    pages: usize,
    seconds: f64,
    extracted_seconds: f64,
    slowest_ms: f64,
    refused: BTreeMap<&'static str, usize>,
}

fn format_of(path: &std::path::Path) -> Option<Format> {
    let extension = path.extension()?.to_str()?.to_ascii_lowercase();
    Some(match extension.as_str() {
        "pdf" => Format::Pdf,
        "docx" => Format::Docx,
        "html" | "htm" | "xhtml" => Format::Html,
        "md" | "markdown" => Format::Markdown,
        _ => return None,
    })
}

/// Extracts every PDF, DOCX, HTML and Markdown file under `folders` and reports, per format,
/// files and megabytes (and PDF pages) per second, what was refused and why.
pub fn extract(folders: &[PathBuf]) -> anyhow::Result<Value> {
    let limits = Limits::default();
    let mut tallies: BTreeMap<&'static str, Tally> = BTreeMap::new();
    for folder in folders {
        for entry in walkdir::WalkDir::new(folder).sort_by_file_name() {
            let entry = entry.with_context(|| format!("walking {}", folder.display()))?;
            let Some(format) = format_of(entry.path()).filter(|_| entry.file_type().is_file())
            else {
                continue;
            };
            let bytes = std::fs::read(entry.path())
                .with_context(|| format!("reading {}", entry.path().display()))?;
            let started = Instant::now();
            let result = Extracted::from_bytes(&bytes, format, &limits);
            let seconds = started.elapsed().as_secs_f64();
            let tally = tallies.entry(format.name()).or_default();
            tally.files += 1;
            tally.bytes += bytes.len() as u64;
            tally.seconds += seconds;
            tally.slowest_ms = tally.slowest_ms.max(seconds * 1000.0);
            match result {
                Ok(extracted) => {
                    tally.extracted += 1;
                    tally.extracted_bytes += bytes.len() as u64;
                    tally.extracted_seconds += seconds;
                    tally.text_bytes += extracted.text.len() as u64;
                    tally.pages += extracted.pages.len();
                }
                Err(error) => *tally.refused.entry(error.code).or_default() += 1,
            }
        }
    }
    anyhow::ensure!(
        !tallies.is_empty(),
        "no PDF, DOCX, HTML or Markdown files found"
    );
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let formats: serde_json::Map<String, Value> = tallies
        .into_iter()
        .map(|(name, tally)| {
            let per_second = |count: f64, seconds: f64| (seconds > 0.0).then(|| count / seconds);
            (
                name.to_owned(),
                json!({
                    "files": tally.files,
                    "extracted": tally.extracted,
                    "refused": tally.refused,
                    "mib": mib(tally.bytes),
                    "seconds": tally.seconds,
                    "files_per_second": per_second(tally.files as f64, tally.seconds),
                    "mib_per_second": per_second(mib(tally.bytes), tally.seconds),
                    "extracted_mib_per_second": per_second(mib(tally.extracted_bytes), tally.extracted_seconds),
                    "text_mib": mib(tally.text_bytes),
                    "pages": tally.pages,
                    "pages_per_second": per_second(tally.pages as f64, tally.extracted_seconds),
                    "slowest_ms": tally.slowest_ms,
                }),
            )
        })
        .collect();
    Ok(json!({
        "benchmark": "extract",
        "folders": folders.iter().map(|folder| folder.display().to_string()).collect::<Vec<_>>(),
        "limits": { "deadline_s": limits.deadline.as_secs_f64(), "memory_bytes": limits.memory_bytes, "max_text_bytes": limits.max_text_bytes },
        "note": "one document at a time on one thread; PDF includes starting pdftotext for each file",
        "formats": formats,
    }))
}

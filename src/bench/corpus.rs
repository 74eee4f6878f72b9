//! The BEIR corpora the benchmarks read: `corpus.jsonl` records (`_id`, `title`, `text`).

use std::path::Path;

use anyhow::Context;
use serde_json::Value;

/// The first `limit` documents of the corpus at `path`, as (id, text): the title and the body,
/// or the title alone with `one_line`.
pub(super) fn read_corpus(
    path: &Path,
    limit: usize,
    one_line: bool,
) -> anyhow::Result<Vec<(String, String)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut documents = Vec::new();
    for (number, line) in text.lines().enumerate().take(limit) {
        let record: Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", path.display(), number + 1))?;
        let id = record["_id"]
            .as_str()
            .context("a record without _id")?
            .to_owned();
        let title = record["title"].as_str().unwrap_or("");
        let body = record["text"].as_str().unwrap_or("");
        documents.push((
            id,
            if one_line {
                title.to_owned()
            } else {
                format!("{title}\n\n{body}")
            },
        ));
    }
    Ok(documents)
}

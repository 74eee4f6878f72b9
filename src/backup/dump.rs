//! The portable vector dump: every point of a store as JSON lines
//! (`{"id", "vector", "payload"}`), then one trailing line with the SHA-256 of every byte
//! before it and the point count. It loads into any store of the same dimension: qdrant-edge
//! or a Qdrant server. So a dump moves an installation between them without embedding
//! anything again.

use std::io::{BufRead, Write};
use std::path::Path;

use anyhow::Context;
use gateways::vectors::StoredPoint;
use gateways::VectorStore;
use sha2::Digest;

/// Points read and written per request.
const PAGE: usize = 1000;

/// The trailing line.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Trailer {
    sha256: String,
    points: u64,
}

/// Writes every point of `store` to the new file `path`, fsynced; answers the points.
pub async fn write(store: &dyn VectorStore, path: &Path) -> anyhow::Result<u64> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let mut hasher = sha2::Sha256::new();
    let mut points = 0u64;
    let mut after = None;
    loop {
        let (page, next) = store.scroll_all(after, PAGE).await?;
        for point in &page {
            let mut line = serde_json::to_vec(point)?;
            line.push(b'\n');
            hasher.update(&line);
            out.write_all(&line)?;
            points += 1;
        }
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let trailer = Trailer {
        sha256: hex::encode(hasher.finalize()),
        points,
    };
    serde_json::to_writer(&mut out, &trailer)?;
    out.write_all(b"\n")?;
    let file = out.into_inner().map_err(|error| error.into_error())?;
    file.sync_all()?;
    Ok(points)
}

/// Checks the dump at `path` against its trailing hash, then loads it into `store`; answers
/// the points loaded. Nothing is loaded from a dump that does not check.
pub async fn load(path: &Path, store: &dyn VectorStore) -> anyhow::Result<u64> {
    let (expected, lines) = check(path)?;
    let reader = std::io::BufReader::new(std::fs::File::open(path)?);
    let mut batch = Vec::with_capacity(PAGE);
    let mut loaded = 0u64;
    for (index, line) in reader.lines().enumerate() {
        if index as u64 >= lines {
            break;
        }
        let point: StoredPoint = serde_json::from_str(&line?)
            .with_context(|| format!("{} line {}", path.display(), index + 1))?;
        batch.push(point);
        if batch.len() == PAGE {
            loaded += batch.len() as u64;
            store.put_points(std::mem::take(&mut batch)).await?;
        }
    }
    loaded += batch.len() as u64;
    store.put_points(batch).await?;
    anyhow::ensure!(
        loaded == expected,
        "{} held {loaded} points, its trailer says {expected}",
        path.display()
    );
    Ok(loaded)
}

/// The dump's point count, after checking its hash; and the lines before the trailer.
fn check(path: &Path) -> anyhow::Result<(u64, u64)> {
    let reader = std::io::BufReader::new(
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
    );
    let mut hasher = sha2::Sha256::new();
    let mut previous: Option<String> = None;
    let mut lines = 0u64;
    for line in reader.lines() {
        let line = line?;
        if let Some(before) = previous.take() {
            hasher.update(before.as_bytes());
            hasher.update(b"\n");
            lines += 1;
        }
        previous = Some(line);
    }
    let trailer: Trailer = previous
        .as_deref()
        .map(serde_json::from_str)
        .transpose()?
        .with_context(|| format!("{} has no trailer: it is cut short", path.display()))?;
    let found = hex::encode(hasher.finalize());
    anyhow::ensure!(
        found == trailer.sha256 && lines == trailer.points,
        "{} does not match its trailer (sha256 {found}, {lines} points; the trailer says {} and \
         {}): the dump is damaged",
        path.display(),
        trailer.sha256,
        trailer.points
    );
    Ok((trailer.points, lines))
}

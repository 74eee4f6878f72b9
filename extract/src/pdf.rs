//! PDF: the text of each page, in reading order, from poppler's `pdftotext`.
//!
//! ## Why `pdftotext`
//! Chosen by measurement on Mozilla's pdf.js corpus (905 files under 300 KB): the pure-Rust
//! `pdf-extract` 0.12 (on `lopdf` 0.42) panicked on 37 files, failed on 46 more, and found at
//! least 90% of `pdftotext`'s words on only 153 of the 223 files where `pdftotext` finds
//! text (69%); `pdftotext` read every file that is not broken, and named the broken ones.
//!
//! ## Bounds
//! Each document runs in its own `pdftotext` process, so a crash or a runaway file never
//! takes the caller down:
//! - its address space and CPU time are capped with `prlimit` (where present);
//! - the wall clock is capped by [`Limits::deadline`], after which it is killed;
//! - its output is read up to [`Limits::max_text_bytes`], after which it is killed;
//! - at most [`super::MAX_CONCURRENT`] binary extractions run at once in a process.
//!
//! The bytes go to the child through a pipe, never a temporary file, so an erased document
//! leaves no copy behind.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{ExtractError, Extracted, Format, Limits};

/// The extractor's program (poppler-utils).
const PROGRAM: &str = "pdftotext";

/// Whether `prlimit` (util-linux) can cap the child's memory and CPU time.
fn has_prlimit() -> bool {
    static FOUND: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FOUND.get_or_init(|| {
        Command::new("prlimit")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|status| status.success())
            .unwrap_or(false)
    })
}

/// What the child left: its exit, its output, and why it was stopped, if it was.
struct Run {
    status: Option<std::process::ExitStatus>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stopped: Option<String>,
}

fn run(bytes: &[u8], limits: &Limits) -> Result<Run, ExtractError> {
    let mut command = if has_prlimit() {
        let mut command = Command::new("prlimit");
        command
            .arg(format!("--as={}", limits.memory_bytes))
            .arg(format!("--cpu={}", limits.deadline.as_secs().max(1) + 1))
            .arg("--")
            .arg(PROGRAM);
        command
    } else {
        Command::new(PROGRAM)
    };
    // Reading order (no -layout), UTF-8, a form feed after each page; from stdin to stdout.
    command
        .args(["-enc", "UTF-8", "-eol", "unix", "-", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|error| {
        ExtractError::new(
            "extractor_unavailable",
            format!("cannot start {PROGRAM} ({error}); install poppler-utils (scripts/setup does)"),
        )
    })?;
    let started = Instant::now();
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(ExtractError::new(
            "extractor_unavailable",
            format!("{PROGRAM} started without its pipes"),
        ));
    };
    let max = limits.max_text_bytes;
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            // A child that stops reading (it failed early) closes the pipe: nothing to do.
            let _ = stdin.write_all(bytes);
        });
        // Drained to the end (a child blocked on a full pipe would only hit the deadline);
        // the last lines say why it failed.
        let errors = scope.spawn(move || {
            let mut tail = Vec::new();
            let mut buffer = [0u8; 8192];
            while let Ok(read @ 1..) = stderr.read(&mut buffer) {
                tail.extend_from_slice(&buffer[..read]);
                if tail.len() > 16 * 1024 {
                    tail.drain(..tail.len() - 8 * 1024);
                }
            }
            tail
        });
        let output = scope.spawn(move || {
            let mut text = Vec::new();
            let result = (&mut stdout)
                .take(u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1))
                .read_to_end(&mut text);
            let _ = done.send(());
            (text, result)
        });
        let remaining = limits.deadline.saturating_sub(started.elapsed());
        let mut stopped = match finished.recv_timeout(remaining) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => None,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Some(format!(
                "extraction took longer than {} s",
                limits.deadline.as_secs_f64()
            )),
        };
        if stopped.is_some() {
            let _ = child.kill();
        }
        let (stdout, read) = output.join().unwrap_or_else(|_| {
            (
                Vec::new(),
                Err(std::io::Error::other("the reader panicked")),
            )
        });
        if stopped.is_none() && stdout.len() > max {
            stopped = Some(format!("the document holds more than {max} bytes of text"));
            let _ = child.kill();
        }
        if stopped.is_none() {
            if let Err(error) = read {
                stopped = Some(format!("reading {PROGRAM}'s output failed: {error}"));
                let _ = child.kill();
            }
        }
        // The pipes are closed or the child killed, so this wait is short; a child that
        // closed its output early and runs on is killed at the deadline.
        let status = wait_until(
            &mut child,
            started + limits.deadline + Duration::from_secs(1),
        );
        if status.is_none() && stopped.is_none() {
            stopped = Some(format!(
                "extraction took longer than {} s",
                limits.deadline.as_secs_f64()
            ));
        }
        let stderr = errors.join().unwrap_or_default();
        Ok(Run {
            status,
            stdout,
            stderr,
            stopped,
        })
    })
}

/// Waits for the child until `until`, then kills it; `None` when it had to be killed.
fn wait_until(child: &mut std::process::Child, until: Instant) -> Option<std::process::ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(2)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// The last line of the extractor's complaint, short enough for a message.
fn complaint(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let line = text
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .unwrap_or("no reason given")
        .trim();
    line.chars().take(200).collect()
}

/// PDF through `pdftotext`, bounded as the module says.
#[derive(Debug, Clone, Copy)]
pub struct PdfExtractor;

impl super::FormatExtractor for PdfExtractor {
    fn format(&self) -> Format {
        Format::Pdf
    }

    fn extract(&self, bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError> {
        extract(bytes, limits)
    }
}

/// The text of a PDF, page by page, within `limits`.
fn extract(bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError> {
    let run = run(bytes, limits)?;
    if let Some(reason) = run.stopped {
        return Err(ExtractError::new("extraction_limit", reason));
    }
    let Some(status) = run.status else {
        return Err(ExtractError::new(
            "extraction_limit",
            "the extractor did not finish",
        ));
    };
    if !status.success() {
        let complaint = complaint(&run.stderr);
        return Err(match status.code() {
            // pdftotext: 1 cannot open (a password among the reasons), 3 permissions.
            Some(1) if complaint.contains("password") => ExtractError::new(
                "encrypted",
                "the PDF is encrypted with a password; send it decrypted",
            ),
            Some(3) => ExtractError::new(
                "encrypted",
                "the PDF's permissions forbid extracting its text",
            ),
            // `prlimit` could not start the extractor: missing (127) or not executable (126).
            Some(126 | 127) => ExtractError::new(
                "extractor_unavailable",
                format!(
                    "cannot start {PROGRAM} ({complaint}); install poppler-utils (scripts/setup does)"
                ),
            ),
            Some(code) => ExtractError::new(
                "unextractable",
                format!("the PDF cannot be read ({complaint}; {PROGRAM} exit {code})"),
            ),
            None => {
                use std::os::unix::process::ExitStatusExt;
                match status.signal() {
                    // SIGKILL or SIGXCPU: the CPU or memory cap.
                    Some(9) | Some(24) => ExtractError::new(
                        "extraction_limit",
                        "extraction ran out of its CPU or memory bound",
                    ),
                    signal => ExtractError::new(
                        "unextractable",
                        format!(
                            "the PDF crashed its extractor (signal {})",
                            signal.unwrap_or_default()
                        ),
                    ),
                }
            }
        });
    }
    pages(&String::from_utf8_lossy(&run.stdout))
}

/// The extractor's output (each page ended by a form feed) as text and page starts; pages
/// are joined by a blank line so that no chunk runs two pages' words together.
fn pages(output: &str) -> Result<Extracted, ExtractError> {
    let mut pieces: Vec<&str> = output.split('\u{c}').collect();
    if pieces.last().is_some_and(|last| last.trim().is_empty()) {
        pieces.pop();
    }
    if pieces.is_empty() {
        return Err(ExtractError::new("unextractable", "the PDF has no pages"));
    }
    if pieces.iter().all(|page| page.trim().is_empty()) {
        return Err(ExtractError::new(
            "no_text_layer",
            format!(
                "none of the PDF's {} pages has a text layer (a scan?); run OCR and send the text",
                pieces.len()
            ),
        ));
    }
    let mut text = String::with_capacity(output.len());
    let mut starts = Vec::with_capacity(pieces.len());
    for piece in pieces {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        starts.push(text.len());
        text.push_str(piece.trim_end());
    }
    Ok(Extracted {
        text,
        format: Format::Pdf,
        sections: Vec::new(),
        pages: starts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_split_at_form_feeds_and_blank_pages_count() {
        let extracted = pages("one\nfirst page\n\u{c}\u{c}three\n\u{c}").expect("pages");
        assert_eq!(extracted.text, "one\nfirst page\n\n\n\nthree");
        assert_eq!(extracted.pages.len(), 3);
        assert_eq!(extracted.page_at(0), Some(1));
        assert_eq!(
            extracted.page_at(extracted.text.find("three").expect("three")),
            Some(3)
        );
        let blank = pages(" \n\u{c}\n\u{c}").expect_err("blank");
        assert_eq!(blank.code, "no_text_layer");
        assert_eq!(pages("").expect_err("empty").code, "unextractable");
    }
}

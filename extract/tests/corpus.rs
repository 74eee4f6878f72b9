//! Extraction on real files nobody here wrote: a fixed sample of Mozilla's pdf.js test corpus
//! and of python-docx's test documents (`tests/fixtures/`, licences beside them).
//!
//! Every file goes through the real extraction code. No file may panic, run past its bound,
//! or fail without a typed code; and where poppler's `pdftotext` (run directly, outside
//! cairn's bounds) finds text, cairn must find at least 90% of its words on at least 90% of
//! those files. Set `CAIRN_PDF_CORPUS` to a folder (the whole pdf.js `test/pdfs/`) to run
//! the same checks on every PDF in it.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use extract::{Extracted, Format, Limits};

/// Every code extraction may fail with.
const TYPED: [&str; 8] = [
    "not_text",
    "format_mismatch",
    "document_too_large",
    "unextractable",
    "encrypted",
    "no_text_layer",
    "extraction_limit",
    "extractor_unavailable",
];

fn fixtures(folder: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(folder)
}

fn files(folder: &Path, extension: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder)
        .unwrap_or_else(|error| panic!("read {}: {error}", folder.display()))
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|found| found == extension))
        .collect();
    files.sort();
    files
}

/// Lowercase words of two or more letters or digits.
fn words(text: &str) -> HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| word.chars().count() >= 2)
        .map(str::to_lowercase)
        .collect()
}

/// The words `pdftotext` finds in a file on its own, when it reads it.
fn reference_words(path: &Path) -> Option<HashSet<String>> {
    let output = std::process::Command::new("timeout")
        .args(["5", "pdftotext", "-q"])
        .arg(path)
        .arg("-")
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| words(&String::from_utf8_lossy(&output.stdout)))
}

#[test]
fn every_pdf_of_the_corpus_is_extracted_or_refused_with_a_code_within_its_bound() {
    let folder = std::env::var_os("CAIRN_PDF_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| fixtures("pdfjs"));
    let limits = Limits {
        deadline: Duration::from_secs(5),
        ..Limits::default()
    };
    let pdfs = files(&folder, "pdf");
    assert!(
        pdfs.len() >= 30,
        "{} PDFs in {}",
        pdfs.len(),
        folder.display()
    );
    let mut codes: BTreeMap<&'static str, usize> = BTreeMap::new();
    let (mut compared, mut recalled) = (0usize, 0usize);
    let mut low = Vec::new();
    let mut slowest = Duration::ZERO;
    for path in &pdfs {
        let bytes = std::fs::read(path).expect("read");
        let started = Instant::now();
        let result = Extracted::from_bytes(&bytes, Format::Pdf, &limits);
        let took = started.elapsed();
        slowest = slowest.max(took);
        assert!(
            took < limits.deadline + Duration::from_secs(2),
            "{} ran {took:?}, past its bound",
            path.display()
        );
        let found = match result {
            Ok(extracted) => {
                *codes.entry("ok").or_default() += 1;
                assert!(!extracted.pages.is_empty(), "{}", path.display());
                words(&extracted.text)
            }
            Err(error) => {
                assert!(TYPED.contains(&error.code), "{}: {error:?}", path.display());
                assert_ne!(
                    error.code, "extractor_unavailable",
                    "pdftotext is missing: run scripts/setup"
                );
                assert!(!error.message.is_empty());
                *codes.entry(error.code).or_default() += 1;
                HashSet::new()
            }
        };
        if let Some(reference) = reference_words(path).filter(|words| words.len() >= 5) {
            compared += 1;
            let kept = reference.intersection(&found).count();
            if kept * 10 >= reference.len() * 9 {
                recalled += 1;
            } else {
                low.push(format!(
                    "{} ({kept}/{})",
                    path.file_name().unwrap_or_default().to_string_lossy(),
                    reference.len()
                ));
            }
        }
    }
    eprintln!(
        "{} PDFs: {codes:?}; recall >= 90% on {recalled} of {compared} files with text; \
         slowest {slowest:?}; below: {low:?}",
        pdfs.len()
    );
    assert!(compared >= 10, "only {compared} files with text to compare");
    assert!(
        recalled * 10 >= compared * 9,
        "recall >= 90% on only {recalled} of {compared} files: {low:?}"
    );
}

#[test]
fn every_docx_of_the_sample_is_extracted_with_its_structure() {
    let limits = Limits::default();
    let documents = files(&fixtures("docx"), "docx");
    assert!(documents.len() >= 30, "{} documents", documents.len());
    let mut read = 0;
    for path in &documents {
        let bytes = std::fs::read(path).expect("read");
        match Extracted::from_bytes(&bytes, Format::Docx, &limits) {
            Ok(extracted) => {
                read += 1;
                if std::env::var_os("CAIRN_SHOW_DOCX").is_some() {
                    eprintln!(
                        "== {}\n{}\n{:?}",
                        path.display(),
                        extracted.text,
                        extracted.sections
                    );
                }
            }
            Err(error) => {
                assert!(TYPED.contains(&error.code), "{}: {error:?}", path.display());
            }
        }
    }
    assert_eq!(read, documents.len());

    let read = |name: &str| {
        let bytes = std::fs::read(fixtures("docx").join(name)).expect("read");
        Extracted::from_bytes(&bytes, Format::Docx, &limits).expect(name)
    };
    let styled = read("par-known-styles.docx");
    let at = |extracted: &Extracted, needle: &str| {
        let offset = extracted.text.find(needle).expect(needle);
        extracted.section_at(offset).map(str::to_owned)
    };
    assert_eq!(at(&styled, "no specified style"), None);
    assert_eq!(at(&styled, "Body Text").as_deref(), Some("# Heading 1"));
    let table = read("tbl-having-applied-style.docx");
    assert!(
        table
            .text
            .contains("foo to you | and a hearty foo to you too sir!\n\nfoobar | barfoo"),
        "{}",
        table.text
    );
    let links = read("par-hlink-frags.docx");
    assert!(links.text.contains("Three with link to https://foo.com."));
    let tabs = read("tab-stops.docx");
    assert!(tabs.text.contains("Assigned\tLeft\tcenter\tright"));
}

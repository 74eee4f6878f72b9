//! Conformance: the lexical index holds what a reader sees (HTML without markup, documents with
//! their sections and pages), and refuses what cannot be read before anything is written.

use receipts::model::{Change, Submission};

use super::{accept_one, lexical, lexical_hits, must, must_accept, put, Harness};

/// HTML is indexed as the text a reader sees: words in scripts, styles or tags are never
/// found, hits show no markup, and a page nested too deep is refused before anything is
/// written.
pub async fn html_is_indexed_as_its_text(harness: Harness) {
    let page = "<html><head><title>Marsh notes</title><script>var scriptonly = 1;</script>\
        </head><body><nav>navonly</nav><h1>Herons</h1><p>Herons <em>wade</em> slowly.</p>\
        <p class=\"classonly\">Kingfishers dive.</p></body></html>";
    let mut submission = put("notes", "marsh.html", page);
    if let Change::Put(document) = &mut submission.change {
        document.media_type = "text/html".to_owned();
    }
    must_accept(&harness, submission).await;
    for hidden in ["scriptonly", "navonly", "classonly", "html", "em"] {
        assert_eq!(
            lexical_hits(&harness, hidden).await,
            0,
            "{hidden} was indexed"
        );
    }
    let hits = must(
        harness
            .ledger
            .lexical_search("herons wade", &[], 10, None)
            .await,
        "lexical search",
    );
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert!(hits[0].text.contains("Herons wade slowly."), "{hits:?}");
    assert!(!hits[0].text.contains('<'), "{hits:?}");
    assert_eq!(
        lexical_hits(&harness, "marsh").await,
        1,
        "the title is text"
    );
    // Too deep to extract: refused, nothing written.
    let deep = "<div>".repeat(extract::html::MAX_DEPTH + 1);
    let mut submission = put("notes", "deep.html", &deep);
    if let Change::Put(document) = &mut submission.change {
        document.media_type = "text/html".to_owned();
    }
    let refused = accept_one(&harness, submission).await;
    assert_eq!(
        refused.map_err(|error| error.code()).err(),
        Some("unextractable")
    );
    assert!(must(harness.ledger.source("notes", "deep.html").await, "source").is_none());
}

/// Binary documents are indexed as their extracted text: a PDF's passages name their page
/// and a DOCX's or Markdown document's passages the section they start in; a superseding
/// revision replaces them; a PDF that needs a password is refused before anything is written.
pub async fn documents_are_indexed_with_their_structure(harness: Harness) {
    let fixture = |path: &str| {
        std::fs::read(format!(
            "{}/../extract/tests/fixtures/{path}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap_or_else(|error| panic!("fixture {path}: {error}"))
    };
    let pdf = Submission::document(
        "papers",
        "testing.pdf",
        "conformance",
        fixture("pdfjs/file_pdfjs_test.pdf"),
        "application/pdf",
    );
    must_accept(&harness, pdf).await;
    let hits = lexical(&harness, "Robocop trobopan").await;
    assert_eq!(hits.first().and_then(|hit| hit.page), Some(3), "{hits:?}");
    assert!(
        hits.iter().all(|hit| !hit.text.contains("%PDF")),
        "{hits:?}"
    );
    let markdown = "# Guide\n\nIntro words.\n\n## Install\n\nRun the zebrafish installer.\n";
    let mut submission = put("papers", "guide.md", markdown);
    if let Change::Put(document) = &mut submission.change {
        document.media_type = "text/markdown".to_owned();
    }
    must_accept(&harness, submission).await;
    let docx = Submission::document(
        "papers",
        "styles.docx",
        "conformance",
        fixture("docx/par-known-styles.docx"),
        extract::DOCX_MEDIA_TYPE,
    );
    must_accept(&harness, docx).await;
    let hits = lexical(&harness, "body text").await;
    assert_eq!(
        hits.first().map(|hit| hit.source_key.as_str()),
        Some("styles.docx")
    );
    let hits = lexical(&harness, "zebrafish").await;
    assert_eq!(
        hits.first().and_then(|hit| hit.section.as_deref()),
        Some("# Guide > ## Install"),
        "a passage lies in one section and names it: {hits:?}"
    );
    // A new revision replaces the PDF's passages.
    let next = Submission::document(
        "papers",
        "testing.pdf",
        "conformance",
        fixture("pdfjs/issue1002.pdf"),
        "application/pdf",
    );
    must_accept(&harness, next).await;
    assert_eq!(lexical_hits(&harness, "trobopan").await, 0);
    assert_eq!(lexical_hits(&harness, "unstoppable").await, 1);
    // A password: refused, nothing written.
    let locked = Submission::document(
        "papers",
        "locked.pdf",
        "conformance",
        fixture("pdfjs/issue6010_1.pdf"),
        "application/pdf",
    );
    let refused = accept_one(&harness, locked).await;
    assert_eq!(
        refused.map_err(|error| error.code()).err(),
        Some("encrypted")
    );
    assert!(must(
        harness.ledger.source("papers", "locked.pdf").await,
        "source"
    )
    .is_none());
}

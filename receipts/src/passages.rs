//! Splitting text into passages for the lexical index. Passages break at paragraph, then
//! sentence, then word boundaries, never inside a UTF-8 character, and carry byte offsets
//! into the original text.

/// Target size of a passage, in bytes (about 800 tokens). Measured with `cairn eval beir` on
/// SciFact (train, lexical mode): 1,200 bytes 0.686 nDCG@10, 4,000 bytes 0.699, 8,000 bytes
/// 0.699. BM25 does best on whole abstracts; longer documents still split.
pub const PASSAGE_TARGET_BYTES: usize = 4000;

/// A passage of a text with its byte range, and where it lies in its document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passage {
    /// Offset of the first byte in the text.
    pub byte_start: usize,
    /// Offset one past the last byte.
    pub byte_end: usize,
    /// The section it starts in (`# A > ## B`), for formats with headings.
    pub section: Option<String>,
    /// Its page (1-based), for paged formats: a passage never spans two pages.
    pub page: Option<u32>,
}

/// The passages of a document's text with its structure: cut at every page and every heading
/// first, so that each passage lies on one page and in one section, and names them.
pub fn split_structured(
    text: &str,
    sections: &[extract::Section],
    pages: &[usize],
) -> Vec<Passage> {
    if sections.is_empty() && pages.is_empty() {
        return split(text);
    }
    let mut passages = Vec::new();
    for (start, end) in extract::segments(text.len(), sections, pages) {
        let segment = text.get(start..end).unwrap_or_default();
        let section = extract::section_at(sections, start).map(str::to_owned);
        let page = extract::page_at(pages, start);
        passages.extend(split(segment).into_iter().map(|passage| Passage {
            byte_start: start + passage.byte_start,
            byte_end: start + passage.byte_end,
            section: section.clone(),
            page,
        }));
    }
    passages
}

impl Passage {
    /// The passage's text within the text it was split from (trimmed). Passages hold offsets
    /// only: acceptance keeps no second copy of a document's text.
    pub fn text<'a>(&self, of: &'a str) -> &'a str {
        of.get(self.byte_start..self.byte_end).unwrap_or_default()
    }
}

/// Splits `text` into passages of at most [`PASSAGE_TARGET_BYTES`] bytes (a single word
/// longer than that is cut at a character boundary). Whitespace-only text yields none.
pub fn split(text: &str) -> Vec<Passage> {
    let mut passages = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let rest = &text[start..];
        let end = if rest.len() <= PASSAGE_TARGET_BYTES {
            text.len()
        } else {
            start + cut_point(rest, PASSAGE_TARGET_BYTES)
        };
        let piece = &text[start..end];
        let trimmed_start = start + (piece.len() - piece.trim_start().len());
        let trimmed = piece.trim();
        if !trimmed.is_empty() {
            passages.push(Passage {
                byte_start: trimmed_start,
                byte_end: trimmed_start + trimmed.len(),
                section: None,
                page: None,
            });
        }
        start = end;
    }
    passages
}

/// Where to end a passage within the first `limit` bytes of `text` (always > 0).
fn cut_point(text: &str, limit: usize) -> usize {
    let mut boundary = limit.min(text.len());
    while !text.is_char_boundary(boundary) {
        boundary -= 1;
    }
    let window = &text[..boundary];
    let half = boundary / 2;
    if let Some(position) = window.rfind("\n\n").filter(|position| *position >= half) {
        return position + 2;
    }
    for separator in [". ", "? ", "! ", ".\n", "\n"] {
        if let Some(position) = window.rfind(separator).filter(|position| *position >= half) {
            return position + separator.len();
        }
    }
    // After the last whitespace character (which may be longer than one byte, e.g. U+00A0).
    if let Some(end) = window
        .char_indices()
        .rev()
        .find(|(position, c)| *position > 0 && c.is_whitespace())
        .map(|(position, c)| position + c.len_utf8())
    {
        return end;
    }
    if boundary == 0 {
        // The first character alone is longer than the limit: take it whole.
        return text
            .chars()
            .next()
            .map(char::len_utf8)
            .unwrap_or(text.len());
    }
    boundary
}

/// English stop words left out of lexical queries (Lucene's default English set, which BM25
/// baselines use): in an OR query they match nearly every passage and add only noise.
const STOP_WORDS: [&str; 33] = [
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these",
    "they", "this", "to", "was", "will", "with",
];

/// The words of a lexical query, for every engine: lowercased runs of letters and digits (at
/// most 64), stop words dropped unless nothing else is left. No query syntax survives.
pub fn query_words(text: &str) -> Vec<String> {
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .take(64)
        .map(str::to_lowercase)
        .collect();
    if words.iter().all(|word| STOP_WORDS.contains(&word.as_str())) {
        return words;
    }
    words
        .into_iter()
        .filter(|word| !STOP_WORDS.contains(&word.as_str()))
        .collect()
}

/// The words of a text as the PostgreSQL lexical index stores them: the runs of letters and
/// digits [`query_words`] cuts (lowercased, the first 16,383 positions), each stemmed with the
/// English Snowball stemmer, with their 1-based positions. The same stemmer turns a query's
/// words into the stems it looks up ([`query_stems`]), so index and query agree by
/// construction, and the server's own text parser (the slowest step of an acceptance) is never
/// run. The PostgreSQL ledger sends them in `tsvector`'s binary form; [`Lexemes`]'s `Display`
/// is the text form (`'lexeme':1,4 'other':2`).
pub fn lexemes(text: &str) -> Lexemes {
    use std::borrow::Cow;
    use std::collections::{BTreeMap, HashMap};
    // Each distinct word is stemmed once (stemming is most of the cost of an acceptance's
    // CPU, and text repeats its words): positions are first grouped by lowercased word.
    let mut by_word: HashMap<Cow<'_, str>, Vec<u16>> = HashMap::new();
    for (index, word) in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .take(MAX_POSITION as usize)
        .enumerate()
    {
        let lower = if word
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            Cow::Borrowed(word)
        } else {
            Cow::Owned(word.to_lowercase())
        };
        // A lexeme is at most 2 KiB in PostgreSQL; longer runs are not words.
        if lower.len() > 255 {
            continue;
        }
        // At most MAX_POSITION words are taken, so the position fits.
        by_word.entry(lower).or_default().push(index as u16 + 1);
    }
    let stemmer = stemmer();
    let mut positions: BTreeMap<String, Vec<u16>> = BTreeMap::new();
    for (word, at) in by_word {
        positions
            .entry(stemmer.stem(&word).into_owned())
            .or_default()
            .extend(at);
    }
    let entries = positions
        .into_iter()
        .map(|(lexeme, mut at)| {
            at.sort_unstable();
            // At most 256 positions per lexeme are kept by PostgreSQL: the first 256.
            at.truncate(MAX_POSITIONS_PER_LEXEME);
            (lexeme, at)
        })
        .collect();
    Lexemes { entries }
}

/// The highest word position PostgreSQL stores (later words are not indexed).
const MAX_POSITION: u16 = 16_383;

/// The most positions PostgreSQL keeps for one lexeme.
const MAX_POSITIONS_PER_LEXEME: usize = 256;

/// A text's stemmed words and their positions, as [`lexemes`] makes them: lexemes in byte
/// order, without repeats, each with its positions ascending (1 to 16,383, at most 256 of
/// them), which is the order and the bounds PostgreSQL's `tsvector` requires.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Lexemes {
    entries: Vec<(String, Vec<u16>)>,
}

impl Lexemes {
    /// Each lexeme with its positions, in lexeme order.
    pub fn entries(&self) -> &[(String, Vec<u16>)] {
        &self.entries
    }
}

impl std::fmt::Display for Lexemes {
    /// The `tsvector` text form: `'lexeme':1,4 'other':2`, quotes and backslashes doubled.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (n, (lexeme, at)) in self.entries.iter().enumerate() {
            if n > 0 {
                f.write_str(" ")?;
            }
            f.write_str("'")?;
            for c in lexeme.chars() {
                if c == '\'' || c == '\\' {
                    write!(f, "{c}")?;
                }
                write!(f, "{c}")?;
            }
            f.write_str("':")?;
            for (n, position) in at.iter().enumerate() {
                if n > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{position}")?;
            }
        }
        Ok(())
    }
}

/// The stems a lexical query looks up in the PostgreSQL index: [`query_words`], stemmed as
/// [`lexemes`] stems, without repeats.
pub fn query_stems(text: &str) -> Vec<String> {
    let stemmer = stemmer();
    let mut stems: Vec<String> = Vec::new();
    for word in query_words(text) {
        if word.len() > 255 {
            continue;
        }
        let stem = stemmer.stem(&word).into_owned();
        if !stems.contains(&stem) {
            stems.push(stem);
        }
    }
    stems
}

fn stemmer() -> &'static qdrant_rust_stemmers::Stemmer {
    static STEMMER: std::sync::OnceLock<qdrant_rust_stemmers::Stemmer> = std::sync::OnceLock::new();
    STEMMER.get_or_init(|| {
        qdrant_rust_stemmers::Stemmer::create(qdrant_rust_stemmers::Algorithm::English)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn structured_passages_lie_on_one_page_and_in_one_section() {
        let text = "Cover page.\n\n# One\n\nFirst words.\n\nSecond page words.\n\n## Two\n\nLast.";
        let sections = vec![
            extract::Section {
                start: text.find("# One").expect("one"),
                path: "# One".to_owned(),
            },
            extract::Section {
                start: text.find("## Two").expect("two"),
                path: "# One > ## Two".to_owned(),
            },
        ];
        let pages = vec![0, text.find("Second page").expect("page")];
        let passages = split_structured(text, &sections, &pages);
        let described: Vec<(&str, Option<&str>, Option<u32>)> = passages
            .iter()
            .map(|passage| (passage.text(text), passage.section.as_deref(), passage.page))
            .collect();
        assert_eq!(
            described,
            vec![
                ("Cover page.", None, Some(1)),
                ("# One\n\nFirst words.", Some("# One"), Some(1)),
                ("Second page words.", Some("# One"), Some(2)),
                ("## Two\n\nLast.", Some("# One > ## Two"), Some(2)),
            ]
        );
        assert_eq!(split_structured(text, &[], &[]), split(text));
    }

    #[test]
    fn tsvector_literals_stem_and_position_every_word() {
        assert_eq!(
            super::lexemes("Cells, cell's DIFFERENTIATION; 42").to_string(),
            "'42':5 'cell':1,2 'differenti':4 's':3"
        );
        assert_eq!(super::query_stems("the cells and cell"), vec!["cell"]);
        assert_eq!(super::lexemes(" ... ").to_string(), "");
    }

    /// Words that stem alike share a lexeme whose positions stay in order, and past 256 the
    /// first 256 are kept, whichever word form they came from.
    #[test]
    fn a_lexeme_keeps_its_first_256_positions_across_word_forms() {
        let text = (0..300)
            .map(|n| if n % 3 == 0 { "Cells" } else { "cell" })
            .collect::<Vec<_>>()
            .join(" ");
        let literal = super::lexemes(&text).to_string();
        let expected = (1..=256).map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(literal, format!("'cell':{}", expected.join(",")));
    }

    use super::*;
    use proptest::prelude::*;

    /// Regression: a cut after a two-byte space (U+00A0) landed inside the character.
    #[test]
    fn cuts_after_multibyte_whitespace_on_a_char_boundary() {
        let text = format!(
            "{}\u{a0}{}",
            "x".repeat(PASSAGE_TARGET_BYTES - 10),
            "y".repeat(400)
        );
        let passages = split(&text);
        assert_eq!(passages.len(), 2);
        assert_eq!(passages[0].byte_end, PASSAGE_TARGET_BYTES - 10);
        assert_eq!(passages[1].text(&text), "y".repeat(400));
    }

    #[test]
    fn short_text_is_one_passage() {
        let text = "  hello world \n";
        let passages = split(text);
        assert_eq!(passages.len(), 1);
        assert_eq!(passages[0].text(text), "hello world");
        assert_eq!(passages[0].byte_start, 2);
    }

    fn check_cover(text: &str) -> Result<(), TestCaseError> {
        let passages = split(text);
        let mut last_end = 0;
        for passage in &passages {
            prop_assert!(passage.byte_start >= last_end);
            prop_assert!(passage.byte_end - passage.byte_start <= PASSAGE_TARGET_BYTES.max(4));
            // Each passage is trimmed, non-empty text on character boundaries.
            let piece = text.get(passage.byte_start..passage.byte_end);
            prop_assert!(piece.is_some_and(|piece| !piece.is_empty() && piece.trim() == piece));
            last_end = passage.byte_end;
        }
        let joined: String = passages
            .iter()
            .map(|p| p.text(text))
            .collect::<Vec<_>>()
            .join(" ");
        prop_assert_eq!(
            text.split_whitespace().collect::<Vec<_>>().concat(),
            joined.split_whitespace().collect::<Vec<_>>().concat()
        );
        Ok(())
    }

    proptest! {
        /// Long texts dense in multi-byte whitespace and separators, cut anywhere.
        #[test]
        fn passages_cut_on_char_boundaries(
            chars in proptest::collection::vec(
                prop_oneof![
                    Just(' '), Just('\u{a0}'), Just('\u{3000}'), Just('\u{2028}'), Just('\n'),
                    Just('.'), Just('!'), any::<char>(), Just('x'), Just('é'),
                ],
                0..4000,
            )
        ) {
            let text: String = chars.into_iter().collect();
            check_cover(&text)?;
        }

        #[test]
        fn passages_cover_text_in_order(text in "(\\PC{0,40}[ \n.]{0,3}){0,200}") {
            let passages = split(&text);
            let mut last_end = 0;
            for passage in &passages {
                prop_assert!(passage.byte_start >= last_end);
                prop_assert!(passage.byte_end - passage.byte_start <= PASSAGE_TARGET_BYTES.max(4));
                let piece = text.get(passage.byte_start..passage.byte_end);
                prop_assert!(piece.is_some_and(|piece| !piece.is_empty() && piece.trim() == piece));
                last_end = passage.byte_end;
            }
            let joined: String = passages.iter().map(|p| p.text(&text)).collect();
            let squeezed: String = text.split_whitespace().collect();
            let joined_squeezed: String = joined.split_whitespace().collect();
            prop_assert_eq!(squeezed, joined_squeezed);
        }
    }
}

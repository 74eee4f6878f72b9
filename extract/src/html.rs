//! HTML's readable text: the title and the main text, without scripts, styles, navigation,
//! headers, footers, forms or embedded documents; headings become section paths.
//!
//! The walk over the parsed tree is iterative (a hostile, deeply nested page cannot exhaust
//! the stack), and html5ever's parser is itself bounded by the input's size.

use ego_tree::iter::Edge;
use scraper::{Html, Node};

use super::{Outline, Section};

/// Elements whose content is never text a reader sees as the page's content.
const SKIPPED: [&str; 16] = [
    "script", "style", "noscript", "template", "nav", "header", "footer", "aside", "form", "svg",
    "iframe", "object", "button", "select", "head", "math",
];

/// Elements that end a paragraph.
const BLOCKS: [&str; 27] = [
    "p",
    "div",
    "section",
    "article",
    "main",
    "ul",
    "ol",
    "li",
    "table",
    "tr",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "pre",
    "blockquote",
    "br",
    "hr",
    "dl",
    "dt",
    "dd",
    "figure",
    "figcaption",
    "details",
    "summary",
];

fn heading_depth(name: &str) -> Option<usize> {
    match name {
        "h1" => Some(1),
        "h2" => Some(2),
        "h3" => Some(3),
        "h4" => Some(4),
        "h5" => Some(5),
        "h6" => Some(6),
        _ => None,
    }
}

/// The text being written, with whitespace collapsed the way a browser shows it.
struct Writer {
    text: String,
    /// A space is owed before the next word.
    space: bool,
}

impl Writer {
    fn words(&mut self, piece: &str, preformatted: bool) {
        if preformatted {
            self.text.push_str(piece);
            self.space = false;
            return;
        }
        for (index, word) in piece.split_whitespace().enumerate() {
            let at_line_start = self.text.is_empty() || self.text.ends_with('\n');
            if (index > 0 || self.space || piece.starts_with(char::is_whitespace)) && !at_line_start
            {
                self.text.push(' ');
            }
            self.text.push_str(word);
            self.space = false;
        }
        if piece.ends_with(char::is_whitespace) {
            self.space = true;
        }
    }

    fn paragraph(&mut self) {
        let trimmed = self.text.trim_end_matches([' ', '\n']).len();
        self.text.truncate(trimmed);
        if !self.text.is_empty() {
            self.text.push_str("\n\n");
        }
        self.space = false;
    }
}

/// The deepest element nesting extraction accepts. html5ever checks the stack of open
/// elements for every tag, so time grows with the product of the tags and their depth: 100,000
/// nested `div`s take 24 s. Real pages nest a few dozen deep.
pub const MAX_DEPTH: usize = 1_000;

const VOID: [&str; 14] = [
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
    "wbr", "param",
];

/// The deepest nesting of a page by a quick scan of its tags (void and self-closing ones
/// excepted): an upper bound on the parser's open-element stack for well-formed pages, and
/// a close one for the hostile kind.
pub(super) fn nesting(html: &str) -> usize {
    let bytes = html.as_bytes();
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut index = 0;
    while let Some(offset) = bytes[index..].iter().position(|byte| *byte == b'<') {
        let start = index + offset + 1;
        index = start;
        let closing = bytes.get(start) == Some(&b'/');
        let name_start = if closing { start + 1 } else { start };
        let name_end = bytes[name_start..]
            .iter()
            .position(|byte| !byte.is_ascii_alphanumeric())
            .map_or(bytes.len(), |end| name_start + end);
        if name_end == name_start {
            continue;
        }
        let name = html[name_start..name_end].to_ascii_lowercase();
        if closing {
            depth = depth.saturating_sub(1);
            continue;
        }
        let tag_end = bytes[name_end..]
            .iter()
            .position(|byte| *byte == b'>')
            .map_or(bytes.len(), |end| name_end + end);
        let self_closing = tag_end > 0 && bytes.get(tag_end - 1) == Some(&b'/');
        if !VOID.contains(&name.as_str()) && !self_closing {
            depth += 1;
            deepest = deepest.max(depth);
        }
    }
    deepest
}

/// The page's text and sections.
pub(super) fn extract(html: &str) -> (String, Vec<Section>) {
    let document = Html::parse_document(html);
    let mut writer = Writer {
        text: String::new(),
        space: false,
    };
    let mut outline = Outline::default();
    let title = document
        .root_element()
        .descendants()
        .find_map(|node| match node.value() {
            Node::Element(element) if element.name() == "title" => Some(
                node.descendants()
                    .filter_map(|child| child.value().as_text().map(|text| text.to_string()))
                    .collect::<String>(),
            ),
            _ => None,
        })
        .map(|title| title.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|title| !title.is_empty());
    if let Some(title) = &title {
        writer.words(title, false);
        writer.paragraph();
    }
    // Open headings above the current point, as in Markdown: (depth, `#... title`).
    // The heading being read: depth, where it starts, its text so far.
    let mut heading: Option<(usize, usize, String)> = None;
    let mut skipping = 0usize;
    let mut preformatted = 0usize;
    for edge in document.tree.root().traverse() {
        match edge {
            Edge::Open(node) => match node.value() {
                Node::Element(element) => {
                    let name = element.name();
                    if skipping > 0 || SKIPPED.contains(&name) {
                        skipping += 1;
                        continue;
                    }
                    if BLOCKS.contains(&name) {
                        writer.paragraph();
                    }
                    if name == "pre" {
                        preformatted += 1;
                    }
                    if let Some(depth) = heading_depth(name) {
                        heading = Some((depth, writer.text.len(), String::new()));
                    }
                }
                Node::Text(text) if skipping == 0 => {
                    writer.words(text, preformatted > 0);
                    if let Some((_, _, title)) = heading.as_mut() {
                        title.push_str(text);
                        title.push(' ');
                    }
                }
                _ => {}
            },
            Edge::Close(node) => {
                if let Node::Element(element) = node.value() {
                    let name = element.name();
                    if skipping > 0 {
                        skipping -= 1;
                        continue;
                    }
                    if name == "pre" {
                        preformatted = preformatted.saturating_sub(1);
                    }
                    if heading_depth(name).is_some() {
                        if let Some((depth, start, title)) = heading.take() {
                            outline.heading(depth, start, &title);
                        }
                    }
                    if BLOCKS.contains(&name) {
                        writer.paragraph();
                    }
                }
            }
        }
    }
    let end = writer.text.trim_end().len();
    writer.text.truncate(end);
    (writer.text, outline.sections)
}

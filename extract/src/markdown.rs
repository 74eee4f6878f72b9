//! Markdown: the heading structure of a text, as sections named by their path.

use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};

use super::{Outline, Section};

fn depth(level: HeadingLevel) -> usize {
    match level {
        HeadingLevel::H1 => 1,
        HeadingLevel::H2 => 2,
        HeadingLevel::H3 => 3,
        HeadingLevel::H4 => 4,
        HeadingLevel::H5 => 5,
        HeadingLevel::H6 => 6,
    }
}

/// The sections of a Markdown text: one per heading, named by its path.
pub fn sections(text: &str) -> Vec<Section> {
    let mut outline = Outline::default();
    // The heading being read: its depth, start and text so far.
    let mut heading: Option<(usize, usize, String)> = None;
    let parser = Parser::new_ext(text, Options::ENABLE_TABLES).into_offset_iter();
    for (event, range) in parser {
        match event {
            Event::Start(Tag::Heading { level, .. }) => {
                heading = Some((depth(level), range.start, String::new()));
            }
            Event::Text(piece) | Event::Code(piece) => {
                if let Some((_, _, title)) = heading.as_mut() {
                    title.push_str(&piece);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some((level, start, title)) = heading.take() {
                    outline.heading(level, start, &title);
                }
            }
            _ => {}
        }
    }
    outline.sections
}

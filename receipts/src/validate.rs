//! Validation of names and content at the ledger boundary. The acceptor calls the same
//! functions before it builds a submission, so a bad request is refused with the same code
//! whichever door it came through, and the ledger never stores what they refuse.

use crate::error::LedgerError;

// Lengths of names are counted in characters (Unicode scalar values), as the API document's
// `maxLength` counts them, so the published contract and this check are the same rule.

/// Longest dataset name, in characters.
pub const MAX_DATASET_CHARS: usize = 128;
/// Longest source key, in characters.
pub const MAX_SOURCE_KEY_CHARS: usize = 1024;
/// Longest media type, in characters.
pub const MAX_MEDIA_TYPE_CHARS: usize = 255;
/// Most tags per revision.
pub const MAX_TAGS: usize = 64;
/// Longest tag, in characters.
pub const MAX_TAG_CHARS: usize = 128;
/// Longest serialised metadata object, in bytes.
pub const MAX_METADATA_BYTES: usize = 64 * 1024;

fn check_name(field: &str, code: &'static str, value: &str, max: usize) -> Result<(), LedgerError> {
    if value.is_empty() {
        return Err(LedgerError::invalid(
            code,
            format!("{field} must not be empty"),
        ));
    }
    let length = value.chars().count();
    if length > max {
        return Err(LedgerError::invalid(
            code,
            format!("{field} is {length} characters long; the limit is {max}"),
        ));
    }
    if let Some((offset, _)) = value.char_indices().find(|(_, c)| c.is_control()) {
        return Err(LedgerError::invalid(
            code,
            format!("{field} contains a control character at byte {offset}"),
        ));
    }
    if value.trim() != value {
        return Err(LedgerError::invalid(
            code,
            format!("{field} must not start or end with whitespace"),
        ));
    }
    Ok(())
}

/// A dataset name: 1-128 bytes, no control characters, no `/`, no surrounding whitespace.
pub fn dataset(value: &str) -> Result<(), LedgerError> {
    check_name("dataset", "invalid_dataset", value, MAX_DATASET_CHARS)?;
    if value.contains('/') {
        return Err(LedgerError::invalid(
            "invalid_dataset",
            "dataset must not contain `/`",
        ));
    }
    Ok(())
}

/// A source key: 1-1024 bytes, no control characters, no surrounding whitespace.
pub fn source_key(value: &str) -> Result<(), LedgerError> {
    check_name(
        "source_key",
        "invalid_source_key",
        value,
        MAX_SOURCE_KEY_CHARS,
    )
}

/// A media type of the form `type/subtype` (parameters allowed).
pub fn media_type(value: &str) -> Result<(), LedgerError> {
    check_name(
        "media_type",
        "invalid_media_type",
        value,
        MAX_MEDIA_TYPE_CHARS,
    )?;
    let essence = value.split(';').next().unwrap_or_default().trim();
    let mut parts = essence.split('/');
    let valid = matches!((parts.next(), parts.next(), parts.next()),
        (Some(kind), Some(sub), None) if !kind.is_empty() && !sub.is_empty()
            && !kind.contains(' ') && !sub.contains(' '));
    if valid {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            "invalid_media_type",
            format!("media_type `{value}` is not of the form type/subtype"),
        ))
    }
}

/// Tags: at most 64, each 1-128 bytes without control characters.
pub fn tags(values: &[String]) -> Result<(), LedgerError> {
    if values.len() > MAX_TAGS {
        return Err(LedgerError::invalid(
            "invalid_tags",
            format!("{} tags given; the limit is {MAX_TAGS}", values.len()),
        ));
    }
    for (index, tag) in values.iter().enumerate() {
        check_name(
            &format!("tags[{index}]"),
            "invalid_tags",
            tag,
            MAX_TAG_CHARS,
        )?;
    }
    Ok(())
}

/// Metadata: a JSON object of at most 64 KiB serialised.
pub fn metadata(value: &serde_json::Map<String, serde_json::Value>) -> Result<(), LedgerError> {
    let size = serde_json::to_vec(value)
        .map(|bytes| bytes.len())
        .unwrap_or(usize::MAX);
    if size > MAX_METADATA_BYTES {
        return Err(LedgerError::invalid(
            "invalid_metadata",
            format!("metadata is {size} bytes serialised; the limit is {MAX_METADATA_BYTES}"),
        ));
    }
    Ok(())
}

/// Content: not empty.
pub fn content(bytes: &[u8]) -> Result<(), LedgerError> {
    if bytes.is_empty() {
        return Err(LedgerError::invalid(
            "empty_content",
            "content must not be empty",
        ));
    }
    Ok(())
}

/// A content hash: 64 lowercase hex digits.
pub fn sha256_hex(value: &str) -> Result<(), LedgerError> {
    if value.len() == 64
        && value
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            "invalid_sha256",
            "sha256 must be 64 lowercase hex digits",
        ))
    }
}

/// Longest stage name, in bytes.
pub const MAX_STAGE_BYTES: usize = 64;

/// A run's stage: 1-64 characters of `a-z`, `0-9`, `_`, `-` and space.
pub fn stage(value: &str) -> Result<(), LedgerError> {
    let valid = !value.is_empty()
        && value.len() <= MAX_STAGE_BYTES
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | ' '));
    if valid {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            "invalid_stage",
            format!("a stage is 1-{MAX_STAGE_BYTES} characters of a-z, 0-9, `_`, `-` and space"),
        ))
    }
}

/// Most characters in a reason (a block, a delete, an operator action, a token change).
pub const MAX_REASON_CHARS: usize = 500;

/// A reason recorded in history and shown to operators: 1-500 printable characters (no
/// control characters such as NUL or newlines).
pub fn reason(text: &str) -> Result<(), LedgerError> {
    if text.trim().is_empty()
        || text.chars().count() > MAX_REASON_CHARS
        || text.chars().any(char::is_control)
    {
        return Err(LedgerError::invalid(
            "invalid_reason",
            format!("a reason is 1-{MAX_REASON_CHARS} printable characters"),
        ));
    }
    Ok(())
}

/// An erasure request, as both ledgers check it before anything is read or written.
pub fn erasure_request(request: &crate::model::ErasureRequest) -> Result<(), LedgerError> {
    dataset(&request.dataset)?;
    source_key(&request.source_key)?;
    reason(&request.reason)
}

/// A content block, as both ledgers check it before anything is written.
pub fn content_block(block: &crate::model::ContentBlock) -> Result<(), LedgerError> {
    dataset(&block.dataset)?;
    sha256_hex(&block.sha256)?;
    reason(&block.reason)
}

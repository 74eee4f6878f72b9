//! A passage's lexemes sent as a `tsvector` in PostgreSQL's binary form, so the server copies
//! them instead of parsing a text literal (`tsvectorin` was about a tenth of the server's CPU
//! in a batch acceptance). The format, as `tsvectorrecv` reads it: a 4-byte count of lexemes,
//! then per lexeme its UTF-8 text ended by a zero byte, a 2-byte count of positions and each
//! position in 2 bytes (weight bits zero), all big-endian. [`crate::passages::Lexemes`] is
//! already in the order and within the bounds the server checks.

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo};
use sqlx::{Encode, Postgres, Type};

use crate::passages::Lexemes;

/// `tsvector`'s type OID (fixed in every PostgreSQL since 8.3).
const TSVECTOR_OID: u32 = 3614;
/// `tsvector[]`'s type OID.
const TSVECTOR_ARRAY_OID: u32 = 3643;

/// Lexemes bound as a `tsvector` parameter (or, in a `Vec`, a `tsvector[]`).
#[derive(Debug)]
pub(super) struct TsVector(pub(super) Lexemes);

impl Type<Postgres> for TsVector {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(sqlx::postgres::types::Oid(TSVECTOR_OID))
    }
}

impl PgHasArrayType for TsVector {
    fn array_type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(sqlx::postgres::types::Oid(TSVECTOR_ARRAY_OID))
    }
}

impl Encode<'_, Postgres> for TsVector {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        let entries = self.0.entries();
        buf.extend_from_slice(&u32::try_from(entries.len())?.to_be_bytes());
        for (lexeme, positions) in entries {
            // A lexeme is a run of letters and digits: it never holds the terminating zero.
            if lexeme.as_bytes().contains(&0) {
                return Err("a lexeme holds a zero byte".into());
            }
            buf.extend_from_slice(lexeme.as_bytes());
            buf.push(0);
            buf.extend_from_slice(&u16::try_from(positions.len())?.to_be_bytes());
            for position in positions {
                buf.extend_from_slice(&position.to_be_bytes());
            }
        }
        Ok(IsNull::No)
    }
}

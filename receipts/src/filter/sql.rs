//! A [`Filter`] as a SQL condition over one `revisions` row, for SQLite and PostgreSQL, with
//! numbered parameters: the same semantics as [`Filter::matches`], which the conformance
//! property test holds both to.

use serde_json::Value;

use super::{Condition, Filter, KeyTest, Range, Scalar, TagTest, ValueTest};

/// Which SQL the condition is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite (`?N` parameters, JSON1 functions).
    Sqlite,
    /// PostgreSQL (`$N` parameters, `jsonb` operators).
    Postgres,
}

/// One parameter of a compiled condition, in the order of its number.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    /// Text (on SQLite, lists travel as JSON text too).
    Text(String),
    /// A list of strings (PostgreSQL `text[]`).
    Texts(Vec<String>),
    /// A 64-bit integer.
    Int(i64),
    /// A 64-bit float.
    Real(f64),
}

/// A condition ready to splice into a statement's `WHERE`.
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    /// The condition, parenthesised.
    pub sql: String,
    /// Its parameters; the first is number `first` as asked.
    pub params: Vec<Param>,
}

/// A piece of a condition: SQL text, or a value bound where it stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// SQL text.
    Sql(String),
    /// A parameter's place.
    Bind(Param),
}

/// Whether a caller reading as `names` may read the row aliased `row` (any table with
/// `dataset` and `source_key`: a revision, a job): the source's own readers when it names any,
/// else its dataset's default; the same rule as [`crate::access::admits`]. One lookup of the
/// source's access row (NULL when it has none). On SQLite a reader is found in the stored JSON
/// text by its quoted name (names hold no quote or escape, `access::check_reader`), far cheaper
/// per row than `json_each`. The one text both a filter's [`Condition::Readable`] and the ops
/// listings use.
pub fn readable(dialect: Dialect, row: &str, names: &[String]) -> Vec<Piece> {
    let mut pieces = vec![Piece::Sql("COALESCE((SELECT (".to_owned())];
    match dialect {
        Dialect::Sqlite if names.is_empty() => pieces.push(Piece::Sql("0".to_owned())),
        Dialect::Sqlite => {
            for (index, name) in names.iter().enumerate() {
                let or = if index == 0 { "" } else { " OR " };
                pieces.push(Piece::Sql(format!("{or}instr(a.readers, ")));
                pieces.push(Piece::Bind(Param::Text(format!("\"{name}\""))));
                pieces.push(Piece::Sql(") > 0".to_owned()));
            }
        }
        Dialect::Postgres => {
            pieces.push(Piece::Sql("a.readers ?| ".to_owned()));
            pieces.push(Piece::Bind(Param::Texts(names.to_vec())));
            pieces.push(Piece::Sql("::text[]".to_owned()));
        }
    }
    pieces.push(Piece::Sql(format!(
        ") FROM source_access a WHERE a.dataset = {row}.dataset \
         AND a.source_key = {row}.source_key), NOT EXISTS (SELECT 1 FROM dataset_access d \
         WHERE d.dataset = {row}.dataset AND d.default_access = 'nobody'))"
    )));
    pieces
}

/// Writes `filter` as a condition on the `revisions` row aliased `alias`, numbering its
/// parameters from `first`.
pub fn compile(filter: &Filter, dialect: Dialect, alias: &str, first: usize) -> Compiled {
    let mut writer = Writer {
        dialect,
        alias,
        first,
        params: Vec::new(),
    };
    let sql = writer.node(filter);
    Compiled {
        sql,
        params: writer.params,
    }
}

struct Writer<'a> {
    dialect: Dialect,
    alias: &'a str,
    first: usize,
    params: Vec<Param>,
}

impl Writer<'_> {
    /// Adds a parameter; answers its placeholder.
    fn param(&mut self, param: Param) -> String {
        let number = self.first + self.params.len();
        self.params.push(param);
        match self.dialect {
            Dialect::Sqlite => format!("?{number}"),
            Dialect::Postgres => format!("${number}"),
        }
    }

    /// A list of strings: JSON text on SQLite, `text[]` on PostgreSQL.
    fn strings(&mut self, values: &[String]) -> String {
        match self.dialect {
            Dialect::Sqlite => {
                let json = Value::from(values.to_vec()).to_string();
                let placeholder = self.param(Param::Text(json));
                format!("(SELECT value FROM json_each({placeholder}))")
            }
            Dialect::Postgres => {
                let placeholder = self.param(Param::Texts(values.to_vec()));
                format!("{placeholder}::text[]")
            }
        }
    }

    fn node(&mut self, filter: &Filter) -> String {
        match filter {
            Filter::Condition(condition) => self.condition(condition),
            Filter::Group {
                must,
                should,
                must_not,
            } => {
                let mut parts = Vec::new();
                for child in must {
                    parts.push(self.node(child));
                }
                if !should.is_empty() {
                    let any: Vec<String> = should.iter().map(|child| self.node(child)).collect();
                    parts.push(format!("({})", any.join(" OR ")));
                }
                if !must_not.is_empty() {
                    let any: Vec<String> = must_not.iter().map(|child| self.node(child)).collect();
                    parts.push(format!("(NOT ({}))", any.join(" OR ")));
                }
                format!("({})", parts.join(" AND "))
            }
        }
    }

    fn condition(&mut self, condition: &Condition) -> String {
        let r = self.alias.to_owned();
        match (condition, self.dialect) {
            (Condition::Tags(test, listed), Dialect::Sqlite) => {
                let list = self.strings(listed);
                let found = format!("FROM json_each({r}.tags) t WHERE t.value IN {list}");
                match test {
                    TagTest::Any => format!("(EXISTS (SELECT 1 {found}))"),
                    TagTest::None => format!("(NOT EXISTS (SELECT 1 {found}))"),
                    TagTest::All => {
                        let mut distinct = listed.clone();
                        distinct.sort_unstable();
                        distinct.dedup();
                        let wanted =
                            self.param(Param::Int(i64::try_from(distinct.len()).unwrap_or(0)));
                        format!("((SELECT count(DISTINCT t.value) {found}) = {wanted})")
                    }
                }
            }
            (Condition::Tags(test, listed), Dialect::Postgres) => {
                let list = self.strings(listed);
                match test {
                    TagTest::Any => format!("({r}.tags ?| {list})"),
                    TagTest::All => format!("({r}.tags ?& {list})"),
                    TagTest::None => format!("(NOT ({r}.tags ?| {list}))"),
                }
            }
            (Condition::MediaType(listed), _) => {
                let list = self.strings(listed);
                self.member(&format!("{r}.media_type"), &list)
            }
            (Condition::SourceKey(KeyTest::In(keys)), _) => {
                let list = self.strings(keys);
                self.member(&format!("{r}.source_key"), &list)
            }
            (Condition::SourceKey(KeyTest::Prefix(prefix)), Dialect::Sqlite) => {
                let prefix = self.param(Param::Text(prefix.clone()));
                format!("(substr({r}.source_key, 1, length({prefix})) = {prefix})")
            }
            (Condition::SourceKey(KeyTest::Prefix(prefix)), Dialect::Postgres) => {
                let prefix = self.param(Param::Text(prefix.clone()));
                format!("(starts_with({r}.source_key, {prefix}))")
            }
            (Condition::SourceKey(KeyTest::Glob(pattern)), Dialect::Sqlite) => {
                // GLOB's own `*` and `?` are ours; `[` opens a class there, so it is written
                // as the class holding only itself.
                let pattern = self.param(Param::Text(pattern.replace('[', "[[]")));
                format!("({r}.source_key GLOB {pattern})")
            }
            (Condition::SourceKey(KeyTest::Glob(pattern)), Dialect::Postgres) => {
                let mut like = String::with_capacity(pattern.len() + 8);
                for character in pattern.chars() {
                    match character {
                        '\\' | '%' | '_' => {
                            like.push('\\');
                            like.push(character);
                        }
                        '*' => like.push('%'),
                        '?' => like.push('_'),
                        other => like.push(other),
                    }
                }
                let pattern = self.param(Param::Text(like));
                format!("({r}.source_key LIKE {pattern} ESCAPE '\\')")
            }
            (Condition::AcceptedAt(range), _) => {
                let range = Range {
                    lower: range
                        .lower
                        .map(|(end, included)| (Param::Int(end), included)),
                    upper: range
                        .upper
                        .map(|(end, included)| (Param::Int(end), included)),
                };
                self.range(&format!("{r}.accepted_at"), range)
            }
            (Condition::Metadata(name, test), dialect) => self.metadata(name, test, dialect),
            (Condition::Readable(names), dialect) => {
                let mut sql = String::new();
                for piece in readable(dialect, &r, names) {
                    match piece {
                        Piece::Sql(text) => sql.push_str(&text),
                        Piece::Bind(param) => sql.push_str(&self.param(param)),
                    }
                }
                sql
            }
        }
    }

    fn member(&mut self, column: &str, list: &str) -> String {
        match self.dialect {
            Dialect::Sqlite => format!("({column} IN {list})"),
            Dialect::Postgres => format!("({column} = ANY({list}))"),
        }
    }

    fn range(&mut self, value: &str, range: Range<Param>) -> String {
        let mut parts = Vec::new();
        if let Some((end, included)) = range.lower {
            let end = self.param(end);
            parts.push(format!(
                "{value} {} {end}",
                if included { ">=" } else { ">" }
            ));
        }
        if let Some((end, included)) = range.upper {
            let end = self.param(end);
            parts.push(format!(
                "{value} {} {end}",
                if included { "<=" } else { "<" }
            ));
        }
        format!("({})", parts.join(" AND "))
    }

    fn metadata(&mut self, name: &str, test: &ValueTest, dialect: Dialect) -> String {
        let r = self.alias.to_owned();
        match dialect {
            Dialect::Sqlite => {
                let path = self.param(Param::Text(format!("$.\"{name}\"")));
                let kind = format!("json_type({r}.metadata, {path})");
                // json_each over an object walks its members: an object value offers nothing.
                let values = format!(
                    "FROM json_each({r}.metadata, {path}) e WHERE coalesce({kind}, 'object') \
                     <> 'object'"
                );
                match test {
                    ValueTest::Exists(exists) => {
                        let op = if *exists { "<>" } else { "=" };
                        format!("(coalesce({kind}, 'null') {op} 'null')")
                    }
                    ValueTest::In(listed) => {
                        let list = self.param(Param::Text(scalars(listed).to_string()));
                        format!(
                            "(EXISTS (SELECT 1 {values} AND EXISTS (SELECT 1 FROM \
                             json_each({list}) l WHERE ((e.type IN ('integer', 'real') AND \
                             l.type IN ('integer', 'real')) OR (e.type = l.type AND e.type IN \
                             ('text', 'true', 'false'))) AND e.value = l.value)))"
                        )
                    }
                    ValueTest::Range(range) => {
                        let bounds = self.range("e.value", real_range(range));
                        format!(
                            "(EXISTS (SELECT 1 {values} AND e.type IN ('integer', 'real') AND \
                             {bounds}))"
                        )
                    }
                }
            }
            Dialect::Postgres => {
                let key = self.param(Param::Text(name.to_owned()));
                let field = format!("({r}.metadata -> {key})");
                let values = format!(
                    "FROM jsonb_array_elements(CASE jsonb_typeof({field}) WHEN 'array' THEN \
                     {field} ELSE jsonb_build_array({field}) END) e(v)"
                );
                match test {
                    ValueTest::Exists(exists) => {
                        let op = if *exists { "<>" } else { "=" };
                        format!("(coalesce(jsonb_typeof({field}), 'null') {op} 'null')")
                    }
                    ValueTest::In(listed) => {
                        let list = self.param(Param::Text(scalars(listed).to_string()));
                        format!(
                            "(EXISTS (SELECT 1 {values} WHERE e.v IN (SELECT \
                             jsonb_array_elements({list}::jsonb))))"
                        )
                    }
                    ValueTest::Range(range) => {
                        // PostgreSQL may evaluate an AND's sides in any order: the cast is
                        // guarded inside the value, never beside it.
                        let bounds = self.range(
                            "(CASE WHEN jsonb_typeof(e.v) = 'number' THEN (e.v)::float8 END)",
                            real_range(range),
                        );
                        format!("(EXISTS (SELECT 1 {values} WHERE {bounds}))")
                    }
                }
            }
        }
    }
}

fn real_range(range: &Range<f64>) -> Range<Param> {
    Range {
        lower: range
            .lower
            .map(|(end, included)| (Param::Real(end), included)),
        upper: range
            .upper
            .map(|(end, included)| (Param::Real(end), included)),
    }
}

fn scalars(listed: &[Scalar]) -> Value {
    Value::Array(
        listed
            .iter()
            .map(|scalar| match scalar {
                Scalar::Text(text) => Value::from(text.clone()),
                Scalar::Number(number) => Value::from(*number),
                Scalar::Bool(flag) => Value::from(*flag),
            })
            .collect(),
    )
}

/// The statement that counts `field`'s values over the sources `filter` selects in `datasets`
/// (empty: every dataset): heads that are not tombstones, or with `at` the revisions held
/// then. Its rows are `kind` (`value`, `sources`, `valued`, `distinct`), `rank`, `num`, `txt`
/// and `n`; values come first, at most `limit`, in [`FacetValue::order`] after their count.
///
/// [`FacetValue::order`]: super::facets::FacetValue::order
pub fn facet_query(
    dialect: Dialect,
    datasets: &[String],
    filter: Option<&Filter>,
    at: Option<crate::validity::At>,
    field: &super::facets::FacetField,
    limit: u32,
) -> Compiled {
    use super::facets::FacetField;
    let mut writer = Writer {
        dialect,
        alias: "fr",
        first: 1,
        params: Vec::new(),
    };
    let datasets_param = writer.param(Param::Texts(datasets.to_vec()));
    let in_datasets = |column: &str| match dialect {
        Dialect::Sqlite => format!(
            "(json_array_length({datasets_param}) = 0 OR {column} IN (SELECT value FROM \
             json_each({datasets_param})))"
        ),
        Dialect::Postgres => format!(
            "(cardinality({datasets_param}::text[]) = 0 OR {column} = ANY({datasets_param}))"
        ),
    };
    let limit = writer.param(Param::Int(i64::from(limit)));
    let tombstone = match dialect {
        Dialect::Sqlite => "fr.tombstone = 0",
        Dialect::Postgres => "NOT fr.tombstone",
    };
    let selected = match at {
        None => format!(
            "SELECT fr.id, fr.tags, fr.metadata, fr.media_type FROM sources s \
             JOIN revisions fr ON fr.id = s.head_revision_id AND {tombstone} WHERE {}",
            in_datasets("s.dataset")
        ),
        Some(at) => {
            let valid_at = writer.param(Param::Int(at.valid_at));
            let as_of = writer.param(Param::Int(at.as_of));
            format!(
                "SELECT DISTINCT fr.id, fr.tags, fr.metadata, fr.media_type FROM validity v \
                 JOIN revisions fr ON fr.id = v.revision_id AND {tombstone} \
                 WHERE v.valid_from <= {valid_at} AND {valid_at} < v.valid_to \
                   AND v.recorded_from <= {as_of} AND {as_of} < v.recorded_to AND {}",
                in_datasets("fr.dataset")
            )
        }
    };
    // The values each selected revision holds: `rank` 0 booleans, 1 numbers, 2 strings; a
    // number in `num`, a string or `true`/`false` in `txt`.
    let values = match (field, dialect) {
        (FacetField::Tags, Dialect::Sqlite) => {
            "SELECT m.id, 2 AS rank, NULL AS num, t.value AS txt \
             FROM m, json_each(m.tags) t WHERE t.type = 'text'"
                .to_owned()
        }
        (FacetField::Tags, Dialect::Postgres) => {
            "SELECT m.id, 2 AS rank, NULL::float8 AS num, t.value AS txt \
             FROM m, jsonb_array_elements_text(m.tags) t(value)"
                .to_owned()
        }
        (FacetField::MediaType, Dialect::Sqlite) => {
            "SELECT m.id, 2 AS rank, NULL AS num, m.media_type AS txt FROM m".to_owned()
        }
        (FacetField::MediaType, Dialect::Postgres) => {
            "SELECT m.id, 2 AS rank, NULL::float8 AS num, m.media_type AS txt FROM m".to_owned()
        }
        (FacetField::Metadata(name), Dialect::Sqlite) => {
            let path = writer.param(Param::Text(format!("$.\"{name}\"")));
            // json_each over an object walks its members: an object offers no value.
            format!(
                "SELECT m.id, CASE WHEN e.type IN ('true', 'false') THEN 0 \
                   WHEN e.type IN ('integer', 'real') THEN 1 ELSE 2 END AS rank, \
                 CASE WHEN e.type IN ('integer', 'real') THEN CAST(e.value AS REAL) END AS num, \
                 CASE WHEN e.type IN ('true', 'false') THEN e.type \
                   WHEN e.type = 'text' THEN e.value END AS txt \
                 FROM m, json_each(m.metadata, {path}) e \
                 WHERE coalesce(json_type(m.metadata, {path}), 'object') <> 'object' \
                   AND e.type IN ('true', 'false', 'integer', 'real', 'text')"
            )
        }
        (FacetField::Metadata(name), Dialect::Postgres) => {
            let key = writer.param(Param::Text(name.clone()));
            let field = format!("(m.metadata -> {key})");
            format!(
                "SELECT m.id, CASE jsonb_typeof(e.v) WHEN 'boolean' THEN 0 WHEN 'number' THEN 1 \
                   ELSE 2 END AS rank, \
                 CASE WHEN jsonb_typeof(e.v) = 'number' THEN (e.v)::float8 END AS num, \
                 CASE WHEN jsonb_typeof(e.v) = 'boolean' THEN (e.v)::text \
                   WHEN jsonb_typeof(e.v) = 'string' THEN e.v #>> '{{}}' END AS txt \
                 FROM m, jsonb_array_elements(CASE jsonb_typeof({field}) WHEN 'array' THEN \
                   {field} ELSE jsonb_build_array({field}) END) e(v) \
                 WHERE jsonb_typeof(e.v) IN ('boolean', 'number', 'string')"
            )
        }
    };
    let matching = filter.map_or_else(|| "TRUE".to_owned(), |filter| writer.node(filter));
    // Strings in byte order on both engines (SQLite's BINARY, PostgreSQL's "C").
    let text_order = match dialect {
        Dialect::Sqlite => "txt",
        Dialect::Postgres => "txt COLLATE \"C\"",
    };
    let sql = format!(
        "WITH m AS MATERIALIZED ({selected} AND {matching}), \
         v AS MATERIALIZED ({values}), \
         g AS MATERIALIZED (SELECT rank, num, txt, count(DISTINCT id) AS n FROM v \
           GROUP BY rank, num, txt) \
         SELECT * FROM (SELECT 'value' AS kind, rank, num, txt, n FROM g \
           ORDER BY n DESC, rank, num, {text_order} LIMIT {limit}) page \
         UNION ALL SELECT 'sources', NULL, NULL, NULL, (SELECT count(*) FROM m) \
         UNION ALL SELECT 'valued', NULL, NULL, NULL, (SELECT count(DISTINCT id) FROM v) \
         UNION ALL SELECT 'distinct', NULL, NULL, NULL, (SELECT count(*) FROM g)"
    );
    Compiled {
        sql,
        params: writer.params,
    }
}

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

//! How the text log writes an event's fields: `name=value`, as logfmt does. Values come from
//! clients as well as from the gateway (a model name, an error that quotes a provider's answer), so
//! a value that could be read as more than one field is quoted, and no value can break the line or
//! reach a terminal as a control sequence: a value holding a space, a quote, an `=` or a backslash
//! is quoted with its quotes and backslashes escaped, and every control character, in a value or
//! in the message, is written as an escape (`\n`, `\u{1b}`).

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

/// The text log's [`FormatFields`].
pub(crate) struct TextFields;

impl<'writer> FormatFields<'writer> for TextFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = Line { writer, first: true, result: Ok(()) };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct Line<'writer> {
    writer: Writer<'writer>,
    first: bool,
    result: fmt::Result,
}

impl Line<'_> {
    fn field(&mut self, field: &Field, value: &str) {
        if self.result.is_err() {
            return;
        }
        let space = if std::mem::replace(&mut self.first, false) { "" } else { " " };
        self.result = match field.name() {
            "message" => write!(self.writer, "{space}{}", Escaped(value)),
            name => write!(self.writer, "{space}{name}={}", Value(value)),
        };
    }
}

impl Visit for Line<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.field(field, value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, &format!("{value:?}"));
    }
}

/// A field's value: bare when it reads as one token, quoted otherwise.
struct Value<'a>(&'a str);

impl fmt::Display for Value<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bare = !self.0.is_empty()
            && !self.0.chars().any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '=' | '\\'));
        if bare {
            return f.write_str(self.0);
        }
        f.write_char('"')?;
        for c in self.0.chars() {
            match c {
                '"' | '\\' => write!(f, "\\{c}")?,
                c => write!(f, "{}", Escaped(c.encode_utf8(&mut [0; 4])))?,
            }
        }
        f.write_char('"')
    }
}

/// Text with its control characters escaped, the rest as it is.
struct Escaped<'a>(&'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_debug())?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_that_reads_as_one_token_is_written_bare() {
        for value in ["gpt-4o-mini", "req_0Vd2RX0l7r2L2OiunRqu", "0.00075", "claude-sonnet-4-5@20250929", "é"]
        {
            assert_eq!(Value(value).to_string(), value);
        }
    }

    #[test]
    fn a_value_that_could_forge_a_field_or_a_line_is_quoted_and_escaped() {
        let cases = [
            ("gpt org_id=org_VICTIM cost_usd=1234.00", r#""gpt org_id=org_VICTIM cost_usd=1234.00""#),
            ("a=b", r#""a=b""#),
            ("say \"hi\"", r#""say \"hi\"""#),
            ("back\\slash", r#""back\\slash""#),
            ("gpt\n2026-12-06 INFO forged", r#""gpt\n2026-12-06 INFO forged""#),
            ("red\u{1b}[31m", r#""red\u{1b}[31m""#),
            ("", r#""""#),
        ];
        for (value, written) in cases {
            assert_eq!(Value(value).to_string(), written, "{value:?}");
        }
    }

    #[test]
    fn a_message_keeps_its_text_and_loses_its_control_characters() {
        assert_eq!(Escaped("request done: a=b \"c\"").to_string(), "request done: a=b \"c\"");
        assert_eq!(Escaped("one\ntwo\r\u{7}").to_string(), "one\\ntwo\\r\\u{7}");
    }
}
